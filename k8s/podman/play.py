"""``./dev kube up | down | status``: the dev overlay played by podman.

``up`` renders the dev overlay with kustomize and the Secrets with ``k8s.secrets``,
rewrites them for podman (:mod:`k8s.podman.overlay`), then plays them in the order a
cluster would settle into: PostgreSQL and NATS until their probes pass, the provisioning
Jobs until they exit 0, then every role, handler and console until its readiness probe
passes. A prober (:mod:`k8s.podman.probes`) keeps running in the background for the
liveness probes; ``down`` stops it and removes every pod. Files live in ``.var/kube``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from k8s.podman import host
from k8s.podman.overlay import NETWORK, SUBNET, Plan, Workload, podman_plan, secret_data
from k8s.podman.probes import Prober, container_name

ROOT = Path(__file__).resolve().parents[2]
OVERLAY = ROOT / "k8s" / "overlays" / "dev"
TOPOLOGIES = [ROOT / "topologies" / "sea-vibespro.yaml", ROOT / "topologies" / "mediation.yaml"]


class KubeError(RuntimeError):
    """A pod did not come up; the message names it and what its logs or probes said."""


def var_dir() -> Path:
    return Path(os.environ.get("FERRY_KUBE_DIR", ROOT / ".var" / "kube")).resolve()


def subnet() -> str:
    return os.environ.get("FERRY_KUBE_SUBNET", SUBNET)


def topologies() -> list[str] | None:
    """FERRY_KUBE_TOPOLOGIES (comma-separated): play only these topologies' workloads."""
    value = os.environ.get("FERRY_KUBE_TOPOLOGIES", "").strip()
    return [t.strip() for t in value.split(",") if t.strip()] or None


def render(var: Path) -> Plan:
    """The dev overlay and its Secrets, rewritten for podman."""
    var.mkdir(parents=True, exist_ok=True)
    var.chmod(0o700)  # Secrets' files and env values live below
    kustomize = ["kustomize", "build"] if shutil.which("kustomize") else ["kubectl", "kustomize"]
    proc = subprocess.run([*kustomize, str(OVERLAY)], text=True, capture_output=True, check=False)
    if proc.returncode != 0:
        raise KubeError(f"kustomize failed on {OVERLAY}:\n{proc.stderr}")
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    secrets_file = var / "secrets.yaml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "k8s.secrets",
            "--dev",
            "--output",
            str(secrets_file),
            "--var-dir",
            str(var / "credentials"),
            *map(str, TOPOLOGIES),
        ],
        check=True,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    secrets = [d for d in yaml.safe_load_all(secrets_file.read_text()) if d]
    return podman_plan(docs, secrets, str(var / "files"), topologies=topologies(), subnet=subnet())


def write_files(workload: Workload) -> None:
    for (folder, name), (text, mode, uid) in sorted(workload.files.items()):
        path = Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, uid, uid)
        if not name:
            path.chmod(mode)
        else:
            target = path / name
            if target.exists():
                target.chmod(0o600)
            target.write_text(text)
            os.chown(target, uid, uid)
            target.chmod(mode)


def play(workload: Workload, var: Path) -> str | None:
    """Play one workload; for a Job's pod, the init container failure it met (else None)."""
    write_files(workload)
    spec = var / "play" / f"{workload.name}.yaml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(yaml.safe_dump(workload.doc, sort_keys=False))
    spec.chmod(0o600)  # it holds the Secrets' env values
    network = NETWORK + "".join(f":alias={a}" for a in workload.aliases)
    proc = subprocess.run(
        [
            "podman",
            "play",
            "kube",
            "--network",
            network,
            "--ip",
            workload.ip,
            "--replace",
            str(spec),
        ],
        text=True,
        capture_output=True,
        check=False,
    )
    if proc.returncode == 0:
        return None
    if workload.kind == "Pod" and "init container" in proc.stderr:
        return proc.stderr.strip()  # a Job's step failed: the caller retries, as a Job does
    raise KubeError(f"podman play kube {spec.name} failed:\n{proc.stderr.strip()}")


def logs(workload: Workload, lines: int = 15) -> str:
    out = []
    for c in workload.doc_containers():
        proc = subprocess.run(
            ["podman", "logs", "--tail", str(lines), container_name(workload, c)],
            text=True,
            capture_output=True,
            check=False,
        )
        out.append(f"--- {container_name(workload, c)}\n{proc.stdout}{proc.stderr}")
    return "\n".join(out)


def wait_ready(prober: Prober, workloads: list[Workload], deadline: float, what: str) -> None:
    waiting = list(workloads)
    while waiting:
        prober.round()
        waiting = [w for w in waiting if not prober.ready(w)]
        if not waiting:
            return
        if time.monotonic() > deadline:
            detail = "\n".join(f"{w.pod}:\n{logs(w)}" for w in waiting[:3])
            raise KubeError(f"{what} not ready: {', '.join(w.pod for w in waiting)}\n{detail}")
        time.sleep(1.0)


