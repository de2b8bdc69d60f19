"""NATS credentials and TLS come from settings; a password never shows in a repr or error."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from shared.domain.errors import ConfigurationError
from shared.runtime.settings import CommonSettings


def test_password_from_its_file_and_hidden(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret-Value\n")
    settings = CommonSettings(nats_user="outbox-publisher-sea", nats_password_file=secret)
    auth = settings.nats_auth()
    assert auth.user == "outbox-publisher-sea" and auth.password == "s3cret-Value"
    assert "s3cret-Value" not in repr(auth) + repr(settings)
    options = auth.options(["nats://127.0.0.1:4222"])
    assert options["inbox_prefix"] == "_INBOX.outbox-publisher-sea"
    assert "tls" not in options


def test_a_password_without_a_user_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="FERRY_NATS_USER"):
        CommonSettings(nats_password="x").nats_auth()


def test_missing_password_file_names_the_setting_not_a_value(tmp_path: Path) -> None:
    settings = CommonSettings(nats_user="u", nats_password_file=tmp_path / "nope")
    with pytest.raises(ConfigurationError, match="FERRY_NATS_PASSWORD_FILE"):
        settings.nats_auth()


def test_tls_url_turns_tls_on_and_bad_ca_is_named(tmp_path: Path) -> None:
    auth = CommonSettings().nats_auth()
    assert "tls" in auth.options(["tls://nats.example:4222"])
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate")
    with pytest.raises(ConfigurationError, match="FERRY_NATS_TLS_CA"):
        CommonSettings(nats_tls_ca=bad).nats_auth().options(["nats://127.0.0.1:4222"])


def test_creds_file_needs_nkeys_and_the_file(tmp_path: Path) -> None:
    creds = tmp_path / "role.creds"
    auth = CommonSettings(nats_creds_file=creds).nats_auth()
    if importlib.util.find_spec("nkeys") is None:
        with pytest.raises(ConfigurationError, match="nkeys"):
            auth.options(["nats://127.0.0.1:4222"])
        return
    with pytest.raises(ConfigurationError, match=r"FERRY_NATS_CREDS_FILE .*no such file"):
        auth.options(["nats://127.0.0.1:4222"])
    creds.write_text("-----BEGIN NATS USER JWT-----\n")
    assert auth.options(["nats://127.0.0.1:4222"])["user_credentials"] == str(creds)
