"""Least privilege in the rendered manifests: each pod gets its own role's credentials and
nothing else, as files; the provisioning Jobs alone hold the administrative ones; the
production overlay speaks TLS only; the rendered Secrets match what the pods read; the
generated NATS users work on a real nats-server."""

from __future__ import annotations

import base64
import json
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from devstack.nats import NatsServer, check_config
from k8s import pods as k8s_pods
from shared.access.identities import DB_OWNER, NATS_ADMIN, Identity, identities, pg_role_name
from shared.access.nats_auth import nats_users, password_variable
from shared.access.secret_copy import copy_private
from shared.contracts.loading import load_topology
from shared.domain.reply_subjects import inbox_prefix

from .conftest import K8S, ROOT, TOPOLOGIES, WORKLOADS, Doc, by_kind, pod_spec, tls_secrets

LOADED = [load_topology(path) for path in TOPOLOGIES.values()]
ROLE_IDENTITIES = {i.name: i for t in LOADED for i in identities(t)}
#: Settings holding a secret's value; a manifest may only name their *_FILE variants.
SECRET_VALUES = ("FERRY_NATS_PASSWORD", "FERRY_HANDLER_SECRET", "FERRY_HANDLER_SECRETS")
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


# ---------------------------------------------------------------- helpers


def _expected_secret(role: str) -> str:
    """The Secret a role's pods mount, by the naming rule (README "Security")."""
    return "ferry-role-" + role.replace("_", "-").lower()


def _settings(docs: list[Doc]) -> dict[str, str]:
    [config] = [
        d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].startswith("ferry-settings")
    ]
    data: dict[str, str] = config["data"]
    return data


def _effective_env(container: Doc, settings: dict[str, str]) -> dict[str, str]:
    """What the process sees: ferry-settings (envFrom), then env with $(VAR) expanded the
    way the kubelet does (earlier variables only; unknown references stay as written)."""
    assert container.get("envFrom", []) == [
        {"configMapRef": {"name": ref["configMapRef"]["name"]}}
        for ref in container.get("envFrom", [])
    ], "envFrom may only name the settings ConfigMap, never a Secret"
    env = dict(settings) if container.get("envFrom") else {}
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), entry["value"])
    return env


def _secret_refs(node: Any) -> set[str]:
    """Names of every Secret referenced below ``node`` (volumes, env, envFrom)."""
    found: set[str] = set()
    if isinstance(node, dict):
        for key in ("secretRef", "secretKeyRef"):
            if isinstance(node.get(key), dict):
                found.add(node[key]["name"])
        secret = node.get("secret")
        if isinstance(secret, dict) and "secretName" in secret:
            found.add(secret["secretName"])
        for value in node.values():
            found |= _secret_refs(value)
    elif isinstance(node, list):
        for value in node:
            found |= _secret_refs(value)
    return found


def _role_of(workload: Doc, container: Doc) -> str | None:
    """The role a Ferry workload runs, read from its command line and labels (not from
    the generator): None for the provisioning Jobs and servers."""
    args = container.get("args", [])
    labels = workload["metadata"].get("labels", {})
    if args[:2] == ["-m", "services.outbox_publisher"]:
        return f"outbox-publisher-{args[args.index('--context') + 1]}"
    if args[:2] == ["-m", "services.inbox_consumer"]:
        return f"inbox-consumer-{args[args.index('--durable') + 1]}"
    if args[:2] == ["-m", "services.dlq_router"]:
        return f"dlq-router-{labels['ferry/topology']}"
    if args[:2] == ["-m", "services.dlq_replayer"]:
        return f"dlq-replayer-{labels['ferry/topology']}"
    if args[:2] == ["-m", "services.handlers"]:
        return f"handler-{args[args.index('--service') + 1]}"
    if args[:2] == ["-m", "services.console"]:
        return f"console-{labels['ferry/topology']}"
    if args[:3] == ["-m", "shared.cli", "purge"]:
        return f"retention-{labels['ferry/topology']}"
    if args[:1] == ["spark-submit"] or workload["kind"] == "ScheduledSparkApplication":
        return f"kpi-spark-job-{labels['ferry/topology']}"
    return None


