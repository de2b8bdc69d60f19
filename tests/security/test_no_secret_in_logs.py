"""A demo run with authentication on leaves no secret in anything it writes or prints.

The real dev stack (``python -m devstack.stack up --demo``: embedded nats-server and
PostgreSQL, every role under supervisord with its own NATS user, database login and handler
secret) runs the demo with tracing to a file: the session's first run (tests/first_run.py),
which tests/e2e/test_demo.py judges as a user sees it. Then every secret it generated
(``<var>/secrets``: NATS and PostgreSQL passwords, pgpass files, handler secrets) is looked
for in everything the run produced: each supervisord child log, supervisord's own logs, the
stack's output, ``stack.env``, the trace file, the JetStream store, the KPI reports, each
role's ``/metrics``, ``/healthz`` and ``/readyz`` and nats-server's ``/connz`` scraped
during the run, every command's ``--help`` and a settings dump given the secrets themselves.
The scanner looks for each secret whole, base64-encoded, and for any 12 characters of it; a
unit check plants secrets into logs to prove it finds them.
"""

from __future__ import annotations

import base64
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from services.handlers.settings import HandlerSettings
from shared.access.identities import NATS_KINDS, identities
from shared.contracts.loading import load_topology
from shared.runtime.settings import ConsumerSettings, PublisherSettings
from tests.conftest import ROOT
from tests.first_run import DemoRun

pytestmark = pytest.mark.integration

#: Any run of this many characters of a secret counts as a leak (a truncated one too).
WINDOW = 12
#: Characters a generated secret is made of (shared.access.identities.new_password, token_urlsafe).
_TOKEN = re.compile(rb"[A-Za-z0-9_-]{%d,}" % WINDOW)
#: Every command a user or supervisord runs; each one's --help is scanned.
COMMANDS = (
    ["-m", "services.outbox_publisher"],
    ["-m", "services.inbox_consumer"],
    ["-m", "services.dlq_router"],
    ["-m", "services.dlq_replayer"],
    ["-m", "services.handlers"],
    ["-m", "shared.cli"],
    ["-m", "shared.cli", "db-roles"],
    ["-m", "shared.cli", "nats-auth"],
    ["-m", "spark.kpi_job"],
    ["-m", "devstack.stack"],
    ["-m", "devstack.bootstrap"],
    ["-m", "k8s.secrets"],
    ["-m", "shared.access.secret_copy"],
)


# ---------------------------------------------------------------- the scanner


#: Secret files holding one secret each, by the start of their names (or the whole name).
_PLAIN = ("nats-password-", "pg-password-", "handler-secret-", "console-password-")
_PLAIN_NAMES = ("console-session-key",)


def secrets_of_file(name: str, text: str) -> dict[str, str] | None:
    """The secrets one file of a secrets directory holds (None: a file no rule knows)."""
    if name.startswith(_PLAIN) or name in _PLAIN_NAMES:
        return {name: text.strip()}
    if name.startswith("handler-secrets-") and name.endswith(".json"):
        return {f"{name}[{durable}]": value for durable, value in json.loads(text).items()}
    if name.startswith("pgpass-"):
        return {
            f"{name}:{number + 1}": line.rsplit(":", 1)[1]
            for number, line in enumerate(text.splitlines())
        }
    if name == "nats-authorization.conf":
        return {}  # the NATS passwords again (nats-password-*), for the server only
    if name == "console-accounts.json":  # the console's password hashes
        return {f"{name}[{a}]": entry["password"] for a, entry in json.loads(text).items()}
    return None


def collect_secrets(folder: Path) -> dict[str, str]:
    """Every secret value in a stack's secrets directory, by where it comes from.

    A file the scanner does not know fails the test: a new kind of secret must be taught
    here, or it would go unchecked.
    """
    found: dict[str, str] = {}
    for path in sorted(folder.iterdir()):
        secrets = secrets_of_file(path.name, path.read_text(encoding="utf-8"))
        if secrets is None:
            raise AssertionError(f"unknown secret file {path}: teach collect_secrets")
        found.update(secrets)
    short = [n for n, v in found.items() if len(v) < WINDOW]
    assert not short, f"secrets shorter than {WINDOW} characters: {short}"
    return found


