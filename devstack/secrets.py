"""Secrets of the local stack: one handler-signing secret per durable, in files.

Written once into ``<var>/secrets`` (directory 0700, files 0600) and kept across restarts,
so a running handler and a restarted consumer still agree. Programs get the *paths*
(``FERRY_HANDLER_SECRET_FILE``, ``FERRY_HANDLER_SECRETS_FILE``), never the values, so no
secret appears in the environment, in ``stack.env``, in supervisord's logs or in ps.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from shared.contracts.topology import Topology


def secrets_dir(var_dir: Path) -> Path:
    """Where the stack keeps its secrets."""
    return var_dir / "secrets"


def durable_secret_file(var_dir: Path, durable: str) -> Path:
    """The file a consumer of ``durable`` signs with."""
    return secrets_dir(var_dir) / f"handler-secret-{durable}"


def handler_secrets_file(var_dir: Path, context: str) -> Path:
    """The JSON file (durable → secret) the handler service of ``context`` verifies with."""
    return secrets_dir(var_dir) / f"handler-secrets-{context}.json"


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)


def write_handler_secrets(var_dir: Path, topologies: list[Topology]) -> None:
    """Create missing durable secrets and (re)write each handler service's map."""
    folder = secrets_dir(var_dir)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    by_context: dict[str, dict[str, str]] = {}
    for topology in topologies:
        for name, durable in sorted(topology.durables.items()):
            path = durable_secret_file(var_dir, name)
            if not path.exists():
                _write_private(path, secrets.token_urlsafe(32))
            value = path.read_text(encoding="utf-8").strip()
            by_context.setdefault(durable.target, {})[name] = value
    for context, table in by_context.items():
        _write_private(handler_secrets_file(var_dir, context), json.dumps(table, sort_keys=True))