def _pods(docs: list[Doc]) -> list[tuple[Doc, Doc, Doc]]:
    """(workload, pod spec, main container) of every Ferry pod, Spark drivers included
    (the pod spec of a driver is the application's spec plus the driver's fields)."""
    out = []
    for doc in docs:
        if doc["kind"] in WORKLOADS:
            spec = pod_spec(doc)
            image = spec["containers"][0]["image"]
            if image.startswith(("ferry:", "ferry-kpi:")):
                out.append((doc, spec, spec["containers"][0]))
        elif doc["kind"] == "ScheduledSparkApplication":
            app = doc["spec"]["template"]
            driver = app["driver"]
            spec = {"volumes": app["volumes"], "initContainers": driver.get("initContainers", [])}
            out.append((doc, spec, {**driver, "image": app["image"], "args": []}))
    return out


def _decoded(secret: Doc) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def _secrets_by_name(secret_docs: list[Doc]) -> dict[str, dict[str, str]]:
    return {d["metadata"]["name"]: _decoded(d) for d in secret_docs}


# ---------------------------------------------------------------- each role its own


@pytest.mark.parametrize("name", ["dev", "prod"])
def test_each_role_mounts_its_own_secret_and_no_other(
    rendered: dict[str, list[Doc]], name: str
) -> None:
    pods = _pods(rendered[name])
    certificates = tls_secrets(rendered[name])  # test_tls.py checks those
    roles = {}
    for workload, spec, container in pods:
        where = f"{workload['kind']}/{workload['metadata']['name']}"
        role = _role_of(workload, container)
        refs = (_secret_refs(spec) | _secret_refs(container)) - certificates
        if role is None:  # the provisioning Job: the admin and nothing else
            assert workload["metadata"]["labels"]["app.kubernetes.io/component"] == (
                "provisioning"
            ), where
            assert refs == {k8s_pods.ADMIN_SECRET}, where
            continue
        assert role in ROLE_IDENTITIES, f"{where} runs an unknown role {role}"
        assert refs == {_expected_secret(role)}, f"{where} ({role}) mounts {refs}"
        roles[role] = where
    # Every long-running role and the KPI job are there; the admin is the Jobs' alone.
    kinds = {
        "outbox-publisher", "inbox-consumer", "dlq-router", "dlq-replayer", "kpi-spark-job",
        "retention", "console",
    }  # fmt: skip
    if name == "dev":
        kinds.add("handler")
    expected = {n for n, i in ROLE_IDENTITIES.items() if i.kind in kinds}
    assert set(roles) == expected
    jobs = [w for w, _, c in pods if _role_of(w, c) is None]
    assert len(jobs) == len(TOPOLOGIES)


