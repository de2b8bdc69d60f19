"""TLS from cert-manager (issue 47), as rendered: the prod overlay (which includes
k8s/components/tls) and the dev overlay with that Component added (the demo handler
services, which only dev runs, serving HTTPS), against the NATS servers' certificates
(k8s/nats/tls) and the example issuer (k8s/examples/cert-manager-ca).

Each check returns its findings, so that :func:`test_the_checks_catch_broken_manifests` can
show every one of them failing on a broken render.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from kubernetes_validate import utils as kv

from k8s import tls as k8s_tls
from shared.access.identities import NATS_ADMIN, identities

from .conftest import K8S, WORKLOADS, Doc, by_kind, pod_spec, render, tls_secrets
from .crds import CUSTOM_RESOURCES, check_custom_resource
from .test_credentials import LOADED, _effective_env, _settings

#: Files a cert-manager Secret holds (kubernetes.io/tls plus the CA).
CERT_KEYS = {"tls.crt", "tls.key", "ca.crt"}
#: The workload kinds that must each serve a Service over TLS, by app.kubernetes.io/name.
SERVERS = {"console", "handler"}


@pytest.fixture(scope="module")
def dev_tls(tmp_path_factory: pytest.TempPathFactory) -> list[Doc]:
    """The dev overlay with k8s/components/tls: what switching TLS on in an overlay of
    one's own gives (the demo handlers included)."""
    root = tmp_path_factory.mktemp("dev-tls")
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(K8S / "overlays" / "dev", root)],
        "components": [os.path.relpath(K8S / "components" / "tls", root)],
    }
    (root / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return render(root)


@pytest.fixture(scope="module")
def renders(rendered: dict[str, list[Doc]], dev_tls: list[Doc]) -> dict[str, list[Doc]]:
    return {"prod": rendered["prod"], "dev-tls": dev_tls}


# ---------------------------------------------------------------- pods and their files


def _pods(docs: list[Doc]) -> Iterator[tuple[str, Doc, Doc, list[Doc]]]:
    """(where, workload, pod volumes by name, containers) of every Ferry pod; a Spark
    application's driver and executors as two pods sharing the application's volumes."""
    for doc in docs:
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] in WORKLOADS:
            spec = pod_spec(doc)
            if not spec["containers"][0]["image"].startswith(("ferry:", "ferry-kpi:")):
                continue
            volumes = {v["name"]: v for v in spec.get("volumes", [])}
            yield name, doc, volumes, spec.get("initContainers", []) + spec["containers"]
        elif doc["kind"] == "ScheduledSparkApplication":
            app = doc["spec"]["template"]
            volumes = {v["name"]: v for v in app["volumes"]}
            yield f"{name} driver", doc, volumes, [app["driver"]]
            yield f"{name} executor", doc, volumes, [app["executor"]]


def _secret_files(volume: Doc) -> set[str] | None:
    """The files a Secret volume shows (its items, or every key of a certificate Secret);
    None for another kind of volume."""
    secret = volume.get("secret")
    if secret is None:
        return None
    if "items" in secret:
        return {item["path"] for item in secret["items"]}
    return set(CERT_KEYS)


def _tls_paths(env: dict[str, str]) -> dict[str, str]:
    """Every file a process is told to read for TLS: FERRY_*_TLS_* and the DSN's sslrootcert."""
    paths = {k: v for k, v in env.items() if k.startswith("FERRY_") and "_TLS_" in k}
    paths.pop("FERRY_NATS_TLS_HANDSHAKE_FIRST", None)
    if "FERRY_DSN_TEMPLATE" in env:
        query = parse_qs(urlsplit(env["FERRY_DSN_TEMPLATE"]).query)
        for root in query.get("sslrootcert", []):
            paths["sslrootcert"] = root
    return paths


def _named(docs: list[Doc], name: str) -> list[Doc]:
    """The Deployments of role ``name`` (app.kubernetes.io/name)."""
    return [
        d
        for d in by_kind(docs, "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/name"] == name
    ]


def _env(container: Doc, settings: dict[str, str]) -> dict[str, str]:
    return _effective_env(container, settings) if container.get("envFrom") else {}


