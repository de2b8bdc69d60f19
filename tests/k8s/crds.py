"""Structural checks of the custom resources Ferry ships, one per kind.

kubernetes-validate knows only built-in kinds; these check what each operator needs to
act on an object (and that its references point at objects that exist in the render).
Every custom kind found in a render must have a checker here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Doc = dict[str, Any]
Checker = Callable[[Doc, list[Doc]], list[str]]

_CRON_FIELD = re.compile(r"^(\*|\d+(-\d+)?)(/\d+)?(,(\*|\d+(-\d+)?)(/\d+)?)*$")
_QUANTITY = re.compile(r"^\d+(\.\d+)?([kmgtKMGT]i?|[mgMG])?$")


def _get(doc: Doc, path: str) -> Any:
    value: Any = doc
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _require(doc: Doc, paths: list[str]) -> list[str]:
    where = f"{doc['kind']}/{doc['metadata']['name']}"
    return [f"{where}: {p} is required" for p in paths if _get(doc, p) in (None, "", [], {})]


def _named(docs: list[Doc], kind: str, name: str) -> Doc | None:
    return next((d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name), None)


def scaled_object(doc: Doc, docs: list[Doc]) -> list[str]:
    """KEDA: a target that exists, sane bounds, nats-jetstream (and prometheus) triggers with
    their metadata, a formula over named triggers."""
    where = f"ScaledObject/{doc['metadata']['name']}"
    errors = _require(doc, ["spec.scaleTargetRef.name", "spec.triggers"])
    target = _named(docs, "Deployment", _get(doc, "spec.scaleTargetRef.name") or "")
    if target is None:
        errors.append(f"{where}: scaleTargetRef names no Deployment of the render")
    elif "replicas" in target["spec"]:
        errors.append(f"{where}: its Deployment sets replicas, which fights the HPA")
    low, high = _get(doc, "spec.minReplicaCount"), _get(doc, "spec.maxReplicaCount")
    if not (isinstance(low, int) and isinstance(high, int) and 0 <= low <= high):
        errors.append(f"{where}: needs 0 <= minReplicaCount <= maxReplicaCount")
    errors += _triggers(where, _get(doc, "spec.triggers") or [],
                        _get(doc, "spec.advanced.scalingModifiers.formula"))  # fmt: skip
    return errors


def _triggers(where: str, triggers: list[Doc], formula: str | None) -> list[str]:
    errors: list[str] = []
    if formula is not None:  # every trigger named, every name it uses a trigger's
        named = {t.get("name") for t in triggers}
        used = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", formula)) - {"max", "min"}
        if None in named or not used <= named:
            errors.append(f"{where}: scalingModifiers formula uses {sorted(used - named)}, "
                          "or a trigger has no name")  # fmt: skip
    for trigger in triggers:
        if trigger.get("type") == "prometheus":
            meta = trigger.get("metadata", {})
            if not all(meta.get(k) for k in ("serverAddress", "query", "threshold")):
                errors.append(f"{where}: a prometheus trigger needs serverAddress, query and "
                              "threshold")  # fmt: skip
            continue
        if trigger.get("type") != "nats-jetstream":
            errors.append(f"{where}: unexpected trigger type {trigger.get('type')!r}")
            continue
        meta = trigger.get("metadata", {})
        for key in (
            "natsServerMonitoringEndpoint",
            "account",
            "stream",
            "consumer",
            "lagThreshold",
        ):
            if not isinstance(meta.get(key), str) or not meta[key]:
                errors.append(f"{where}: trigger metadata {key} must be a non-empty string")
        if not str(meta.get("lagThreshold", "")).isdigit():
            errors.append(f"{where}: lagThreshold must be a whole number")
    return errors


def pod_monitor(doc: Doc, docs: list[Doc]) -> list[str]:
    """Prometheus Operator: selects pods of the render on a port they name."""
    where = f"PodMonitor/{doc['metadata']['name']}"
    errors = _require(doc, ["spec.selector", "spec.podMetricsEndpoints"])
    ports = set()
    selected = 0
    for workload in docs:
        if workload["kind"] != "Deployment":
            continue
        labels = workload["spec"]["template"]["metadata"]["labels"]
        if _selects(_get(doc, "spec.selector") or {}, labels):
            selected += 1
            for container in workload["spec"]["template"]["spec"]["containers"]:
                ports |= {p.get("name") for p in container.get("ports", [])}
    if not selected:
        errors.append(f"{where}: selects no pod of the render")
    for endpoint in _get(doc, "spec.podMetricsEndpoints") or []:
        if endpoint.get("port") not in ports:
            errors.append(f"{where}: port {endpoint.get('port')!r} is not a port of its pods")
    return errors


def _selects(selector: Doc, labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        value, op = labels.get(expr["key"]), expr["operator"]
        if (op == "In" and value not in expr["values"]) or (
            op == "NotIn" and value in expr["values"]
        ):
            return False
        if (op == "Exists" and value is None) or (op == "DoesNotExist" and value is not None):
            return False
    return True


def prometheus_rule(doc: Doc, docs: list[Doc]) -> list[str]:
    """Prometheus Operator: named groups of rules, each alert with expr, for and severity."""
    where = f"PrometheusRule/{doc['metadata']['name']}"
    errors = _require(doc, ["spec.groups"])
    names = set()
    for group in _get(doc, "spec.groups") or []:
        if not group.get("name") or not group.get("rules"):
            errors.append(f"{where}: every group needs a name and rules")
        for rule in group.get("rules", []):
            name = rule.get("alert") or rule.get("record")
            if not name or not isinstance(rule.get("expr"), str) or not rule["expr"].strip():
                errors.append(f"{where}: rule {name!r} needs alert/record and expr")
            if rule.get("alert"):
                if rule["alert"] in names:
                    errors.append(f"{where}: alert {rule['alert']} defined twice")
                names.add(rule["alert"])
                if "severity" not in rule.get("labels", {}):
                    errors.append(f"{where}: alert {rule['alert']} has no severity label")
                if not re.fullmatch(r"\d+[smhd]", str(rule.get("for", ""))):
                    errors.append(f"{where}: alert {rule['alert']} needs a `for` duration")
    return errors


def cnpg_cluster(doc: Doc, docs: list[Doc]) -> list[str]:
    """CloudNativePG: instances, storage size, and the secrets it reads named."""
    where = f"Cluster/{doc['metadata']['name']}"
    errors = _require(doc, ["spec.instances", "spec.storage.size"])
    if not isinstance(_get(doc, "spec.instances"), int) or _get(doc, "spec.instances") < 1:
        errors.append(f"{where}: instances must be >= 1")
    if not _QUANTITY.match(str(_get(doc, "spec.storage.size") or "")):
        errors.append(f"{where}: storage.size must be a quantity")
    for role in _get(doc, "spec.managed.roles") or []:
        if not role.get("name") or not _get(role, "passwordSecret.name"):
            errors.append(f"{where}: managed role needs a name and a passwordSecret")
    return errors


def cnpg_database(doc: Doc, docs: list[Doc]) -> list[str]:
    """CloudNativePG Database: names its database, owner and a Cluster of the render."""
    where = f"Database/{doc['metadata']['name']}"
    errors = _require(doc, ["spec.name", "spec.owner", "spec.cluster.name"])
    cluster = _named(docs, "Cluster", _get(doc, "spec.cluster.name") or "")
    if cluster is None:
        errors.append(f"{where}: its cluster is not in the render")
    elif _get(doc, "spec.owner") not in {
        r.get("name") for r in _get(cluster, "spec.managed.roles") or []
    }:
        errors.append(f"{where}: owner is not a managed role of the cluster")
    return errors


def _spark_spec(where: str, spec: Doc, docs: list[Doc]) -> list[str]:
    errors = []
    for path in (
        "type",
        "mode",
        "image",
        "mainApplicationFile",
        "sparkVersion",
        "driver",
        "executor",
    ):
        if _get(spec, path) in (None, ""):
            errors.append(f"{where}: {path} is required")
    if spec.get("type") not in ("Python", "Scala", "Java", "R"):
        errors.append(f"{where}: type must be Python, Scala, Java or R")
    if spec.get("mode") != "cluster":
        errors.append(f"{where}: the operator runs cluster mode only")
    if spec.get("type") == "Python" and not str(spec.get("mainApplicationFile", "")).endswith(
        ".py"
    ):
        errors.append(f"{where}: a Python application runs a .py file")
    account = _get(spec, "driver.serviceAccount")
    if not account or _named(docs, "ServiceAccount", account) is None:
        errors.append(f"{where}: driver.serviceAccount must be a ServiceAccount of the render")
    for role in ("driver", "executor"):
        if not _QUANTITY.match(str(_get(spec, f"{role}.memory") or "")):
            errors.append(f"{where}: {role}.memory must be a quantity")
    mounts = {
        m["name"] for r in ("driver", "executor") for m in _get(spec, f"{r}.volumeMounts") or []
    }
    volumes = {v["name"] for v in spec.get("volumes", [])}
    if mounts - volumes:
        errors.append(f"{where}: mounts {sorted(mounts - volumes)} have no volume")
    return errors


def scheduled_spark_application(doc: Doc, docs: list[Doc]) -> list[str]:
    """Spark operator ScheduledSparkApplication: a five-field schedule and a valid template."""
    where = f"ScheduledSparkApplication/{doc['metadata']['name']}"
    errors = _require(doc, ["spec.schedule", "spec.template"])
    fields = str(_get(doc, "spec.schedule") or "").split()
    if len(fields) != 5 or not all(_CRON_FIELD.match(f) for f in fields):
        errors.append(f"{where}: schedule must be a five-field cron expression")
    if _get(doc, "spec.concurrencyPolicy") not in ("Allow", "Forbid", "Replace"):
        errors.append(f"{where}: concurrencyPolicy must be Allow, Forbid or Replace")
    return errors + _spark_spec(where, _get(doc, "spec.template") or {}, docs)


_DURATION = re.compile(r"^(\d+(\.\d+)?(h|m|s|ms))+$")
_USAGES = {
    "signing", "digital signature", "content commitment", "key encipherment", "key agreement",
    "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any",
    "server auth", "client auth", "code signing", "email protection", "s/mime",
    "ipsec end system", "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing",
    "microsoft sgc", "netscape sgc",
}  # fmt: skip
_KEY_SIZES = {"RSA": range(2048, 8193), "ECDSA": (256, 384, 521), "Ed25519": (None,)}
_DNS_NAME = re.compile(r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


_CERTIFICATE_FIELDS = {
    "secretName", "secretTemplate", "commonName", "dnsNames", "uris", "ipAddresses",
    "emailAddresses", "duration", "renewBefore", "privateKey", "usages", "issuerRef", "isCA",
    "subject", "literalSubject", "keystores", "revisionHistoryLimit", "additionalOutputFormats",
    "nameConstraints", "otherNames", "encodeUsagesInRequest", "renewBeforePercentage",
}  # fmt: skip
_SUBJECTS = ("commonName", "dnsNames", "uris", "ipAddresses", "emailAddresses")


def certificate(doc: Doc, docs: list[Doc]) -> list[str]:
    """cert-manager Certificate (v1): only fields of its schema, a secretName, a subject
    (commonName at most 64 characters, DNS names valid), known usages, a valid key and
    durations, and an issuerRef naming an Issuer of the render or a ClusterIssuer (made
    elsewhere: k8s/examples/cert-manager-ca)."""
    where = f"Certificate/{doc['metadata']['name']}"
    spec = doc.get("spec", {})
    errors = _require(doc, ["spec.secretName", "spec.issuerRef.name"])
    if set(spec) - _CERTIFICATE_FIELDS:
        errors.append(f"{where}: unknown spec fields {sorted(set(spec) - _CERTIFICATE_FIELDS)}")
    if not any(spec.get(k) for k in _SUBJECTS):
        errors.append(f"{where}: needs a commonName or a SAN")
    if len(spec.get("commonName", "")) > 64:
        errors.append(f"{where}: commonName longer than 64 characters")
    errors += [f"{where}: {n!r} is not a DNS name" for n in spec.get("dnsNames", [])
               if not _DNS_NAME.match(n) or len(n) > 253]  # fmt: skip
    errors += [f"{where}: unknown usage {u!r}" for u in spec.get("usages", []) if u not in _USAGES]
    errors += [f"{where}: {f} must be a Go duration" for f in ("duration", "renewBefore")
               if f in spec and not _DURATION.match(str(spec[f]))]  # fmt: skip
    return errors + _private_key(where, spec.get("privateKey", {})) + _issuer_ref(where, spec, docs)


def _private_key(where: str, key: Doc) -> list[str]:
    algorithm = key.get("algorithm", "RSA")
    size = key.get("size", 2048 if algorithm == "RSA" else None)
    errors = []
    if algorithm not in _KEY_SIZES or size not in _KEY_SIZES[algorithm]:
        errors.append(f"{where}: privateKey {algorithm} of size {size} is invalid")
    if key.get("rotationPolicy", "Always") not in ("Always", "Never"):
        errors.append(f"{where}: rotationPolicy must be Always or Never")
    return errors


def _issuer_ref(where: str, spec: Doc, docs: list[Doc]) -> list[str]:
    ref = spec.get("issuerRef", {})
    kind = ref.get("kind", "Issuer")
    if ref.get("group", "cert-manager.io") != "cert-manager.io" or kind not in (
        "Issuer",
        "ClusterIssuer",
    ):
        return [f"{where}: issuerRef must name a cert-manager Issuer or ClusterIssuer"]
    if kind == "Issuer" and _named(docs, "Issuer", ref.get("name", "")) is None:
        return [f"{where}: its Issuer is not in the render"]
    return []


def issuer(doc: Doc, docs: list[Doc]) -> list[str]:
    """cert-manager Issuer or ClusterIssuer: exactly one kind of issuer; a CA issuer names
    its Secret, and a Certificate of the render makes it when one does."""
    where = f"{doc['kind']}/{doc['metadata']['name']}"
    spec = doc.get("spec", {})
    kinds = [k for k in ("selfSigned", "ca", "vault", "acme", "venafi") if k in spec]
    if len(kinds) != 1:
        return [f"{where}: needs exactly one of selfSigned, ca, vault, acme, venafi"]
    errors = []
    if kinds == ["ca"]:
        secret = _get(doc, "spec.ca.secretName")
        if not secret:
            errors.append(f"{where}: a CA issuer needs ca.secretName")
        makers = [d for d in docs if d["kind"] == "Certificate"
                  and _get(d, "spec.secretName") == secret]  # fmt: skip
        if makers and not all(_get(d, "spec.isCA") is True for d in makers):
            errors.append(f"{where}: the Certificate making {secret} is not a CA (isCA)")
    if doc["kind"] == "ClusterIssuer" and "namespace" in doc["metadata"]:
        errors.append(f"{where}: a ClusterIssuer is cluster-scoped: no namespace")
    return errors


CUSTOM_RESOURCES: dict[tuple[str, str], Checker] = {
    ("cert-manager.io/v1", "Certificate"): certificate,
    ("cert-manager.io/v1", "Issuer"): issuer,
    ("cert-manager.io/v1", "ClusterIssuer"): issuer,
    ("keda.sh/v1alpha1", "ScaledObject"): scaled_object,
    ("monitoring.coreos.com/v1", "PodMonitor"): pod_monitor,
    ("monitoring.coreos.com/v1", "PrometheusRule"): prometheus_rule,
    ("postgresql.cnpg.io/v1", "Cluster"): cnpg_cluster,
    ("postgresql.cnpg.io/v1", "Database"): cnpg_database,
    ("sparkoperator.k8s.io/v1beta2", "ScheduledSparkApplication"): scheduled_spark_application,
}


def check_custom_resource(doc: Doc, docs: list[Doc]) -> list[str]:
    """Problems of one custom resource (empty when it is fine)."""
    return CUSTOM_RESOURCES[(doc["apiVersion"], doc["kind"])](doc, docs)