@pytest.mark.parametrize("name", ["dev", "prod"])
def test_secrets_are_read_only_files_named_by_file_settings(
    rendered: dict[str, list[Doc]], secret_docs: list[Doc], name: str
) -> None:
    """0400, read-only mounts; the settings name files inside them; no value in env."""
    settings = _settings(rendered[name])
    assert not any(key.startswith(SECRET_VALUES) and not key.endswith("_FILE") for key in settings)
    assert "FERRY_DATABASES" not in settings, "a DSN map would bypass each role's own login"
    secrets = _secrets_by_name(secret_docs)
    certificates = tls_secrets(rendered[name])  # test_tls.py checks those
    for workload, spec, container in _pods(rendered[name]):
        where = f"{workload['kind']}/{workload['metadata']['name']}"
        [volume] = [
            v
            for v in spec["volumes"]
            if "secret" in v and v["secret"]["secretName"] not in certificates
        ]
        assert volume["secret"]["defaultMode"] == 0o400, where
        keys = secrets[volume["secret"]["secretName"]]
        for c in [container, *spec.get("initContainers", [])]:
            for mount in c.get("volumeMounts", []):
                if mount["name"] == volume["name"]:
                    assert mount.get("readOnly") is True, (where, c["name"])
            assert not any(
                e["name"] in SECRET_VALUES or "secretKeyRef" in e.get("valueFrom", {})
                for e in c.get("env", [])
            ), (where, c["name"])
        [mount] = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
        env = _effective_env(container, settings)
        files = {k: v for k, v in env.items() if k.startswith("FERRY_") and k.endswith("_FILE")}
        for variable, path in files.items():
            assert path.startswith(mount["mountPath"] + "/"), (where, variable)
            assert path.rsplit("/", 1)[1] in keys, (where, variable, "no such key")
        # The pgpass: copied out of the mount (0600) by the init container, read by the DSN.
        [copy] = [c for c in spec["initContainers"] if "shared.access.secret_copy" in c["args"]]
        source, dest = copy["args"][-2:]
        assert source.startswith(mount["mountPath"] + "/") and source.rsplit("/", 1)[1] in keys
        for dsn_var in [k for k in env if k == "FERRY_DSN_TEMPLATE"]:
            assert parse_qs(urlsplit(env[dsn_var]).query)["passfile"] == [dest], where


@pytest.mark.parametrize("name", ["dev", "prod"])
def test_each_role_logs_in_as_itself(
    rendered: dict[str, list[Doc]], secret_docs: list[Doc], name: str
) -> None:
    settings = _settings(rendered[name])
    secrets = _secrets_by_name(secret_docs)
    for workload, _spec, container in _pods(rendered[name]):
        role = _role_of(workload, container)
        if role is None:
            continue
        identity = ROLE_IDENTITIES[role]
        env = _effective_env(container, settings)
        login = urlsplit(env["FERRY_DSN_TEMPLATE"]).username
        assert login == pg_role_name(role), role
        assert urlsplit(env["FERRY_DSN_TEMPLATE"]).password is None, role
        [pgpass_line] = secrets[_expected_secret(role)]["pgpass"].splitlines()
        assert pgpass_line.split(":")[3] == login, role
        if identity.uses_nats:
            assert env["FERRY_NATS_USER"] == role
        else:
            assert "FERRY_NATS_USER" not in env, f"{role} does not use NATS"
            assert "nats-password" not in secrets[_expected_secret(role)], role


def test_the_provisioning_jobs_use_the_owner_and_the_admins(
    rendered: dict[str, list[Doc]], secret_docs: list[Doc]
) -> None:
    settings = _settings(rendered["prod"])
    admin = _secrets_by_name(secret_docs)[k8s_pods.ADMIN_SECRET]
    logins = {line.split(":")[3] for line in admin["pgpass"].splitlines()}
    assert logins == {settings["PG_ADMIN_USER"], DB_OWNER}
    for job in by_kind(rendered["prod"], "Job"):
        spec = pod_spec(job)
        steps = {c["name"]: c for c in spec["initContainers"] + spec["containers"]}
        assert list(steps) == ["pgpass", "logins", "migrate", "grants", "provision"]
        users = {
            step: urlsplit(_effective_env(c, settings).get("FERRY_DSN_TEMPLATE", "")).username
            for step, c in steps.items()
            if step != "pgpass"
        }
        assert users["migrate"] == DB_OWNER
        assert users["logins"] == users["grants"] == settings["PG_ADMIN_USER"]
        assert _effective_env(steps["provision"], settings)["FERRY_NATS_USER"] == NATS_ADMIN
        for step in ("logins", "grants"):  # every login's password comes from the Secret
            args = steps[step]["args"]
            directory = args[args.index("--passwords-dir") + 1]
            mounts = {m["mountPath"] for m in steps[step]["volumeMounts"]}
            assert directory in mounts
    names = {i.name for i in ROLE_IDENTITIES.values()} | {DB_OWNER}
    assert {f"pg-password-{n}" for n in names} <= set(admin)