# ---------------------------------------------------------------- the checks


def certificate_mounts(docs: list[Doc]) -> list[str]:
    """(a) Every Certificate's Secret is mounted by the workload it is for, and only there;
    every Ferry pod with credentials mounts exactly its own certificate. A handler
    service's certificate may have no pod in the render: production runs your handlers."""
    errors = []
    made = {d["spec"]["secretName"]: d for d in by_kind(docs, "Certificate")}
    mounted_by: dict[str, set[str]] = {name: set() for name in made}
    for where, doc, volumes, containers in _pods(docs):
        mine = {
            v["secret"]["secretName"]
            for v in volumes.values()
            if "secret" in v and v["secret"]["secretName"] in made
        }
        used = {
            volumes[m["name"]]["secret"]["secretName"]
            for c in containers
            for m in c.get("volumeMounts", [])
            if "secret" in volumes.get(m["name"], {})
        }
        for secret in mine & used:
            mounted_by[secret].add(doc["metadata"]["name"])
        expected = k8s_tls.tls_secret(doc["metadata"]["name"])
        if where.endswith("executor"):
            if mine & used:
                errors.append(f"{where}: an executor holds no credentials, yet mounts {mine}")
        elif mine & used != {expected}:
            errors.append(f"{where}: mounts certificates {sorted(mine & used)}, not {expected}")
    for secret, workloads in mounted_by.items():
        owner = made[secret]["metadata"]["labels"]["app.kubernetes.io/instance"]
        if workloads - {owner}:
            errors.append(f"Secret {secret} (of {owner}) is mounted by {sorted(workloads)}")
        if not workloads and not owner.startswith("handler-"):
            errors.append(f"Secret {secret}: no pod of the render mounts it")
    return errors


def tls_paths_are_mounted(docs: list[Doc]) -> list[str]:
    """(b) Every FERRY_*_TLS_* file and sslrootcert lies in a volume its container mounts,
    and that volume holds the file."""
    errors = []
    settings = _settings(docs)
    for where, _doc, volumes, containers in _pods(docs):
        for container in containers:
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            env = _env(container, settings)
            if where.endswith("executor"):  # JDBC reads: the PostgreSQL CA alone
                env = {k: v for k, v in env.items() if k == "FERRY_DSN_TEMPLATE"}
            for variable, path in _tls_paths(env).items():
                directory, _, file = path.rpartition("/")
                volume = volumes.get(mounts.get(directory, ""), {})
                files = _secret_files(volume)
                if files is None or file not in files:
                    errors.append(f"{where} {container.get('name', '')}: {variable}={path} "
                                  "is not a file of a mounted Secret")  # fmt: skip
    return errors


def no_sub_path(docs: list[Doc]) -> list[str]:
    """(c) No TLS Secret is mounted with subPath (never updated when cert-manager renews)
    and every TLS mount is read-only; the PostgreSQL CA mount shows ca.crt, never ca.key."""
    errors = []
    certificates = tls_secrets(docs)
    for where, _doc, volumes, containers in _pods(docs):
        for container in containers:
            for mount in container.get("volumeMounts", []):
                secret = volumes.get(mount["name"], {}).get("secret", {})
                if secret.get("secretName") not in certificates:
                    continue
                if "subPath" in mount or "subPathExpr" in mount:
                    errors.append(f"{where}: {mount['name']} mounted with subPath")
                if mount.get("readOnly") is not True:
                    errors.append(f"{where}: {mount['name']} is not mounted read-only")
        for volume in volumes.values():
            secret = volume.get("secret", {})
            if secret.get("secretName") == k8s_tls.PG_CA_SECRET and _secret_files(volume) != {
                "ca.crt"
            }:
                errors.append(f"{where}: the PostgreSQL CA volume must show ca.crt alone")
    return errors


