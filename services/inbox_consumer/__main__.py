"""``python -m services.inbox_consumer [--durable NAME]``: settings, the composition root
(:mod:`.wiring`), and the role's lifecycle."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from shared.runtime.lifecycle import run_role, serve
from shared.runtime.logs import configure_logging
from shared.runtime.settings import ConsumerSettings

from .wiring import ROLE, wire
from .wiring import accepted_events as accepted_events
from .wiring import ordering_keys as ordering_keys

log = logging.getLogger("ferry.inbox_consumer")


async def run(settings: ConsumerSettings, stop: asyncio.Event) -> int:
    """Consume until ``stop``, then finish the batch in hand inside the drain deadline."""
    wired = await wire(settings, stop)
    try:
        # Unacked messages of a drain that times out are redelivered after ack_wait.
        return await serve(
            settings=settings,
            work=wired.work,
            checks=wired.checks,
            stop=stop,
            drain_deadline=settings.drain_deadline + settings.fetch_timeout,
            metrics=wired.metrics,
        )
    finally:
        await wired.close()
        log.info("stopped", extra={"processed": wired.stats.processed})


def main(argv: list[str] | None = None) -> int:
    """Entry point; ``--durable`` overrides FERRY_DURABLE."""
    parser = argparse.ArgumentParser(prog="python -m services.inbox_consumer")
    parser.add_argument("--durable", help="durable to consume (default: FERRY_DURABLE)")
    args = parser.parse_args(argv)
    settings = ConsumerSettings(**({"durable": args.durable} if args.durable else {}))
    configure_logging(ROLE, settings.log_level)
    return run_role(ROLE, settings, run)


if __name__ == "__main__":
    sys.exit(main())
