"""``--every``: run the job at a fixed interval, forever, without restart loops.

Each run is a child process (``python -m spark.kpi_job`` with the same options), so its
JVM and memory are gone when it ends. A run that fails (a breach, an unreachable
database) is logged with its exit code and the loop waits for the next slot; the loop
itself only ends on SIGTERM/SIGINT, stopping a run in progress first. Runs start at
``k·interval + grace`` (plus a second), when the window that just closed is complete.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from datetime import UTC, datetime
from types import FrameType

from spark.errors import EXIT_OK
from spark.settings import KpiSettings
from spark.windows import next_run

log = logging.getLogger("ferry.kpi.schedule")

#: Seconds a run in progress gets to stop after SIGTERM (< supervisord's stopwaitsecs 30).
CHILD_STOP_TIMEOUT = 20.0
#: Margin after the grace period before a scheduled run starts.
START_MARGIN = 1.0


def run_forever(
    settings: KpiSettings, argv: list[str], *, stop: threading.Event | None = None
) -> int:
    """Loop until stopped; return 0 (a stop on request is a clean exit)."""
    assert settings.kpi_every is not None
    stop = stop or _stop_on_signals()
    every = round(settings.kpi_every)
    offset = (settings.kpi_grace + START_MARGIN) % every
    while not stop.is_set():
        now = datetime.now(UTC)
        moment = next_run(now, every, offset)
        log.info("next KPI run scheduled", extra={"at": moment.isoformat()})
        if stop.wait((moment - now).total_seconds()):
            break
        code = run_child(argv, stop)
        log.info("KPI run finished", extra={"exit_code": code})
    log.info("scheduler stopped")
    return EXIT_OK


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handle(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    return stop


def run_child(argv: list[str], stop: threading.Event) -> int:
    """One run as a child process group; stopped (TERM, then KILL) when ``stop`` is set."""
    child = subprocess.Popen([sys.executable, "-m", "spark.kpi_job", *argv], start_new_session=True)
    while True:
        try:
            return child.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            if stop.is_set():
                return _terminate(child)


def _terminate(child: subprocess.Popen[bytes]) -> int:
    log.info("stopping the KPI run in progress", extra={"pid": child.pid})
    os.killpg(child.pid, signal.SIGTERM)
    try:
        return child.wait(timeout=CHILD_STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        return child.wait(timeout=10)
