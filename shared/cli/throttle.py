"""``ferry durable throttle``: change a durable's processing rate limit while it runs.

    ferry durable throttle --durable D --rate 5/s [--burst N] --reason WHY [--actor A]
    ferry durable throttle --durable D --rate none --reason WHY     lift the topology's limit
    ferry durable throttle --durable D --clear --reason WHY          back to the topology's
    ferry durable throttle --durable D                               show what is in force

What an override is, and how the running consumers apply it, is :mod:`shared.ops.throttle`'s;
this module holds the command. A ``criticality: high`` durable is never throttled: the
command refuses it (exit 1).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from shared.cli.audit_args import actor_of, argument_type, history_count, nonblank
from shared.domain.throttle import MAX_BURST, Limit, RateError, format_rate, parse_rate
from shared.ops.throttle import (
    ThrottleRefused,
    ThrottleState,
    check_throttleable,
    clear_throttle,
    set_throttle,
    throttle_state,
    topology_limit,
)
from shared.runtime.settings import CommonSettings

#: ``--rate`` values that lift every limit (the override says: no throttle).
UNLIMITED = ("none", "off", "unlimited")


_rate = argument_type(parse_rate, RateError)


def rate_argument(text: str) -> float | None:
    """``--rate``: ``20/s``, ``300/m``, ``1/h`` (per second), or ``none`` (no limit)."""
    if text.strip().lower() in UNLIMITED:
        return None
    return _rate(text)


def burst_argument(text: str) -> int:
    """``--burst``: a whole number of messages, 1 to MAX_BURST."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"burst {text!r} is not a whole number") from None
    if not 1 <= value <= MAX_BURST:
        raise argparse.ArgumentTypeError(f"burst {value} must be between 1 and {MAX_BURST}")
    return value


def _describe(limit: Limit | None) -> str:
    return limit.describe() if limit is not None else "no limit"


async def cmd_throttle(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Set, clear or show a durable's throttle override."""
    topology = settings.load_topology()
    topology.durable(args.durable)
    changing = args.clear or args.rate is not False
    if changing and not args.reason:
        print("refused: --reason is required to set or clear a throttle", file=sys.stderr)
        return 2
    if args.rate is not False:
        try:
            check_throttleable(topology, args.durable, args.rate)
        except ThrottleRefused as exc:
            print(f"refused: {exc}", file=sys.stderr)
            return 1
    if args.burst is not None and not args.rate:
        print("refused: --burst goes with a --rate", file=sys.stderr)
        return 2
    default = topology_limit(topology, args.durable)
    if args.clear:
        cleared = await clear_throttle(
            settings, topology, args.durable, actor=actor_of(args), reason=args.reason
        )
        note = "" if cleared else " (there was no override)"
        print(f"{args.durable}: override cleared{note}; in force: {_describe(default)} "
              "(topology)")  # fmt: skip
        return 0
    if args.rate is not False:
        limit = await set_throttle(
            settings, topology, args.durable, args.rate, args.burst,
            actor=actor_of(args), reason=args.reason,
        )  # fmt: skip
        print(f"{args.durable}: override set: {_describe(limit)} (topology: "
              f"{_describe(default)}); running consumers apply it within "
              "FERRY_THROTTLE_POLL_INTERVAL")  # fmt: skip
        return 0
    return _show(args, await throttle_state(settings, topology, args.durable, args.history))


def _show(args: argparse.Namespace, state: ThrottleState) -> int:
    default, found, history, in_force = state.default, state.override, state.history, state.in_force
    criticality = state.criticality
    if args.json:
        doc = {
            "durable": args.durable,
            "criticality": criticality,
            "topology": _limit_doc(default),
            "override": None
            if found is None
            else {
                **(_limit_doc(found.limit()) or {"rate_per_second": None}),
                "actor": found.actor,
                "reason": found.reason,
                "set_at": found.set_at.isoformat() if found.set_at else None,
            },
            "in_force": _limit_doc(in_force),
            "source": "override" if found else ("topology" if default else "none"),
            "actions": [{**a, "at": a["at"].isoformat()} for a in history],
        }
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    print(f"{args.durable} (criticality: {criticality})")
    print(f"  topology: {_describe(default)}")
    if found is not None:
        print(f"  override: {_describe(found.limit())}, by {found.actor} at "
              f"{found.set_at:%Y-%m-%d %H:%M:%S}: {found.reason}")  # fmt: skip
    print(f"  in force: {_describe(in_force)}")
    for action in history:
        what = (
            "clear"
            if action["action"] == "clear"
            else "set "
            + (format_rate(action["rate"]) if action["rate"] is not None else "no limit")
        )
        print(f"  {action['at']:%Y-%m-%d %H:%M:%S}  {what:<16} {action['actor']}: "
              f"{action['reason']}")  # fmt: skip
    return 0


def _limit_doc(limit: Limit | None) -> dict[str, Any] | None:
    if limit is None:
        return None
    return {"rate": format_rate(limit.rate), "rate_per_second": limit.rate, "burst": limit.burst}


def durable_verbs(sub: Any) -> Any:
    """The ``ferry durable`` group's verbs: the group another module registered already
    (``ferry durable rewind``, shared/cli/rewind.py), or a new one."""
    top = sub.choices.get("durable") if hasattr(sub, "choices") else None
    if top is None:
        top = sub.add_parser("durable", help="operations on one durable: rewind, throttle")
        return top.add_subparsers(dest="durable_command", required=True)
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return top.add_subparsers(dest="durable_command", required=True)


def add_commands(sub: Any) -> argparse.ArgumentParser:
    """Register ``ferry durable throttle`` (in the ``durable`` group, made if missing)."""
    verbs = durable_verbs(sub)
    cmd: argparse.ArgumentParser = verbs.add_parser(
        "throttle",
        help="set, clear or show a durable's processing rate limit (live, audited)",
        description="Set, clear or show a durable's processing rate limit (INFRA-005 §7.3). "
        "Running consumers apply a change within FERRY_THROTTLE_POLL_INTERVAL seconds, "
        "without a restart; every change is recorded with who, when and why.",
    )
    cmd.add_argument("--durable", required=True, help="the durable")
    what = cmd.add_mutually_exclusive_group()
    what.add_argument(
        "--rate",
        type=rate_argument,
        default=False,
        help="the new limit: 20/s, 300/m, 1/h (none: no limit, the topology's lifted)",
    )
    what.add_argument(
        "--clear", action="store_true", help="remove the override: the topology's value again"
    )
    cmd.add_argument(
        "--burst", type=burst_argument, help="messages in a burst (default: one second's worth)"
    )
    cmd.add_argument("--reason", type=nonblank, help="why (recorded; required to set or clear)")
    cmd.add_argument("--actor", type=nonblank, help="who (default: OS user@host)")
    cmd.add_argument(
        "--history", type=history_count, default=10, help="latest changes shown (default 10)"
    )
    cmd.add_argument("--json", action="store_true", help="machine-readable output")
    cmd.set_defaults(func=cmd_throttle)
    return cmd
