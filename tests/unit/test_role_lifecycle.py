"""The one role lifecycle (issue 43): the drain deadline and exit codes of ``serve`` and
``run_role``, for roles with a health server and for those answering health on their own
port (the console, the handler services)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from devstack.ports import free_port
from shared.domain.errors import ConfigurationError, TransientError
from shared.runtime import loop
from shared.runtime.lifecycle import (
    EXIT_CONFIG,
    EXIT_CONNECT,
    EXIT_DRAIN_TIMEOUT,
    EXIT_OK,
    run_role,
    serve,
)
from shared.runtime.settings import CommonSettings


def _listening(port: int) -> bool:
    """Whether something holds ``port`` (binding it fails; no connection is made)."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


async def test_the_work_drains_after_stop_within_the_deadline() -> None:
    stop, drained = asyncio.Event(), asyncio.Event()

    async def work(inner: asyncio.Event) -> None:
        await inner.wait()
        await asyncio.sleep(0.05)
        drained.set()

    asyncio.get_running_loop().call_later(0.05, stop.set)
    code = await serve(
        settings=CommonSettings(), work=work, checks={}, stop=stop, drain_deadline=5.0
    )
    assert code == EXIT_OK and drained.is_set()


async def test_a_drain_past_the_deadline_exits_4() -> None:
    stop = asyncio.Event()

    async def work(inner: asyncio.Event) -> None:
        await inner.wait()
        await asyncio.sleep(30)

    stop.set()
    code = await serve(
        settings=CommonSettings(), work=work, checks={}, stop=stop, drain_deadline=0.1
    )
    assert code == EXIT_DRAIN_TIMEOUT


async def test_without_a_health_server_the_role_serves_its_own_port() -> None:
    port = free_port()
    settings = CommonSettings(health_port=port)
    seen: list[bool] = []

    async def work(inner: asyncio.Event) -> None:
        seen.append(_listening(port))

    for health_server in (False, True):
        await serve(
            settings=settings, work=work, checks={}, stop=asyncio.Event(), drain_deadline=5.0,
            health_server=health_server,
        )  # fmt: skip
    assert seen == [False, True]
    assert not _listening(port)


async def test_an_error_of_the_work_reaches_the_caller_and_the_health_server_stops() -> None:
    port = free_port()

    async def work(inner: asyncio.Event) -> None:
        raise ConfigurationError("bad")

    with pytest.raises(ConfigurationError):
        await serve(
            settings=CommonSettings(health_port=port), work=work, checks={},
            stop=asyncio.Event(), drain_deadline=5.0,
        )  # fmt: skip
    assert not _listening(port)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (None, EXIT_OK),
        (ConfigurationError("bad setting"), EXIT_CONFIG),
        (TransientError("the database failed"), EXIT_CONNECT),
    ],
)
def test_run_role_makes_errors_exit_codes(
    error: Exception | None, code: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The process-wide garbage-collector policy stays the test process's own.
    monkeypatch.setattr(loop, "freeze", lambda: None)
    monkeypatch.setattr(loop, "tune_gc", lambda threshold: None)

    async def run(settings: CommonSettings, stop: asyncio.Event) -> int:
        if error is not None:
            raise error
        return EXIT_OK

    assert run_role("test-role", CommonSettings(), run) == code
