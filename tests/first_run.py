"""The README's first run, once per test session, for every test that judges it.

``python -m devstack.stack up --demo`` on a fresh data directory with the demo's defaults
(as ``./dev run`` runs it, the KPI job included), tracing to a file and on ports chosen
here, each role's ``/metrics``, ``/healthz`` and ``/readyz`` and nats-server's ``/connz``
scraped while the demo runs and after its summary. What the user sees is judged by
tests/e2e/test_demo.py, what the run leaves behind by tests/security/test_no_secret_in_logs.py:
one run of the whole stack instead of one each (a minute of CI).
"""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import threading
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from devstack.ports import free_ports
from devstack.stack import PORT_VARS

ROOT = Path(__file__).resolve().parents[1]
#: A bound, not an expectation: the demo produces for 20 s, settles, then runs Spark.
RUN_LIMIT = 840.0
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class DemoRun:
    """What one ``devstack.stack up --demo`` produced: its data directory, exit code,
    output (stdout and stderr, in order), the ports it was given and what was scraped."""

    var: Path
    returncode: int
    stdout: str
    ports: dict[str, int]
    scraped: dict[str, bytes] = field(default_factory=dict)


def _get(url: str, trust: ssl.SSLContext | None = None) -> bytes:
    opener = _HTTP
    if trust is not None:
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=trust)
        )
    try:
        with opener.open(url, timeout=5) as response:
            return bytes(response.read())
    except OSError as exc:  # a role that is not serving yet: recorded, not fatal
        return f"unavailable: {exc}".encode()


def _scrape(run: DemoRun, label: str) -> None:
    """Every role's /metrics, /healthz, /readyz and nats-server's /connz, as they are now."""
    for variable, port in run.ports.items():
        if variable.startswith(("FERRY_PORT_PUB_", "FERRY_PORT_CON_", "FERRY_PORT_DLQ_",
                                "FERRY_PORT_HANDLER_")):  # fmt: skip
            # The handler services serve HTTPS (the stack's CA); roles' health ports HTTP.
            handler = variable.startswith("FERRY_PORT_HANDLER_")
            trust = None
            if handler:
                trust = ssl.create_default_context(cafile=str(run.var / "tls" / "ca.crt"))
            scheme = "https" if handler else "http"
            for path in ("/metrics", "/healthz", "/readyz"):
                url = f"{scheme}://127.0.0.1:{port}{path}"
                run.scraped[f"{label}{path}@{variable}"] = _get(url, trust)
    monitor = run.ports["FERRY_NATS_MONITOR_PORT"]
    run.scraped[f"{label}/connz"] = _get(f"http://127.0.0.1:{monitor}/connz?auth=true&limit=1024")


def run_first_demo(var: Path) -> DemoRun:
    """Run the demo into ``var`` (fresh; its parent reachable by the stack's unprivileged
    PostgreSQL user), scraping as it goes; stopped at :data:`RUN_LIMIT`."""
    ports = dict(zip(PORT_VARS, free_ports(len(PORT_VARS)), strict=True))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FERRY_", "OTEL_"))}
    env.update({k: str(v) for k, v in ports.items()})
    env.update(
        PYTHONPATH=str(ROOT),
        FERRY_TRACES_EXPORTER="file",
        FERRY_TRACES_FILE=str(var / "traces" / "ferry-traces.jsonl"),
    )
    (var / "traces").mkdir(parents=True)
    argv = [sys.executable, "-m", "devstack.stack", "up", "--demo", "--var-dir", str(var)]
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    watchdog = threading.Timer(RUN_LIMIT, lambda: os.killpg(proc.pid, signal.SIGTERM))
    watchdog.start()
    run = DemoRun(var=var, returncode=-1, stdout="", ports=ports)
    lines: list[str] = []
    scrapers: list[threading.Thread] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("demo:") or line.startswith("Ferry demo summary"):
                label = "during-demo" if line.startswith("demo:") else "after-demo"
                scrapers.append(threading.Thread(target=_scrape, args=(run, label)))
                scrapers[-1].start()
        run.returncode = proc.wait(timeout=60)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        for thread in scrapers:
            thread.join(timeout=60)
        if proc.stdout is not None:
            proc.stdout.close()
    run.stdout = "".join(lines)
    return run