# ---------------------------------------------------------------- production: TLS only


def test_production_overlay_requires_tls_for_every_role(rendered: dict[str, list[Doc]]) -> None:
    """Rendered with kubectl kustomize: each role's NATS URLs are tls:// with the CA
    verified, and its PostgreSQL DSN has sslmode=verify-full with the CA; the CA files are
    in a mount of its pod."""
    settings = _settings(rendered["prod"])
    checked = 0
    for workload, spec, container in _pods(rendered["prod"]):
        where = f"{workload['kind']}/{workload['metadata']['name']}"
        containers = [container] + [
            c for c in spec.get("initContainers", []) if "shared.cli" in c.get("args", [])
        ]
        for c in containers:
            env = _effective_env(c, settings)
            urls = [u.strip() for u in env["FERRY_NATS_URL"].split(",")]
            assert urls and all(u.startswith("tls://") for u in urls), (where, urls)
            assert env.get("FERRY_NATS_TLS_HANDSHAKE_FIRST") == "true", where
            mounts = [m["mountPath"] for m in c.get("volumeMounts", [])]
            ca = env["FERRY_NATS_TLS_CA"]
            assert any(ca.startswith(m + "/") for m in mounts), (where, ca)
            if "FERRY_DSN_TEMPLATE" in env:
                query = parse_qs(urlsplit(env["FERRY_DSN_TEMPLATE"]).query)
                assert query.get("sslmode") == ["verify-full"], (where, query)
                [root] = query["sslrootcert"]
                assert any(root.startswith(m + "/") for m in mounts), (where, root)
                assert "$(" not in env["FERRY_DSN_TEMPLATE"], "every $(VAR) resolves"
            checked += 1
    assert checked >= len(ROLE_IDENTITIES) - 6  # no handlers nor producers in prod


def test_dev_overlay_dsns_resolve_without_tls(rendered: dict[str, list[Doc]]) -> None:
    settings = _settings(rendered["dev"])
    for workload, spec, container in _pods(rendered["dev"]):
        dsns = [
            env["FERRY_DSN_TEMPLATE"]
            for c in [container, *spec.get("initContainers", [])]
            if "FERRY_DSN_TEMPLATE" in (env := _effective_env(c, settings))
        ]
        assert dsns, workload["metadata"]["name"]
        assert not [d for d in dsns if "$(" in d or "sslmode=disable" not in d]
        assert _effective_env(container, settings)["FERRY_NATS_URL"].startswith("nats://")


# ---------------------------------------------------------------- the rendered Secrets


def test_rendered_secrets_hold_exactly_what_each_pod_reads(secret_docs: list[Doc]) -> None:
    secrets = _secrets_by_name(secret_docs)
    for name, identity in ROLE_IDENTITIES.items():
        data = secrets[_expected_secret(name)]
        assert set(data) == set(k8s_pods.secret_keys(identity)), name
        if identity.kind == "inbox-consumer":  # the handler verifies what the consumer signs
            target = next(t for t in LOADED if identity.of in t.durables).durables[identity.of]
            handler = json.loads(secrets[_expected_secret(f"handler-{target.target}")][
                "handler-secrets.json"])  # fmt: skip
            assert handler[identity.of] == data["handler-secret"]
    users = nats_users(LOADED)
    server = secrets[k8s_pods.NATS_USERS_SECRET]
    assert set(server) == {password_variable(u) for u in users}
    for user in users:
        if user != NATS_ADMIN:
            assert server[password_variable(user)] == secrets[_expected_secret(user)][
                "nats-password"]  # fmt: skip
    admin = secrets[k8s_pods.ADMIN_SECRET]
    assert admin["nats-password"] == server[password_variable(NATS_ADMIN)]
    assert f":postgres:{secrets['postgres-dev']['POSTGRES_PASSWORD']}" in admin["pgpass"]
    assert secrets["ferry-pg-owner"]["password"] == admin[f"pg-password-{DB_OWNER}"]
    # Every user's password is its own (ferry-nats-users holds the server's copies).
    singles = [v for d in secrets.values() for k, v in d.items() if k == "nats-password"]
    assert len(set(singles)) == len(singles) == len(users)


