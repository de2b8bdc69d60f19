"""Process plumbing shared by the launchers.

Every server runs in its own session/process group so that ``kill`` can take out the
server *and* its children (PostgreSQL backends) in one signal, the way a machine crash
would, and so that a Ctrl-C in the developer's terminal is not delivered to it twice.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

_POLL_INTERVAL = 0.05
_TAIL_LINES = 40


class ServerError(RuntimeError):
    """A dev/test server failed to start, stop or die within its time limit."""


@dataclass(frozen=True)
class RunAs:
    """An unprivileged account to run a child process as (used when we are root)."""

    name: str
    uid: int
    gid: int
    home: str


@dataclass(frozen=True)
class Spawned:
    """A started server process and where its output goes."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    log_offset: int

    def tail(self) -> str:
        """Return the last lines this process wrote to its log."""
        return log_tail(self.log_path, self.log_offset)


def spawn(
    argv: Sequence[str],
    *,
    log_path: Path,
    cwd: Path,
    run_as: RunAs | None = None,
    env: Mapping[str, str] | None = None,
) -> Spawned:
    """Start ``argv`` in a new process group with stdout+stderr appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        # The header separates restarts in the shared log; the offset lets error
        # messages show only this run's output.
        log.write(f"--- devstack {time.strftime('%Y-%m-%d %H:%M:%S')}: {argv[0]}\n".encode())
        log.flush()
        offset = log.tell()
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=None if env is None else dict(env),
            start_new_session=True,
            user=None if run_as is None else run_as.uid,
            group=None if run_as is None else run_as.gid,
            # Drop root's supplementary groups too, not just the primary one.
            extra_groups=None if run_as is None else [],
        )
    return Spawned(proc=proc, log_path=log_path, log_offset=offset)


def run_checked(
    argv: Sequence[str],
    *,
    timeout: float,
    timed_out: str,
    failed: str,
    input: str | None = None,
) -> str:
    """Run ``argv`` to its end (``input`` on its stdin), its output captured; its stdout.

    Raise :class:`ServerError` saying ``timed_out`` when it outlasts ``timeout`` seconds, or
    ``failed`` and its stderr when it exits non-zero.
    """
    try:
        result = subprocess.run(
            argv, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise ServerError(timed_out) from None
    if result.returncode != 0:
        raise ServerError(f"{failed}: {result.stderr.strip()}")
    return result.stdout


def log_tail(path: Path, offset: int = 0, max_lines: int = _TAIL_LINES) -> str:
    """Return the last ``max_lines`` lines of ``path`` written after byte ``offset``."""
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError as exc:
        return f"<log {path} unreadable: {exc}>"
    lines = data.decode("utf-8", errors="replace").splitlines()
    return "\n".join(lines[-max_lines:]) or "<log is empty>"


def wait_until_ready(
    spawned: Spawned, check: Callable[[], bool], *, timeout: float, what: str
) -> None:
    """Poll ``check`` until it returns True; raise ServerError if the process dies or time runs out.

    ``check`` must itself be bounded (short socket/subprocess timeouts).
    """
    deadline = time.monotonic() + timeout
    while True:
        code = spawned.proc.poll()
        if code is not None:
            raise ServerError(
                f"{what} exited with code {code} before it was ready; "
                f"log {spawned.log_path}:\n{spawned.tail()}"
            )
        if check():
            return
        if time.monotonic() >= deadline:
            raise ServerError(
                f"{what} was not ready after {timeout:.0f}s; "
                f"log {spawned.log_path}:\n{spawned.tail()}"
            )
        time.sleep(_POLL_INTERVAL)


def stop_gracefully(spawned: Spawned, sig: signal.Signals, *, timeout: float, what: str) -> None:
    """Send ``sig`` to the server, wait for it; SIGKILL the group and raise if it hangs."""
    proc = spawned.proc
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_group(spawned, timeout=timeout, what=what)
            raise ServerError(
                f"{what} ignored {sig.name} for {timeout:.0f}s and was killed; "
                f"log {spawned.log_path}:\n{spawned.tail()}"
            ) from None
    # Children normally exit with the parent; make sure no straggler keeps ports or files.
    kill_group(spawned, timeout=timeout, what=what)


def kill_group(spawned: Spawned, *, timeout: float, what: str) -> None:
    """SIGKILL the server's whole process group and wait (bounded) until it is gone."""
    pgid = spawned.proc.pid  # start_new_session=True makes the child its group leader.
    with contextlib.suppress(ProcessLookupError):  # Already gone entirely.
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    try:
        spawned.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise ServerError(f"{what} (pid {pgid}) survived SIGKILL for {timeout:.0f}s") from None
    while _group_alive(pgid):
        if time.monotonic() >= deadline:
            raise ServerError(f"processes of group {pgid} ({what}) survived SIGKILL")
        time.sleep(_POLL_INTERVAL)


