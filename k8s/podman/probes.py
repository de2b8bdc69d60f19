"""The kubelet's probes, run from the host against the pods podman plays.

podman 4.3 turns a liveness probe into a health check that only systemd timers run, and
ignores readiness and startup probes; this machine has no systemd. So the probes the
manifests declare are run here, as the kubelet runs them: ``httpGet`` against the pod's
address on the pod network (a status in 200 to 399 passes), ``exec`` inside the container.
As the kubelet does, a container's liveness and readiness probes wait until its startup
probe passed, and a liveness probe that fails ``failureThreshold`` times in a row
restarts the container (its startup probe then runs again). Every call is counted:
``status.json`` shows, per pod and probe, the calls, the failures, the last outcome and
whether the pod is ready.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from k8s.podman.overlay import Probe, Workload


def container_name(workload: Workload, container: str) -> str:
    return f"{workload.pod}-{container}"


def call(workload: Workload, probe: Probe, ip: str, timeout: float = 3.0) -> str | None:
    """One probe call: None when it passes, else why it failed."""
    if probe.http is not None:
        path, port = probe.http
        try:
            with urllib.request.urlopen(f"http://{ip}:{port}{path}", timeout=timeout) as r:
                return None if 200 <= r.status < 400 else f"HTTP {r.status}"
        except urllib.error.HTTPError as exc:
            return f"HTTP {exc.code}"
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"
    assert probe.command is not None
    proc = subprocess.run(
        ["podman", "exec", container_name(workload, probe.container), *probe.command],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout + 5,
    )
    return None if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr.strip()[:200]}"


def restart(workload: Workload, container: str) -> None:
    """Restart a container as the kubelet does after its liveness probe failed. When it was
    the pod's only running container, podman stopped the pod with it (the pod's exit
    policy), and the restart finds no pod to join: the pod is started again instead."""
    name = container_name(workload, container)
    proc = subprocess.run(["podman", "restart", name], capture_output=True, check=False)
    if proc.returncode != 0:
        subprocess.run(["podman", "pod", "start", workload.pod], capture_output=True, check=False)


@dataclass
class Tally:
    calls: int = 0
    failures: int = 0
    in_a_row: int = 0
    last: str = ""
    restarts: int = 0


@dataclass
class Prober:
    workloads: list[Workload]
    status_file: Path
    tallies: dict[tuple[str, str, str], Tally] = field(default_factory=dict)
    due: dict[tuple[str, str, str], float] = field(default_factory=dict)

    def ready(self, workload: Workload) -> bool:
        """Ready as the kubelet says: its last readiness probes passed (or it has none)."""
        keys = [k for k in self.tallies if k[0] == workload.pod and k[2] == "readiness"]
        if not any(p.kind == "readiness" for p in workload.probes):
            return True
        return bool(keys) and all(self.tallies[k].last == "ok" for k in keys)

    def resume(self) -> None:
        """Take over from the prober that wrote ``status_file``: the containers whose startup
        probe passed there have started (their liveness and readiness are probed at once)."""
        if not self.status_file.exists():
            return
        status = json.loads(self.status_file.read_text())
        for workload in self.workloads:
            for probe in workload.probes:
                seen = status.get(workload.pod, {}).get(f"{probe.container}/{probe.kind}")
                if probe.kind == "startup" and seen and seen.get("last") == "ok":
                    self.tallies[(workload.pod, probe.container, "startup")] = Tally(last="ok")

    def started(self, workload: Workload, container: str) -> bool:
        """Its startup probe passed since the container last started (or it has none)."""
        if not any(p.kind == "startup" and p.container == container for p in workload.probes):
            return True
        return self.tallies.get((workload.pod, container, "startup"), Tally()).last == "ok"

    def round(self) -> None:
        """Every probe that is due, once; the calls run side by side (an ``exec`` probe
        through podman takes seconds on a busy machine)."""
        now = time.monotonic()
        due = []
        for workload in self.workloads:
            for probe in workload.probes:
                key = (workload.pod, probe.container, probe.kind)
                if self.due.get(key, 0.0) > now:
                    continue
                if probe.kind == "startup" and self.tallies.get(key, Tally()).last == "ok":
                    continue  # a startup probe stops once it passed
                if probe.kind != "startup" and not self.started(workload, probe.container):
                    continue  # liveness and readiness wait for the startup probe
                self.due[key] = now + min(probe.period, 5.0)
                due.append((key, workload, probe))
        with ThreadPoolExecutor(max_workers=16) as pool:
            outcomes = list(pool.map(lambda d: call(d[1], d[2], d[1].ip), due))
        for (key, workload, probe), failure in zip(due, outcomes, strict=True):
            tally = self.tallies.setdefault(key, Tally())
            tally.calls += 1
            tally.last = "ok" if failure is None else failure
            if failure is None:
                tally.in_a_row = 0
                continue
            tally.failures += 1
            tally.in_a_row += 1
            if probe.kind == "liveness" and tally.in_a_row >= probe.failures:
                restart(workload, probe.container)
                tally.restarts += 1
                tally.in_a_row = 0
                started = self.tallies.get((workload.pod, probe.container, "startup"))
                if started is not None:
                    started.last = "restarted"  # probed again until it passes
        self.write()

    def write(self) -> None:
        status: dict[str, dict[str, object]] = {}
        for (pod, container, kind), t in sorted(self.tallies.items()):
            status.setdefault(pod, {})[f"{container}/{kind}"] = t.__dict__
        for workload in self.workloads:
            status.setdefault(workload.pod, {})["ready"] = self.ready(workload)
        tmp = self.status_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(status, indent=1, sort_keys=True))
        tmp.replace(self.status_file)
