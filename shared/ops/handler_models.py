"""``ferry handler-models CONTEXT [--out FILE]``: the payload models of a handler service.

For every event the topology (FERRY_TOPOLOGY) sends to CONTEXT — handled by a durable that
targets it — a pydantic model generated from the event's JSON Schema, and the ``MODELS``
and ``SCHEMAS`` tables an SDK :class:`~shared.sdk.Handler` takes
(:mod:`shared.sdk.models`). Without ``--out`` the module is printed. ``--check`` compares
with FILE instead of writing it (exit 1 when it is stale): a CI step for the team.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from shared.runtime.settings import CommonSettings
from shared.sdk.models import EventSchema, generate_models
from shared.sdk.topology_events import handled_events


def models_source(settings: CommonSettings, context: str) -> str:
    """The generated module for ``context`` under the configured topology."""
    topology = settings.load_topology()
    topology.context(context)
    events = [
        EventSchema(key[0], key[1], event.payload_schema or {}, event.description or "")
        for key, event in handled_events(topology, context).items()
    ]
    return generate_models(events, source=f"topology {topology.name!r}, context {context!r}")


async def cmd_handler_models(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Print, write or check the models module."""
    return write_models(models_source(settings, args.context), args)


def write_models(source: str, args: argparse.Namespace) -> int:
    """Print ``source``, write it to ``--out`` or (``--check``) compare it with that file.

    With ``--json`` the answer is one JSON object: the module (``{"module": ...}``), or
    what became of the file (``{"path": ..., "status": "written" | "up_to_date" |
    "stale"}``)."""
    as_json = bool(getattr(args, "json", False))
    if args.out is None:
        if as_json:
            print(json.dumps({"module": source}))
        else:
            sys.stdout.write(source)
        return 0
    path = Path(args.out)
    if args.check:
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        status = "up_to_date" if current == source else "stale"
    else:
        path.write_text(source, encoding="utf-8")
        status = "written"
    if as_json:
        print(json.dumps({"path": str(path), "status": status}))
    elif status == "stale":
        print(f"{path}: stale; run ferry handler-models {args.context} --out {path}")
    elif status == "up_to_date":
        print(f"{path}: up to date")
    else:
        print(f"wrote {path}")
    return 1 if status == "stale" else 0


def add_commands(sub: Any) -> argparse.ArgumentParser:
    """Register ``ferry handler-models`` on the ``ferry`` parser's subcommands."""
    cmd: argparse.ArgumentParser = sub.add_parser(
        "handler-models",
        help="pydantic models (and schemas) of the payloads a context's handler receives",
    )
    cmd.add_argument("context", help="the context whose handler service receives the events")
    cmd.add_argument("--out", help="write the module here (default: print it)")
    cmd.add_argument("--check", action="store_true", help="with --out: exit 1 if it is stale")
    cmd.add_argument("--json", action="store_true", help="machine-readable output")
    cmd.set_defaults(func=cmd_handler_models)
    return cmd
