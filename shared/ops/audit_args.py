"""The ``--reason``/``--actor`` arguments of the CLI's audited changes."""

from __future__ import annotations

import argparse
import getpass
import socket


def nonempty_reason(text: str) -> str:
    """A ``--reason`` value: anything but blank."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the reason must not be empty")
    return text


def add_audit_args(parser: argparse.ArgumentParser) -> None:
    """``--reason WHY`` (required, not blank) and ``--actor A`` on ``parser``."""
    parser.add_argument("--reason", type=nonempty_reason, required=True, help="why (recorded)")
    parser.add_argument("--actor", help="who (default: OS user@host)")


def actor_of(args: argparse.Namespace) -> str:
    """Who made the change: ``--actor``, else the OS ``user@host``."""
    return str(args.actor or f"{getpass.getuser()}@{socket.gethostname()}")