def _group_alive(pgid: int) -> bool:
    """True while a non-zombie process of group ``pgid`` exists."""
    proc_root = Path("/proc")
    if not (proc_root / "self" / "stat").exists():
        return _group_signalable(pgid)
    for entry in proc_root.iterdir():
        if entry.name.isdigit() and _stat_in_live_group(entry / "stat", pgid):
            return True
    return False


def _stat_in_live_group(stat_path: Path, pgid: int) -> bool:
    """Parse /proc/PID/stat: is that process in ``pgid`` and not a zombie?"""
    try:
        raw = stat_path.read_text(errors="replace")
    except OSError:
        return False  # The process exited while we were scanning.
    # The command name is in parentheses and may contain spaces; fields follow the last ")".
    fields = raw[raw.rfind(")") + 2 :].split()
    # Orphaned children of a killed server may stay zombies if PID 1 does not reap
    # them; a zombie holds no ports, files or shared memory, so it counts as gone.
    return len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X")


def _group_signalable(pgid: int) -> bool:
    """Fallback without /proc: can the group still receive signals?"""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Served(ABC):
    """A server (or a set of them) as a context manager: started on entry, stopped on exit."""

    @abstractmethod
    def start(self) -> None:
        """Start and wait until it serves."""

    @abstractmethod
    def stop(self) -> None:
        """Stop gracefully; no-op if not running."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class SpawnedServer(Served):
    """One server child process: waited for once spawned, stopped with ``stop_signal``
    (gracefully), or killed with its whole process group (like a power cut)."""

    #: What errors and logs call the server.
    name: ClassVar[str]
    #: The signal of a graceful stop.
    stop_signal: ClassVar[signal.Signals]
    _spawned: Spawned | None
    _start_timeout: float
    _stop_timeout: float

    @abstractmethod
    def _is_ready(self) -> bool:
        """Whether the spawned server answers yet."""

    def _wait_ready(self, where: str) -> None:
        """Wait until the spawned server is ready; killed (and the error raised) if not."""
        assert self._spawned is not None
        try:
            wait_until_ready(
                self._spawned,
                self._is_ready,
                timeout=self._start_timeout,
                what=f"{self.name} on {where}",
            )
        except BaseException:
            self.kill()
            raise

    def stop(self) -> None:
        """Graceful shutdown (``stop_signal``); no-op if not running."""
        if self._spawned is not None:
            spawned, self._spawned = self._spawned, None
            stop_gracefully(spawned, self.stop_signal, timeout=self._stop_timeout, what=self.name)

    def kill(self) -> None:
        """SIGKILL the server's process group, like a power cut; no-op if not running."""
        if self._spawned is not None:
            spawned, self._spawned = self._spawned, None
            kill_group(spawned, timeout=self._stop_timeout, what=self.name)

    def restart(self) -> None:
        """Stop (if running) and start again on the same directories and ports."""
        self.stop()
        self.start()
