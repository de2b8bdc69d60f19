"""The console serving HTTPS itself (issue 47): its certificate from settings, reloaded as
the handler services' is (shared/runtime/tls.py, tested in test_handler_tls.py), and its
session cookie then sent over HTTPS only."""

from __future__ import annotations

import shutil
import ssl
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.tls import LocalCA
from services.console.__main__ import _tls
from services.console.settings import ConsoleSettings
from shared.domain.errors import ConfigurationError


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ferry-ctls-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_https_with_a_certificate_and_its_cookie_secure(workdir: Path) -> None:
    ca = LocalCA(workdir / "ca")
    issued = ca.issue("console", hosts=["127.0.0.1"])
    plain = ConsoleSettings()
    assert _tls(plain) is None and not plain.secure_cookie
    served = ConsoleSettings(console_tls_cert=issued.cert, console_tls_key=issued.key)
    tls = _tls(served)
    assert tls is not None and tls.context.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert served.secure_cookie  # never sent back over clear text
    with pytest.raises(ConfigurationError, match="go together"):
        _tls(ConsoleSettings(console_tls_cert=issued.cert))
    with pytest.raises(ConfigurationError, match="console HTTPS"):
        _tls(ConsoleSettings(console_tls_cert=issued.cert, console_tls_key=ca.cert_path))
