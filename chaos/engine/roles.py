"""Ferry's roles as child processes the chaos run starts, SIGKILLs and restarts.

A role that exits without having been killed on purpose is restarted (as supervisord
would) and the exit is recorded: under chaos a role should ride faults out, not die of
them.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Seconds a role gets to stop after SIGTERM before it is SIGKILLed.
STOP_TIMEOUT = 20.0
#: What each kind of role logs once it serves.
READY_LINES = {
    "handler": "serving on",
    "publisher": "publishing context",
    "consumer": '"consuming ',
    "router": "routing advisories",
}


@dataclass
class Exit:
    """A role process that ended without being told to."""

    at: float
    role: str
    code: int | None
    log_tail: str


@dataclass
class Role:
    """One role process: how to start it, and what happened to it."""

    name: str
    kind: str  # publisher | consumer | handler | router
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    #: Durables whose handler calls this role's faults can make redundant.
    durables: frozenset[str] = frozenset()
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    kills: int = 0
    unexpected: list[Exit] = field(default_factory=list)
    #: True while the run keeps it down on purpose (between a kill and its restart).
    held_down: bool = False

    def start(self) -> None:
        """Start the process (its output goes to its log file)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            log.write(f"--- start #{self.starts + 1} at {time.time():.3f}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv, cwd=ROOT, env=self.env, stdout=log, stderr=log, start_new_session=True
            )
        self.starts += 1
        self.held_down = False

    @property
    def alive(self) -> bool:
        """Whether the process is running."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        """Process id of the current process, if any."""
        return None if self.proc is None else self.proc.pid

    def kill(self) -> None:
        """SIGKILL, like a node dying; the role stays down until :meth:`start`."""
        self.held_down = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=STOP_TIMEOUT)
            self.kills += 1

    def stop(self) -> None:
        """SIGTERM (drain), SIGKILL if it does not stop in time."""
        self.held_down = True
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT)

    def check_exit(self, now: float) -> Exit | None:
        """An unexpected exit since the last check, if the process died by itself."""
        if self.held_down or self.proc is None or self.proc.poll() is None:
            return None
        code = self.proc.returncode
        self.proc = None
        exit_ = Exit(now, self.name, code, self.log_tail())
        self.unexpected.append(exit_)
        return exit_

    def log_tail(self, chars: int = 1500) -> str:
        """The end of the role's log."""
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""


def role_env(base: dict[str, str], **settings: str) -> dict[str, str]:
    """The parent's environment without its FERRY_ settings, plus ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    env.update(base)
    env.update(settings)
    return env


#: A log line naming an exception (``SomeError: what``), not asyncio's leak notices.
_CAUSE = re.compile(r"\b([A-Z]\w*(?:Error|Exception|Exit))\b:? ?([^\"\\]{0,100})")


def exit_causes(roles: list[Role]) -> Counter[str]:
    """``role: the last exception its log names`` for each run of a role that ended by
    itself (the log's ``--- start #N`` sections, one per process)."""
    causes: Counter[str] = Counter()
    for role in roles:
        if not role.unexpected:
            continue
        try:
            text = role.log_path.read_text(errors="replace")
        except OSError:
            continue
        sections = re.split(r"^--- start #\d+ at [\d.]+$", text, flags=re.M)[1:]
        for section in sections[: len(role.unexpected)]:
            found = [m for m in _CAUSE.finditer(section) if "Unclosed" not in m.group(0)]
            cause = "(no exception)"
            if found:
                what = found[-1].group(2).split(" in position")[0].strip(" {,")
                what = re.sub(r"0x[0-9a-f]+|\b\d{2,}\b", "N", " ".join(what.split()))
                cause = f"{found[-1].group(1)}: {what[:100]}"
            causes[f"{role.name}: {cause}"] += 1
    return causes