def handlers_over_https(docs: list[Doc]) -> list[str]:
    """(e) Each consumer calls its handler at an https:// URL whose host the handler's
    certificate names, verifying it against the CA and showing its own certificate."""
    errors = []
    settings = _settings(docs)
    maps = {d["metadata"]["name"]: d["data"] for d in by_kind(docs, "ConfigMap")}
    names = {n for d in by_kind(docs, "Certificate") for n in d["spec"].get("dnsNames", [])}
    consumers = _named(docs, "inbox-consumer")
    for doc in consumers:
        where = f"Deployment/{doc['metadata']['name']}"
        [container] = pod_spec(doc)["containers"]
        env = _effective_env(container, settings)
        [ref] = [e["valueFrom"]["configMapKeyRef"] for e in container["env"]
                 if e["name"] == "FERRY_HANDLER_URL"]  # fmt: skip
        url = urlsplit(maps[ref["name"]][ref["key"]])
        if url.scheme != "https":
            errors.append(f"{where}: handler URL {url.geturl()} is not https")
        if url.hostname not in names:
            errors.append(f"{where}: no certificate names the handler host {url.hostname}")
        for variable in ("FERRY_HANDLER_TLS_CA", "FERRY_HANDLER_TLS_CERT", "FERRY_HANDLER_TLS_KEY"):
            if variable not in env:
                errors.append(f"{where}: {variable} is not set")
    if not consumers:
        errors.append("no consumer in the render")
    return errors


CHECKS = [certificate_mounts, tls_paths_are_mounted, no_sub_path, handlers_over_https]


# ---------------------------------------------------------------- the tests


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", ["prod", "dev-tls"])
def test_tls_render(renders: dict[str, list[Doc]], name: str, check: object) -> None:
    assert callable(check)
    errors = check(renders[name])
    assert not errors, "\n".join(errors)


def _consumer(docs: list[Doc]) -> Doc:
    return next(
        d
        for d in by_kind(docs, "Deployment")
        if d["metadata"]["name"].startswith("inbox-consumer-")
    )


def _unmount_certificate(docs: list[Doc]) -> None:
    container = pod_spec(_consumer(docs))["containers"][0]
    container["volumeMounts"] = [
        m for m in container["volumeMounts"] if m["name"] != k8s_tls.CERT_VOLUME
    ]


def _sub_path(docs: list[Doc]) -> None:
    container = pod_spec(_consumer(docs))["containers"][0]
    for mount in container["volumeMounts"]:
        if mount["name"] == k8s_tls.CERT_VOLUME:
            mount["subPath"] = "tls.crt"


def _http_handler(docs: list[Doc]) -> None:
    for config in by_kind(docs, "ConfigMap"):
        if config["metadata"]["name"].startswith("ferry-handlers-"):
            data = config["data"]
            config["data"] = {k: v.replace("https://", "http://") for k, v in data.items()}


def _whole_ca_secret(docs: list[Doc]) -> None:
    for volume in pod_spec(_consumer(docs))["volumes"]:
        if volume["name"] == k8s_tls.PG_CA_VOLUME:
            del volume["secret"]["items"]


def _broken(docs: list[Doc], edit: Callable[[list[Doc]], None]) -> list[Doc]:
    copied = copy.deepcopy(docs)
    edit(copied)
    return copied


def test_the_checks_catch_broken_manifests(renders: dict[str, list[Doc]]) -> None:
    """Each check above fails on a render broken the way it guards against."""
    docs = renders["dev-tls"]
    assert certificate_mounts(_broken(docs, _unmount_certificate))
    assert tls_paths_are_mounted(_broken(docs, _unmount_certificate))
    assert no_sub_path(_broken(docs, _sub_path))
    assert no_sub_path(_broken(docs, _whole_ca_secret))
    assert handlers_over_https(_broken(docs, _http_handler))