def job_exit(workload: Workload) -> int | None:
    """The Job pod's main container's exit code, None while it runs."""
    name = container_name(workload, workload.doc_containers()[-1])
    proc = subprocess.run(
        ["podman", "inspect", name, "--format", "{{.State.Status}} {{.State.ExitCode}}"],
        text=True,
        capture_output=True,
        check=False,
    )
    state, _, code = proc.stdout.strip().partition(" ")
    return int(code) if state == "exited" else None


def run_job(workload: Workload, var: Path, deadline: float) -> None:
    """A Job's pod until its last container exits 0, retried on failure as a Job is
    (podman stops at a failed init container: the pod is started again, back-off 2 to 30 s)."""
    failure = play(workload, var)
    backoff = 2.0
    while True:
        code = job_exit(workload)
        if code == 0 and failure is None:
            return
        if time.monotonic() > deadline:
            raise KubeError(
                f"Job {workload.name} did not succeed ({failure or f'exit {code}'}):\n"
                f"{logs(workload, 40)}"
            )
        if failure is not None or code not in (None, 0):
            time.sleep(backoff)
            backoff = min(backoff * 2, 30.0)
            proc = subprocess.run(
                ["podman", "pod", "start", workload.pod],
                text=True,
                capture_output=True,
                check=False,
            )
            failure = proc.stderr.strip() if proc.returncode != 0 else None
            continue
        time.sleep(1.0)


def up(*, timeout: float = 1500.0) -> Plan:
    started = time.monotonic()
    deadline = started + timeout
    var = var_dir()
    plan = render(var)
    subprocess.run(["podman", "network", "rm", "-f", NETWORK], capture_output=True, check=False)
    subprocess.run(
        ["podman", "network", "create", "--subnet", subnet(), NETWORK],
        check=True,
        capture_output=True,
    )
    prober = Prober(plan.workloads, var / "probes.json")
    host.say(f"servers: {', '.join(w.name for w in plan.servers)}")
    for w in plan.servers:
        play(w, var)
    wait_ready(prober, plan.servers, deadline, "servers")
    host.say(f"provisioning jobs: {', '.join(w.name for w in plan.jobs)}")
    for w in plan.jobs:
        run_job(w, var, deadline)
    host.say(f"{len(plan.roles)} roles, handlers and consoles")
    for w in plan.roles:
        play(w, var)
    wait_ready(prober, plan.roles, deadline, "roles")
    host.say(f"every pod ready {time.monotonic() - started:.0f} s after the first play")
    start_prober(var)
    return plan


def start_prober(var: Path) -> None:
    stop_prober(var)
    log = (var / "prober.log").open("a")
    proc = subprocess.Popen(
        [sys.executable, "-m", "k8s.podman", "probe"],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    (var / "prober.pid").write_text(str(proc.pid))


def stop_prober(var: Path) -> None:
    pid_file = var / "prober.pid"
    if pid_file.exists():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
        pid_file.unlink()


def probe_forever() -> None:
    var = var_dir()
    plan = render(var)
    prober = Prober(plan.workloads, var / "probes.json")
    prober.resume()  # the pods `up` saw start have started
    while True:
        prober.round()
        time.sleep(1.0)


def down() -> None:
    var = var_dir()
    stop_prober(var)
    # side by side (one at a time took half a minute), the servers last
    specs = sorted((var / "play").glob("*.yaml"))
    servers = [s for s in specs if _component(s) in ("database", "messaging")]
    for batch in ([s for s in specs if s not in servers], servers):
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(_play_down, batch))
    subprocess.run(["podman", "network", "rm", "-f", NETWORK], capture_output=True, check=False)
    shutil.rmtree(var / "files", ignore_errors=True)  # the pods' folders and data
    shutil.rmtree(var / "play", ignore_errors=True)
    host.say("every pod removed, with its data")


def _play_down(spec: Path) -> None:
    subprocess.run(
        ["podman", "play", "kube", "--down", str(spec)], capture_output=True, check=False
    )


def _component(spec: Path) -> str:
    doc = yaml.safe_load(spec.read_text()) or {}
    template = doc.get("spec", {}).get("template") or doc
    labels = (template.get("metadata") or {}).get("labels") or {}
    return str(labels.get("app.kubernetes.io/component", ""))


def addresses(plan: Plan) -> dict[str, str]:
    """The consoles' addresses on the pod network (reachable from this host)."""
    out = {}
    for w in plan.roles:
        if w.component == "console":
            ip = w.ip
            out[w.name] = f"http://{ip}:{w.ports.get('health', 8080)}/"
    return out


def status() -> dict[str, Any]:
    path = var_dir() / "probes.json"
    return json.loads(path.read_text()) if path.exists() else {}


def secrets(var: Path) -> dict[str, dict[str, str]]:
    """The rendered Secrets: name → key → value."""
    docs = [d for d in yaml.safe_load_all((var / "secrets.yaml").read_text()) if d]
    return {d["metadata"]["name"]: secret_data(d) for d in docs}