def find_leaks(outputs: dict[str, bytes], secrets: dict[str, str]) -> list[str]:
    """``"<where>: <secret> (<how>)"`` for every secret found in any output."""
    windows: dict[bytes, str] = {}
    whole: dict[bytes, tuple[str, str]] = {}
    for name, value in secrets.items():
        raw = value.encode()
        for start in range(len(raw) - WINDOW + 1):
            windows[raw[start : start + WINDOW]] = name
        whole[base64.b64encode(raw)] = (name, "base64")
        whole[base64.urlsafe_b64encode(raw)] = (name, "base64")
    leaks: set[str] = set()
    for where, data in outputs.items():
        for token in _TOKEN.finditer(data):
            chunk = token.group()
            for start in range(len(chunk) - WINDOW + 1):
                hit = windows.get(chunk[start : start + WINDOW])
                if hit is not None:
                    leaks.add(f"{where}: {hit} ({WINDOW}+ characters of it)")
                    break
        for needle, (name, how) in whole.items():
            if needle in data:
                leaks.add(f"{where}: {name} ({how})")
    return sorted(leaks)


def gather(var: Path) -> dict[str, bytes]:
    """Every file a stack run wrote under ``var``, except the secrets themselves, the
    nats-server config holding its users' passwords (0600) and PostgreSQL's data files."""
    skip = {var / "secrets", var / "pg"}
    config = var / "nats" / "nats-server.conf"
    out = {}
    for path in sorted(var.rglob("*")):
        if any(path == s or s in path.parents for s in skip) or not path.is_file():
            continue
        if path == config:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, "the server config is private"
            continue
        out[str(path.relative_to(var))] = path.read_bytes()
    return out


def test_the_scanner_finds_secrets_planted_in_logs(tmp_path: Path) -> None:
    """The scan can fail: planted whole, truncated or base64-encoded, a secret is found."""
    folder = tmp_path / "secrets"
    folder.mkdir()
    nats_pw, pg_pw, handler = "nP4ssw0rd-for-the-unit-check_x", "pgP4ss-unit-check-0123", "hS" * 16
    (folder / "nats-password-outbox-publisher-sea").write_text(nats_pw)
    (folder / "pg-password-ferry_owner").write_text(pg_pw + "\n")
    (folder / "pgpass-ferry_owner").write_text(f"*:*:*:ferry_owner:{pg_pw}\n")
    (folder / "handler-secret-cg_replay").write_text(handler)
    (folder / "handler-secrets-module_g.json").write_text(json.dumps({"cg_replay": handler}))
    (folder / "nats-authorization.conf").write_text(f'password: "{nats_pw}"')
    secrets = collect_secrets(folder)
    log = b'{"level": "info", "message": "consuming cg_replay", "user": "outbox-publisher-sea"}\n'
    assert find_leaks({"clean.log": log}, secrets) == []

    planted = {
        "whole.log": log + f"connect pass={nats_pw}\n".encode(),
        "truncated.log": log + f"dsn postgresql://u:{pg_pw[:14]}...@h/db\n".encode(),
        "json.log": log + json.dumps({"secret": handler}).encode(),
        "b64.log": log + b"Authorization: Basic " + base64.b64encode(nats_pw.encode()),
    }
    leaks = find_leaks(planted, secrets)
    assert {leak.split(":", 1)[0] for leak in leaks} == set(planted), leaks
    assert "b64.log: nats-password-outbox-publisher-sea (base64)" in leaks
    assert [leak for leak in leaks if leak.startswith("whole.log: nats-password-outbox-pub")]
    assert [leak for leak in leaks if leak.startswith("truncated.log: pg")]
    assert [leak for leak in leaks if leak.startswith("json.log: handler-secret")]

    (folder / "api-token-new").write_text("x" * 20)
    with pytest.raises(AssertionError, match="teach collect_secrets"):
        collect_secrets(folder)


# ---------------------------------------------------------------- the demo run


@pytest.fixture
def demo_run(first_run: DemoRun) -> DemoRun:
    """The first run of the session (tests/first_run.py): the whole stack, authentication
    and TLS on, tracing to a file, every role scraped during and after the demo."""
    return first_run


