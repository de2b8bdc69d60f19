"""``ferry``'s command line: ``--json`` is honoured wherever the operator puts it."""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Iterator

import pytest

from shared.cli.main import build_parser, parse_args

ANY_ID = str(uuid.UUID(int=7))


def _leaves(
    parser: argparse.ArgumentParser, path: list[str]
) -> Iterator[tuple[list[str], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for action in subs:
        for name, child in action.choices.items():
            yield from _leaves(child, [*path, name])


def _required(parser: argparse.ArgumentParser) -> list[str]:
    """Placeholder values for the command's required arguments."""
    argv: list[str] = []
    for action in parser._actions:
        if not (action.required or not action.option_strings) or action.dest == "help":
            continue
        if action.nargs in ("?", "*"):
            continue
        value = str(next(iter(action.choices))) if action.choices else ANY_ID
        argv += [action.option_strings[0], value] if action.option_strings else [value]
    return argv


COMMANDS = [(path, _required(p)) for path, p in _leaves(build_parser(), [])]


def test_every_command_is_covered() -> None:
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"where", "purge", "dlq list", "registry check", "inbox-backlog"} <= names


@pytest.mark.parametrize(("path", "rest"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_json_before_or_after_the_command(path: list[str], rest: list[str]) -> None:
    parser = build_parser()
    assert parse_args(parser, [*path, *rest]).json is False
    assert parse_args(parser, ["--json", *path, *rest]).json is True
    assert parse_args(parser, [*path, *rest, "--json"]).json is True
