"""``ferry handler-models CONTEXT [--out FILE]``: the payload models of a handler service.

For every event the topology (FERRY_TOPOLOGY) sends to CONTEXT — handled by a durable that
targets it — a pydantic model generated from the event's JSON Schema, and the ``MODELS``
and ``SCHEMAS`` tables an SDK :class:`~shared.sdk.Handler` takes
(:mod:`shared.sdk.models`). Without ``--out`` the module is printed. ``--check`` compares
with FILE instead of writing it (exit 1 when it is stale): a CI step for the team. What it
runs is :mod:`shared.ops.handler_models`'s.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from shared.ops.handler_models import models_source, write_models
from shared.runtime.settings import CommonSettings


async def cmd_handler_models(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Print, write or check the models module."""
    return _write(models_source(settings, args.context), args)


def _write(source: str, args: argparse.Namespace) -> int:
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
    status = write_models(source, path, check=args.check)
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