def _help_outputs(secrets: dict[str, str], secret_files: Path) -> dict[str, bytes]:
    """``--help`` of every command, run with secrets in the very settings it reads."""
    values = list(secrets.values())
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    env.update(
        PYTHONPATH=str(ROOT),
        FERRY_NATS_USER="outbox-publisher-sea",
        FERRY_NATS_PASSWORD=values[0],
        FERRY_NATS_PASSWORD_FILE=str(secret_files / "nats-password-outbox-publisher-sea"),
        FERRY_HANDLER_SECRET=values[1],
        FERRY_HANDLER_SECRET_FILE=str(secret_files / "handler-secret-cg_replay"),
        FERRY_HANDLER_SECRETS=json.dumps({"cg_replay": values[2]}),
        FERRY_DSN_TEMPLATE=f"postgresql://ferry_x:{values[3]}@127.0.0.1:1/{{database}}",
    )
    procs = {}
    for command in COMMANDS:
        procs[" ".join(command)] = subprocess.Popen(
            [sys.executable, *command, "--help"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
    out = {}
    for name, proc in procs.items():
        stdout, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"{name} --help: {stdout.decode()[-500:]}"
        assert b"usage:" in stdout, name
        out[f"{name} --help"] = stdout
    return out


def _settings_dumps(secrets: dict[str, str]) -> dict[str, bytes]:
    """What printing or dumping the settings shows when they hold secrets."""
    value = SecretStr(next(iter(secrets.values())))
    dumps: dict[str, bytes] = {}
    for settings in (
        PublisherSettings(nats_user="u", nats_password=value),
        ConsumerSettings(nats_password=value, handler_secret=value),
        HandlerSettings(handler_secrets={"cg_replay": value}),
    ):
        name = type(settings).__name__
        dumps[f"repr({name})"] = repr(settings).encode()
        dumps[f"{name}.model_dump_json()"] = settings.model_dump_json().encode()
        dumps[f"str({name}.model_dump())"] = str(settings.model_dump()).encode()
    return dumps


def test_a_demo_run_with_authentication_leaves_no_secret_anywhere(demo_run: DemoRun) -> None:
    run, var = demo_run, demo_run.var
    assert run.returncode == 0, run.stdout[-3000:]
    assert "Ferry demo summary" in run.stdout and "lost                     0" in run.stdout

    folder = var / "secrets"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in folder.iterdir())
    secrets = collect_secrets(folder)
    topologies = [load_topology(ROOT / p) for p in ("topologies/sea-vibespro.yaml",
                                                    "topologies/mediation.yaml")]  # fmt: skip
    roles = {i for t in topologies for i in identities(t)}
    nats_roles = {i.name for i in roles if i.kind in NATS_KINDS}
    assert {f"nats-password-{r}" for r in nats_roles} <= set(secrets)
    assert {f"pg-password-{i.name}" for i in roles} <= set(secrets)
    assert sum(n.startswith("handler-secret-") for n in secrets) == sum(
        len(t.durables) for t in topologies
    )

    outputs = gather(var)
    outputs["stack output"] = run.stdout.encode()
    outputs.update(run.scraped)
    outputs.update(_help_outputs(secrets, folder))
    outputs.update(_settings_dumps(secrets))

    # The scan covers what it claims: every program's log, the trace file, each role's
    # metrics, and nats-server saw each role connect as its own user.
    logs = {Path(k).name for k in outputs if k.startswith("log/")}
    programs = {"supervisord.log", "bootstrap.log", "nats-server.log", "postgres.log"}
    assert programs | {f"{i.name}.log" for i in roles if i.kind != "producer"} <= logs
    assert outputs["stack.env"] and b"FERRY_NATS_PASSWORD_FILE=" in outputs["stack.env"]
    traces = [k for k in outputs if k.startswith("traces/")]
    assert traces and all(outputs[k] for k in traces), "tracing wrote no spans"
    metrics = [k for k in run.scraped if k.startswith("during-demo/metrics@")]
    assert metrics and all(run.scraped[k].startswith(b"# HELP") for k in metrics), metrics
    connz = json.loads(run.scraped["during-demo/connz"])
    users = {c.get("authorized_user") for c in connz["connections"]}
    assert nats_roles <= users, nats_roles - users
    assert not [k for k, v in outputs.items() if b"Authorization Violation" in v]

    leaks = find_leaks(outputs, secrets)
    assert not leaks, "secrets found:\n" + "\n".join(leaks)

    # ... and the same scan over the same outputs does see a secret that slips into a log.
    [role_log] = [k for k in outputs if k.endswith("/inbox-consumer-cg_f_ingest.log")]
    slipped = secrets["handler-secret-cg_f_ingest"]
    planted = dict(outputs)
    planted[role_log] = outputs[role_log] + f'{{"message": "signing with {slipped}"}}\n'.encode()
    found = find_leaks(planted, secrets)
    assert found and all(leak.startswith(f"{role_log}: handler-secret") for leak in found)
