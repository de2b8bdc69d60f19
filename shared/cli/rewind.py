"""``ferry durable rewind``: re-deliver a range of a durable's stream to that durable alone.

    ferry durable rewind [--topology FILE] --durable NAME (--since TIME | --from-seq N)
                         [--until TIME | --until-seq N] [--dry-run] --reason WHY [--actor WHO]

What it does, and how, is :mod:`shared.ops.rewind`'s (:func:`~shared.ops.rewind.rewind`);
this module holds the command: its arguments, a progress line on stderr, the summary.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from shared.adapters.nats import connect_nats
from shared.cli.audit_args import actor_of, argument_type, nonblank
from shared.contracts.loading import load_topology
from shared.domain.errors import MalformedInput
from shared.ops.rewind import rewind
from shared.ops.rewind_range import RewindRange, parse_when
from shared.runtime.settings import CommonSettings

_when = argument_type(parse_when, MalformedInput)


def _seq(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a stream sequence") from None
    if value < 1:
        raise argparse.ArgumentTypeError("a stream sequence is 1 or more")
    return value


class _Meter:
    """A progress line on stderr about once a second."""

    def __init__(self, dry_run: bool, every: float = 1.0) -> None:
        self.began = time.monotonic()
        self.last = self.began
        self.every = every
        self.verb = "counted" if dry_run else "published"

    def __call__(self, done: int, selected: int) -> None:
        now = time.monotonic()
        if now - self.last < self.every:
            return
        self.last = now
        rate = done / max(now - self.began, 1e-9)
        print(f"rewind: {self.verb} {done}/{selected} selected ({rate:,.0f}/s)",
              file=sys.stderr, flush=True)  # fmt: skip


async def cmd_rewind(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Re-deliver a range of the durable's stream to it alone, through its replay subject."""
    topology = (
        load_topology(Path(args.topology), registry=settings.registry)
        if args.topology
        else settings.load_topology()
    )
    topology.durable(args.durable)
    actor = actor_of(args)
    nc = await connect_nats(
        settings.nats_servers(), name="ferry-rewind", auth=settings.nats_auth(), give_up_after=10
    )
    try:
        result = await rewind(
            settings,
            topology,
            nc,
            durable=args.durable,
            span=RewindRange(args.since, args.from_seq, args.until, args.until_seq),
            dry_run=args.dry_run,
            actor=actor,
            reason=args.reason,
            progress=None if args.json else _Meter(args.dry_run),
        )
    finally:
        await nc.close()
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
        return 0
    span = (
        f"sequences {result.first_seq}..{result.last_seq}"
        if result.first_seq is not None
        else "nothing in the range"
    )
    if result.dry_run:
        print(f"dry run {result.rewind_id}: {result.selected} would be re-delivered to "
              f"{result.durable} ({span}, {result.skipped} without an envelope to carry); "
              "nothing published")  # fmt: skip
    else:
        print(f"rewind {result.rewind_id}: {result.published} of {result.selected} selected "
              f"re-delivered to {result.durable} ({span}, {result.skipped} skipped) in "
              f"{result.seconds:.1f}s, {result.rate:,.0f}/s")  # fmt: skip
    for subject, count in result.by_subject.items():
        print(f"  {count:>8}  {subject}")
    return 0


def add_commands(sub: Any) -> argparse.ArgumentParser:
    """Register ``ferry durable rewind`` on the ``ferry`` parser's subcommands."""
    durable: argparse.ArgumentParser | None = getattr(sub, "choices", {}).get("durable")
    if durable is None:  # the group is shared (``ferry durable throttle`` joins it)
        durable = sub.add_parser("durable", help="operations on one durable")
        verbs = durable.add_subparsers(dest="durable_command", required=True)
    else:
        verbs = next(a for a in durable._actions if isinstance(a, argparse._SubParsersAction))
    rw = verbs.add_parser(
        "rewind",
        help="re-deliver a range of the durable's stream to it alone (its inbox counts what "
        "it processed as duplicates)",
    )
    rw.add_argument("--topology", help="topology file (default: FERRY_TOPOLOGY)")
    rw.add_argument("--durable", required=True, help="the durable to re-deliver to")
    # One of them is needed: checked with the range (check_range), exit 2 either way.
    start = rw.add_mutually_exclusive_group()
    start.add_argument(
        "--since",
        type=_when,
        help="from this time: ISO-8601 with a timezone, or a duration ago (2h)",
    )
    start.add_argument("--from-seq", type=_seq, help="from this stream sequence")
    end = rw.add_mutually_exclusive_group()
    end.add_argument("--until", type=_when, help="up to this time (default: now)")
    end.add_argument("--until-seq", type=_seq, help="up to this stream sequence (inclusive)")
    rw.add_argument("--dry-run", action="store_true", help="count what would be re-delivered")
    rw.add_argument("--reason", required=True, type=nonblank, help="why (recorded in the audit)")
    rw.add_argument("--actor", type=nonblank, help="who (default: OS user@host)")
    rw.add_argument("--json", action="store_true", help="machine-readable output")
    rw.set_defaults(func=cmd_rewind)
    return durable
