"""The dlq-router and the dlq-replayer share one transient-error list and one token
bucket (issue 43): ``shared.adapters.transient`` and ``shared.domain.throttle``."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import nats.errors

from services.dlq_replayer import replayer
from services.dlq_router import router
from shared.adapters.transient import TRANSIENT_ERRORS
from shared.domain.throttle import TokenBucket


def test_router_and_replayer_use_the_one_transient_list() -> None:
    assert router.ERRORS is TRANSIENT_ERRORS and replayer.ERRORS is TRANSIENT_ERRORS
    for error in (
        OSError,
        asyncpg.exceptions.CannotConnectNowError,
        nats.errors.NoServersError,
        nats.errors.TimeoutError,
    ):
        assert issubclass(error, TRANSIENT_ERRORS)


async def test_replays_are_paced_by_the_domain_bucket() -> None:
    bucket = replayer.replay_bucket(4.0)
    assert isinstance(bucket, TokenBucket)
    stop = asyncio.Event()
    started = time.monotonic()
    for _ in range(4):  # one second's worth is saved up
        assert await replayer.take_token(bucket, stop)
    assert time.monotonic() - started < 0.2
    assert await replayer.take_token(bucket, stop)  # the fifth waits for a refill
    assert time.monotonic() - started >= 0.2


async def test_a_stop_ends_the_wait_for_a_token() -> None:
    bucket = replayer.replay_bucket(0.1)
    stop = asyncio.Event()
    assert await replayer.take_token(bucket, stop)
    asyncio.get_running_loop().call_later(0.05, stop.set)
    started = time.monotonic()
    assert not await replayer.take_token(bucket, stop)
    assert time.monotonic() - started < 2.0
