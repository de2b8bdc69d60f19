"""The dev stack gives every program its own role's credentials, and only paths to them."""

from __future__ import annotations

import configparser
import re
import stat
from pathlib import Path

from devstack.credentials import AUTHORIZATION_NAME, check_var_dir, write_role_credentials
from shared.access.identities import DB_OWNER, NATS_ADMIN, identity_named, pg_role_name
from shared.contracts.loading import load_topology
from tests.conftest import ROOT

TOPOLOGIES = [load_topology(ROOT / "topologies/sea-vibespro.yaml"),
              load_topology(ROOT / "topologies/mediation.yaml")]  # fmt: skip
ROLE_PROGRAM = re.compile(
    r"^(outbox-publisher|inbox-consumer|dlq-router|dlq-replayer|handler|retention)-"
)


def _programs() -> dict[str, dict[str, str]]:
    parser = configparser.RawConfigParser()
    parser.read(ROOT / "supervisord.conf")
    out = {}
    for section in parser.sections():
        if section.startswith("program:"):
            options = dict(parser.items(section))
            env = dict(re.findall(r'(\w+)="([^"]*)"', options.get("environment", "")))
            out[section.split(":", 1)[1]] = {**options, **{f"env:{k}": v for k, v in env.items()}}
    return out


def test_every_role_program_runs_as_its_own_identity() -> None:
    programs = _programs()
    roles = {name: p for name, p in programs.items() if ROLE_PROGRAM.match(name)}
    assert len(roles) == 23
    for name, program in roles.items():
        identity = identity_named(TOPOLOGIES, name)  # the program is a role of a topology
        dsn = program["env:FERRY_DSN_TEMPLATE"]
        assert dsn.startswith(f"postgresql://{pg_role_name(name)}@"), name
        # Its own passfile, and TLS (verify-full with the stack's CA) when the server has it.
        tail = f"?passfile=%(ENV_FERRY_VAR)s/secrets/pgpass-{name}%(ENV_FERRY_PG_TLS_QUERY)s"
        assert dsn.endswith(tail), name
        if identity.uses_nats:
            assert program["env:FERRY_NATS_USER"] == name
            assert program["env:FERRY_NATS_PASSWORD_FILE"].endswith(f"/nats-password-{name}")
        else:
            assert "env:FERRY_NATS_USER" not in program, name
        assert program["autostart"] == "false", f"{name} must wait for bootstrap"
        assert not any("PASSWORD=" in k or k == "env:FERRY_NATS_PASSWORD" for k in program)
    # Every HTTP hop between programs is HTTPS, verified against the stack's CA.
    tls_dir = "%(ENV_FERRY_TLS_DIR)s"
    for name, program in programs.items():
        if name.startswith("handler-"):
            assert program["env:FERRY_HANDLER_TLS_CERT"] == f"{tls_dir}/handlers.crt", name
            assert program["env:FERRY_HANDLER_TLS_KEY"] == f"{tls_dir}/handlers.key", name
        if name.startswith("inbox-consumer-"):
            assert program["env:FERRY_HANDLER_URL"].startswith("https://127.0.0.1:"), name
            assert program["env:FERRY_HANDLER_TLS_CA"] == f"{tls_dir}/ca.crt", name
        if name.startswith("console-"):
            assert program["env:FERRY_CONSOLE_TLS_CERT"] == f"{tls_dir}/consoles.crt", name
    # Only bootstrap is the admin.
    admins = [n for n, p in programs.items() if p.get("env:FERRY_NATS_USER") == NATS_ADMIN]
    assert admins == ["bootstrap"]


def test_credentials_are_private_files_and_kept_across_restarts(tmp_path: Path) -> None:
    var = tmp_path / "var"
    block = write_role_credentials(var, TOPOLOGIES)
    secrets = var / "secrets"
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o700
    files = list(secrets.iterdir())
    assert files and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    assert block == secrets / AUTHORIZATION_NAME
    first = {f.name: f.read_text() for f in files}
    write_role_credentials(var, TOPOLOGIES)
    assert {f.name: f.read_text() for f in secrets.iterdir()} == first
    owner = (secrets / f"pg-password-{DB_OWNER}").read_text().strip()
    assert (secrets / f"pgpass-{DB_OWNER}").read_text() == f"*:*:*:{DB_OWNER}:{owner}\n"
    publisher = (secrets / "nats-password-outbox-publisher-sea").read_text().strip()
    assert f'"{publisher}"' in block.read_text()


def test_a_var_dir_from_before_logins_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "pg" / "data"
    data.mkdir(parents=True)
    (data / "PG_VERSION").write_text("18\n")
    try:
        check_var_dir(tmp_path)
    except SystemExit as exc:
        assert "Remove it" in str(exc)
    else:
        raise AssertionError("an old var dir was accepted")
    write_role_credentials(tmp_path, TOPOLOGIES)
    check_var_dir(tmp_path)  # with its logins' passwords it is fine