def test_every_role_identity_has_its_certificate(rendered: dict[str, list[Doc]]) -> None:
    """Production: one Certificate per workload, named after the identity it runs as; the
    console's and each handler service's also serve their Service's names."""
    certificates = {d["metadata"]["name"]: d for d in by_kind(rendered["prod"], "Certificate")}
    names = {d["spec"]["commonName"] for d in certificates.values()}
    expected = {i.name for t in LOADED for i in identities(t) if i.kind != "producer"}
    assert names == expected | {NATS_ADMIN}
    services = {d["metadata"]["name"] for d in by_kind(rendered["prod"], "Service")}
    for cert in certificates.values():
        instance = cert["metadata"]["labels"]["app.kubernetes.io/instance"]
        server = instance.split("-")[0] in SERVERS
        assert ("server auth" in cert["spec"]["usages"]) is server, instance
        assert "client auth" in cert["spec"]["usages"], instance
        if server:
            assert cert["spec"]["dnsNames"][0] == instance
            assert f"{instance}.ferry.svc.cluster.local" in cert["spec"]["dnsNames"]
            if instance.startswith("console-"):
                assert instance in services
        assert cert["spec"]["issuerRef"] == k8s_tls.ISSUER


def test_the_console_serves_https(rendered: dict[str, list[Doc]]) -> None:
    settings = _settings(rendered["prod"])
    consoles = _named(rendered["prod"], "console")
    assert len(consoles) == len(LOADED)
    for doc in consoles:
        [container] = pod_spec(doc)["containers"]
        env = _effective_env(container, settings)
        assert env["FERRY_CONSOLE_TLS_CERT"].endswith("/tls.crt")
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert container[probe]["httpGet"]["scheme"] == "HTTPS", probe
        [service] = [s for s in by_kind(rendered["prod"], "Service")
                     if s["metadata"]["name"] == doc["metadata"]["name"]]  # fmt: skip
        assert service["spec"]["ports"] == [
            {"name": "https", "port": 443, "targetPort": "health", "protocol": "TCP"}
        ]


def test_demo_handlers_serve_https_to_consumers_with_certificates(dev_tls: list[Doc]) -> None:
    """With TLS on, a handler service serves its certificate and requires a client's from
    the CA; its probes only open the port (the kubelet has no client certificate)."""
    settings = _settings(dev_tls)
    handlers = _named(dev_tls, "handler")
    assert handlers
    for doc in handlers:
        [container] = pod_spec(doc)["containers"]
        env = _effective_env(container, settings)
        assert env["FERRY_HANDLER_TLS_CLIENT_CA"] == f"{k8s_tls.CERT_DIR}/ca.crt"
        assert env["FERRY_HANDLER_TLS_CERT"] == f"{k8s_tls.CERT_DIR}/tls.crt"
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert "tcpSocket" in container[probe] and "httpGet" not in container[probe]


def test_every_pod_speaks_tls_to_nats_and_postgres(renders: dict[str, list[Doc]]) -> None:
    for name, docs in renders.items():
        settings = _settings(docs)
        assert settings["FERRY_NATS_URL"].startswith("tls://"), name
        for variable in ("FERRY_NATS_TLS_CA", "FERRY_NATS_TLS_CERT", "FERRY_NATS_TLS_KEY"):
            assert settings[variable].startswith(k8s_tls.CERT_DIR + "/"), (name, variable)
        dsns = 0
        for where, _doc, _volumes, containers in _pods(docs):
            for container in containers:
                env = _env(container, settings)
                if "FERRY_DSN_TEMPLATE" in env:
                    query = parse_qs(urlsplit(env["FERRY_DSN_TEMPLATE"]).query)
                    assert query["sslmode"] == ["verify-full"], where
                    dsns += 1
        assert dsns > len(LOADED) * 5, name


def test_dev_without_the_component_is_unchanged(rendered: dict[str, list[Doc]]) -> None:
    """The dev overlay (podman runs it, no cert-manager there) has no TLS at all."""
    docs = rendered["dev"]
    assert not by_kind(docs, "Certificate")
    assert _settings(docs)["FERRY_NATS_URL"].startswith("nats://")
    for config in by_kind(docs, "ConfigMap"):
        if config["metadata"]["name"].startswith("ferry-handlers-"):
            assert all(v.startswith("http://") for v in config["data"].values())


# ---------------------------------------------------------------- NATS and the issuer


