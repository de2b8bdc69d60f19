"""The ``--reason``/``--actor`` arguments of the CLI's audited changes, and the argument
types the subcommands share."""

from __future__ import annotations

import argparse
import getpass
import socket
import uuid
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")


def argument_type(parse: Callable[[str], _T], *errors: type[Exception]) -> Callable[[str], _T]:
    """``parse`` as an argparse ``type``: the ``errors`` it raises become argparse's (their
    text the message)."""

    def convert(text: str) -> _T:
        try:
            return parse(text)
        except errors as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def uuid_argument(what: str) -> Callable[[str], uuid.UUID]:
    """An argparse ``type`` reading a UUID, ``what`` naming it in the error."""

    def convert(text: str) -> uuid.UUID:
        try:
            return uuid.UUID(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} (UUID)") from None

    return convert


def history_count(text: str) -> int:
    """A ``--history`` value: how many latest changes to show, 0 to 1000."""
    if not text.isdigit() or not 0 <= int(text) <= 1000:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count from 0 to 1000")
    return int(text)


def nonblank(text: str) -> str:
    """Any text but blank (an optional ``--actor``, or ``--reason`` where it may be left out)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


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
