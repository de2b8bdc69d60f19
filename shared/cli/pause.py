"""``ferry durable pause|resume``: stop and restart deliveries to a durable, audited.

    ferry durable pause  --durable D --reason WHY [--until 2h|2026-11-29T17:00:00Z] [--actor A]
    ferry durable resume --durable D --reason WHY [--actor A]
    ferry durable pause  --durable D --status            show the pause in force and its history

What a pause is (JetStream's consumer pause on every consumer of the durable) and what it
keeps (nothing lost, no delivery spent) is :mod:`shared.ops.pause`'s; this module holds
the commands. Exit 1 when some consumer did not take the change (named; run it again).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from shared.adapters.nats import connect_nats
from shared.cli.audit_args import actor_of, argument_type, history_count, nonblank
from shared.cli.throttle import durable_verbs
from shared.domain.errors import MalformedInput
from shared.domain.pause import describe_until, parse_until
from shared.ops.pause import PauseIncomplete, PauseState, pause_durable, pause_state, resume_durable
from shared.runtime.settings import CommonSettings

_until = argument_type(parse_until, MalformedInput)


async def _connected(settings: CommonSettings, name: str) -> Any:
    return await connect_nats(
        settings.nats_servers(), name=name, auth=settings.nats_auth(), give_up_after=10
    )


async def cmd_pause(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Pause a durable, or show its pause (``--status``)."""
    topology = settings.load_topology()
    topology.durable(args.durable)
    if not args.status and not args.reason:
        print("refused: --reason is required to pause (or give --status to look)", file=sys.stderr)
        return 2
    nc = await _connected(settings, "ferry-pause")
    try:
        if args.status:
            return _show(
                args, await pause_state(settings, topology, nc, args.durable, args.history)
            )
        try:
            state = await pause_durable(
                settings, topology, nc, args.durable, args.until,
                actor=actor_of(args), reason=args.reason,
            )  # fmt: skip
        except PauseIncomplete as exc:
            print(f"incomplete: {exc}", file=sys.stderr)
            return 1
    finally:
        await nc.close()
    print(f"{args.durable}: paused {describe_until(state.until)} on {len(state.consumers)} "
          "consumer(s); nothing is delivered or redelivered until then, and what its "
          "consumers hold is finished as usual")  # fmt: skip
    return 0


async def cmd_resume(settings: CommonSettings, args: argparse.Namespace) -> int:
    """End a durable's pause."""
    topology = settings.load_topology()
    topology.durable(args.durable)
    nc = await _connected(settings, "ferry-resume")
    try:
        before = await pause_state(settings, topology, nc, args.durable, 1)
        try:
            state = await resume_durable(
                settings, topology, nc, args.durable, actor=actor_of(args), reason=args.reason
            )
        except PauseIncomplete as exc:
            print(f"incomplete: {exc}", file=sys.stderr)
            return 1
    finally:
        await nc.close()
    note = "" if before.paused or before.partly else " (it was not paused)"
    print(f"{args.durable}: resumed on {len(state.consumers)} consumer(s){note}")
    return 0


def _show(args: argparse.Namespace, state: PauseState) -> int:
    if args.json:
        doc = {
            "durable": state.durable,
            "paused": state.paused,
            "partly_paused": state.partly,
            "until": state.until.isoformat() if state.paused and state.until else None,
            "consumers": [
                {
                    "name": c.name,
                    "paused": c.paused,
                    "until": c.until.isoformat() if c.until else None,
                    "error": c.error,
                }
                for c in state.consumers
            ],
            "actions": [
                {
                    **a,
                    "at": a["at"].isoformat(),
                    "until": a["until"].isoformat() if a["until"] else None,
                }
                for a in state.history
            ],
        }
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    if state.unknown:
        print(f"{state.durable}: JetStream did not answer for {', '.join(state.unknown)}: "
              "paused or not there is unknown")  # fmt: skip
    if state.paused:
        who = state.set_by
        by = f", by {who['actor']} at {who['at']:%Y-%m-%d %H:%M:%S}: {who['reason']}" if who else ""
        print(f"{state.durable}: paused {describe_until(state.until)}{by}")
    elif state.partly:
        print(f"{state.durable}: PARTLY paused (a change did not finish: pause or resume again)")
    else:
        print(f"{state.durable}: not paused")
    for c in state.consumers:
        shown = c.error or (f"paused {describe_until(c.until)}" if c.paused else "running")
        print(f"  {c.name}: {shown}")
    for a in state.history:
        what = f"pause {describe_until(a['until'])}" if a["action"] == "pause" else "resume"
        print(f"  {a['at']:%Y-%m-%d %H:%M:%S}  {what:<36} {a['actor']}: {a['reason']}")
    return 0


def add_commands(sub: Any) -> None:
    """Register ``ferry durable pause`` and ``ferry durable resume``."""
    verbs = durable_verbs(sub)
    pause = verbs.add_parser(
        "pause",
        help="stop deliveries to a durable (JetStream's consumer pause; audited)",
        description="Pause every consumer of a durable (each partition's, together): nothing "
        "is delivered or redelivered, no delivery is spent, messages wait in the stream. "
        "What a consumer already holds is finished as usual. Ends at --until, or when "
        "resumed.",
    )
    pause.add_argument("--durable", required=True, help="the durable")
    pause.add_argument(
        "--until", type=_until, help="when it ends by itself: 2h, 30m, or an ISO time with zone"
    )
    pause.add_argument("--status", action="store_true", help="show the pause; change nothing")
    pause.add_argument("--history", type=history_count, default=10, help="latest changes shown")
    pause.set_defaults(func=cmd_pause)
    resume = verbs.add_parser(
        "resume",
        help="end a durable's pause at once (audited)",
        description="Resume every consumer of a paused durable: deliveries start again at once.",
    )
    resume.add_argument("--durable", required=True, help="the durable")
    resume.set_defaults(func=cmd_resume, reason=None)
    for cmd in (pause, resume):
        cmd.add_argument("--reason", type=nonblank, required=cmd is resume,
                         help="why (recorded; required to change)")  # fmt: skip
        cmd.add_argument("--actor", type=nonblank, help="who (default: OS user@host)")
        cmd.add_argument("--json", action="store_true", help="machine-readable output")