def test_nats_serves_clients_and_routes_over_tls_from_the_certificates(
    rendered: dict[str, list[Doc]],
) -> None:
    values = yaml.safe_load((K8S / "nats" / "values.yaml").read_text())
    certificates = {
        d["spec"]["secretName"]: d for d in by_kind(rendered["nats-tls"], "Certificate")
    }
    clients, routes = values["config"]["nats"]["tls"], values["config"]["cluster"]["tls"]
    assert clients["enabled"] and routes["enabled"]
    assert clients["merge"]["verify"] is True and routes["merge"]["verify"] is True
    assert values["tlsCA"]["enabled"] and values["tlsCA"]["secretName"] in certificates
    server, cluster = certificates[clients["secretName"]], certificates[routes["secretName"]]
    host = urlsplit(_settings(rendered["prod"])["FERRY_NATS_URL"]).hostname
    assert host in server["spec"]["dnsNames"]
    assert {"server auth", "client auth"} <= set(cluster["spec"]["usages"])
    assert "*.nats-headless.nats.svc.cluster.local" in cluster["spec"]["dnsNames"]
    assert {d["metadata"]["namespace"] for d in certificates.values()} == {"nats"}


def test_the_issuer_every_certificate_names_is_made_by_the_example(
    rendered: dict[str, list[Doc]],
) -> None:
    issuers = {
        (d["kind"], d["metadata"]["name"]): d
        for d in rendered["cert-manager-ca"]
        if d["kind"] in ("Issuer", "ClusterIssuer")
    }
    for name in ("prod", "nats-tls"):
        for cert in by_kind(rendered[name], "Certificate"):
            ref = cert["spec"]["issuerRef"]
            assert (ref["kind"], ref["name"]) in issuers, (name, cert["metadata"]["name"])
    ca = issuers[("ClusterIssuer", k8s_tls.ISSUER["name"])]
    [root] = [
        c
        for c in by_kind(rendered["cert-manager-ca"], "Certificate")
        if c["spec"]["secretName"] == ca["spec"]["ca"]["secretName"]
    ]
    assert root["spec"]["isCA"] is True and root["metadata"]["namespace"] == "cert-manager"


@pytest.mark.parametrize("name", ["nats-tls", "cert-manager-ca"])
def test_cert_manager_resources_validate(rendered: dict[str, list[Doc]], name: str) -> None:
    docs = rendered[name]
    assert docs and all((d["apiVersion"], d["kind"]) in CUSTOM_RESOURCES for d in docs)
    errors = [e for d in docs for e in check_custom_resource(d, docs)]
    assert not errors, "\n".join(errors)


def test_the_certificate_checker_can_fail(rendered: dict[str, list[Doc]]) -> None:
    cert = copy.deepcopy(by_kind(rendered["prod"], "Certificate")[0])
    cert["spec"]["usages"].append("server-auth")
    cert["spec"]["dnsNames"] = ["Not_A_Name"]
    cert["spec"]["privateKey"]["size"] = 512
    cert["spec"]["issuerRef"] = {"name": "missing", "kind": "Issuer"}
    cert["spec"]["renewbefore"] = "1h"
    errors = check_custom_resource(cert, [cert])
    for fragment in ("usage", "DNS name", "privateKey", "Issuer is not", "unknown spec"):
        assert any(fragment in e for e in errors), (fragment, errors)


@pytest.mark.parametrize("version", ["1.30", kv.latest_version()])
def test_dev_with_tls_validates_strictly(dev_tls: list[Doc], version: str) -> None:
    """The patches leave valid pods (kubernetes-validate --strict), e.g. a probe that is
    tcpSocket only, and the custom resources carry what cert-manager requires."""
    errors = []
    for doc in dev_tls:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        if (doc["apiVersion"], doc["kind"]) in CUSTOM_RESOURCES:
            errors += check_custom_resource(doc, dev_tls)
            continue
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as exc:
            errors.append(f"{where}: {'.'.join(str(p) for p in exc.path)}: {exc.message}")
    assert not errors, "\n".join(errors)


def test_generated_component_is_what_the_generator_writes() -> None:
    """k8s/generated/<topology>/tls is the generator's output (test_generated checks all;
    this one names the component) and k8s/components/tls includes each topology's."""
    component = yaml.safe_load((K8S / "components" / "tls" / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    included = {Path(p).parent.name for p in component["components"]}
    assert included == {t.name for t in LOADED}