def test_the_secrets_command_writes_a_private_file_and_prints_no_secret(tmp_path: Path) -> None:
    out, var = tmp_path / "secrets.yaml", tmp_path / "var"
    command = [sys.executable, "-m", "k8s.secrets", "--output", str(out), "--var-dir", str(var),
               "--namespace", "ferry", "--nats-namespace", "nats"]  # fmt: skip
    first = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    assert first.returncode == 0, first.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    docs = list(yaml.safe_load_all(out.read_text()))
    assert {d["metadata"]["namespace"] for d in docs} == {"ferry", "nats"}
    assert [d for d in docs if d["metadata"]["namespace"] == "nats"] == [
        d for d in docs if d["metadata"]["name"] == k8s_pods.NATS_USERS_SECRET
    ]
    values = {
        line.split(":")[-1] if path.name.startswith("pgpass") else line
        for path in (var / "secrets").iterdir()
        if not path.name.endswith((".json", ".conf"))
        for line in path.read_text().splitlines()
    }
    assert len(values) > 40
    printed = first.stdout + first.stderr
    assert not [v for v in values if v in printed]
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    assert again.returncode == 0
    assert list(yaml.safe_load_all(out.read_text())) == docs, "kept across renders"
    no_output = subprocess.run(command[:3], cwd=ROOT, capture_output=True, text=True, check=False)
    assert no_output.returncode == 2 and "--output" in no_output.stderr


def test_secret_copy_makes_a_private_copy_and_names_only_files(tmp_path: Path) -> None:
    source = tmp_path / "mounted" / "pgpass"
    source.parent.mkdir()
    source.write_text("*:*:*:ferry_x:s3cret-value\n")
    source.chmod(0o440)  # what a Secret volume gives under fsGroup
    dest = tmp_path / "private" / "pgpass"
    copy_private(source, dest)
    assert dest.read_text() == source.read_text()
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600
    empty = tmp_path / "empty"
    empty.write_text("\n")
    proc = subprocess.run(
        [sys.executable, "-m", "shared.access.secret_copy", str(empty), str(tmp_path / "x")],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and str(empty) in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "shared.access.secret_copy", str(source), str(tmp_path / "y")],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and "s3cret-value" not in proc.stdout + proc.stderr


# ---------------------------------------------------------------- NATS users, generated


def test_helm_values_carry_the_generated_users_and_tls() -> None:
    auth = yaml.safe_load((K8S / "generated" / "nats" / "values-auth.yaml").read_text())
    users = nats_users(LOADED)
    entries = auth["config"]["merge"]["authorization"]["users"]
    assert [e["user"] for e in entries] == list(users)
    for entry in entries:
        permissions = users[entry["user"]]
        assert entry["password"] == f"<< ${password_variable(entry['user'])} >>"
        if permissions is None:
            assert entry["user"] == NATS_ADMIN and "permissions" not in entry
        else:
            assert entry["permissions"]["publish"]["allow"] == list(permissions.publish)
            assert entry["permissions"]["subscribe"]["allow"] == [
                f"{inbox_prefix(entry['user'])}.>"
            ]
    assert auth["container"]["merge"]["envFrom"] == [
        {"secretRef": {"name": k8s_pods.NATS_USERS_SECRET}}
    ]
    values = yaml.safe_load((K8S / "nats" / "values.yaml").read_text())
    tls = values["config"]["nats"]["tls"]
    assert tls["enabled"] is True and tls["secretName"]
    assert tls["merge"]["handshake_first"] is True


