"""``ferry handler-check URL --durable NAME``: does a handler service keep the contract?

The conformance test a team runs in its own CI against its handler (docs: Handler
contract); the calls, how each answer is judged and the report are
:mod:`shared.ops.handler_check`'s. This module holds the command: its arguments, the
``--payload`` files, the report printed (``--json``: as JSON).

Exit codes: 0 every answer conforms, 1 at least one breach, 2 the handler (or the effect
database) cannot be reached, or a usage or configuration error.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from shared.domain.errors import ConfigurationError
from shared.ops.handler_check import EXIT_UNREACHABLE, CheckOptions, check_handler
from shared.ops.handler_check_calls import DEFAULT_STALE_SECONDS
from shared.ops.handler_check_send import Unreachable
from shared.runtime.settings import CommonSettings

#: The options :class:`CheckOptions` takes as the command line gives them.
_AS_GIVEN = ("stale_seconds", "timeout", "effect_sql", "effect_dsn", "batch")


def add_command(sub: Any) -> None:
    """Register ``ferry handler-check`` on the ``ferry`` parser's subcommands."""
    check = sub.add_parser(
        "handler-check",
        help="conformance test of a handler service: signed calls as the durable's consumer "
        "sends them (a valid event, a redelivery, poison, unknown events, forged and stale "
        "signatures), each answer judged against the handler contract; exit 0 all conform, "
        "1 a breach, 2 unreachable or usage",
    )
    check.add_argument("url", help="the handler's URL (e.g. http://127.0.0.1:8101/handle)")
    check.add_argument(
        "--durable", required=True, help="the durable whose calls to send (its events, secret)"
    )
    check.add_argument(
        "--event",
        action="append",
        metavar="TYPE.vN",
        help="check only this event (repeatable; default: every event the durable accepts)",
    )
    check.add_argument(
        "--payload",
        action="append",
        metavar="TYPE.vN=FILE",
        help="a JSON file holding a valid payload of TYPE.vN, sent instead of one built from "
        "the schema (repeatable)",
    )
    check.add_argument(
        "--timeout",
        type=float,
        help="seconds each call may take (default: the durable's handler timeout)",
    )
    check.add_argument(
        "--stale-seconds",
        type=float,
        default=DEFAULT_STALE_SECONDS,
        help="how old the expired-timestamp call's signature is (default 3600; must exceed "
        "the handler's FERRY_SIGNATURE_TOLERANCE)",
    )
    check.add_argument(
        "--effect-sql",
        metavar="SQL",
        help="a query over the handler's database whose result changes when an event is "
        "applied (e.g. SELECT count(*) FROM my_table): run around every call, so a second "
        "effect of the redelivery, or any effect of a refused call, is a breach",
    )
    check.add_argument(
        "--effect-dsn",
        metavar="DSN",
        help="the database of --effect-sql (default: the durable's target context database)",
    )
    check.add_argument(
        "--batch",
        action="store_true",
        help="also send batch calls (for a durable with handler.batch >= 2): unsigned, "
        "signed, and the same events again; each must be answered 200 with one result per "
        "event",
    )
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.set_defaults(func=cmd_handler_check)


def read_payloads(items: list[str] | None) -> dict[str, dict[str, Any]]:
    """``TYPE.vN=FILE`` options as event name → payload."""
    found: dict[str, dict[str, Any]] = {}
    for item in items or ():
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ConfigurationError(f"--payload {item!r}: write TYPE.vN=FILE")
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigurationError(
                f"--payload {name}: cannot read {path}: {exc.strerror}"
            ) from None
        except ValueError as exc:
            raise ConfigurationError(f"--payload {name}: {path} is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise ConfigurationError(f"--payload {name}: {path} must hold a JSON object")
        found[name] = doc
    return found


async def cmd_handler_check(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Run the checks; print the report."""
    try:
        options = CheckOptions(
            only=args.event,
            payloads=read_payloads(args.payload),
            **{name: getattr(args, name) for name in _AS_GIVEN},
        )
        report = await check_handler(settings, args.url, args.durable, options)
    except Unreachable as exc:
        print(json.dumps({"error": str(exc)}) if args.json else f"ferry: {exc}")
        return EXIT_UNREACHABLE
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.render())
    return report.exit_code()