def _nats_env(secret_docs: list[Doc]) -> dict[str, str]:
    return _secrets_by_name(secret_docs)[k8s_pods.NATS_USERS_SECRET]


def test_dev_nats_config_reads_the_generated_users_from_its_environment(
    rendered: dict[str, list[Doc]], secret_docs: list[Doc], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The dev overlay's nats.conf, with the generated authorization.conf beside it (the
    projected volume), passes `nats-server -t` once ferry-nats-users is its environment."""
    maps = {d["metadata"]["name"]: d for d in by_kind(rendered["dev"], "ConfigMap")}
    [auth] = [m for n, m in maps.items() if n.startswith("nats-authorization-")]
    (tmp_path / "nats.conf").write_text(maps["nats-config"]["data"]["nats.conf"])
    (tmp_path / "authorization.conf").write_text(auth["data"]["authorization.conf"])
    for variable, value in _nats_env(secret_docs).items():
        monkeypatch.setenv(variable, value)
    check_config(tmp_path / "nats.conf")
    [statefulset] = [s for s in by_kind(rendered["dev"], "StatefulSet") if s["metadata"]["name"]
                     == "nats"]  # fmt: skip
    [container] = pod_spec(statefulset)["containers"]
    assert container["envFrom"] == [{"secretRef": {"name": k8s_pods.NATS_USERS_SECRET}}]


def _login(port: int, user: str, password: str) -> str:
    """CONNECT as ``user`` in the NATS protocol and PING: ``PONG`` when the server lets the
    user in, its ``-ERR`` line otherwise."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        stream = sock.makefile("rwb")
        assert stream.readline().startswith(b"INFO ")
        connect = {"user": user, "pass": password, "verbose": False, "pedantic": False}
        stream.write(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
        stream.flush()
        return stream.readline().decode().strip()


def test_generated_users_authenticate_with_their_rendered_secrets(
    secret_docs: list[Doc], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real nats-server with the generated authorization.conf and ferry-nats-users as its
    environment: each user gets in with the password of its own Secret, not another's."""
    store = tmp_path / "nats"
    store.mkdir()
    generated = K8S / "generated" / "nats" / "authorization.conf"
    (store / "authorization.conf").write_text(generated.read_text())
    for variable, value in _nats_env(secret_docs).items():
        monkeypatch.setenv(variable, value)
    secrets = _secrets_by_name(secret_docs)
    server = NatsServer(store, extra="include ./authorization.conf")
    server.start()
    try:
        for user in nats_users(LOADED):
            if user == NATS_ADMIN:
                mine = secrets[k8s_pods.ADMIN_SECRET]["nats-password"]
            else:
                mine = secrets[_expected_secret(user)]["nats-password"]
            assert _login(server.port, user, mine) == "PONG", user
        publisher, consumer = "outbox-publisher-sea", "inbox-consumer-cg_f_ingest"
        theirs = secrets[_expected_secret(consumer)]["nats-password"]
        assert "Authorization Violation" in _login(server.port, publisher, theirs)
    finally:
        server.stop()
    assert not [v for v in _nats_env(secret_docs).values() if v in server.log_path.read_text()]


def test_no_secret_is_committed_under_k8s() -> None:
    """The repository's Kubernetes files name Secrets, never hold one."""
    for path in K8S.rglob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "Secret":
                raise AssertionError(f"{path.relative_to(ROOT)} holds a Secret")
            if isinstance(doc, dict) and doc.get("kind") == "Kustomization":
                assert "secretGenerator" not in doc, path


def test_identities_cover_the_generated_secret_names() -> None:
    for identity in ROLE_IDENTITIES.values():
        assert k8s_pods.role_secret(identity) == _expected_secret(identity.name)
    assert k8s_pods.role_secret(Identity("inbox-consumer", "sea__from_vibespro")) == (
        "ferry-role-inbox-consumer-sea--from-vibespro"
    )
