"""Reference pages generated from the code at build time (called by ``docs/hooks.py``).

This is the one module of ``docs/`` that imports Ferry: the ``ferry`` parser and every
other command's parser, the pydantic-settings classes, the topology and manifest models,
the lint rules, the ACK table, the exit codes. When code moves, only the imports of this
file change. Each ``*_md()`` function returns Markdown; a page asks for one with a
``<!-- gen:NAME -->`` line.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest.mock import patch

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------- field comments


def field_comments(cls: type) -> dict[str, str]:
    """The ``#:`` comment above each field a class declares itself.

    A field without a comment of its own that directly follows a commented one shares
    it (``retry_initial`` / ``retry_max``: "first and longest back-off").
    """
    comments: dict[str, str] = {}
    pending: list[str] = []
    last = ""
    for line in inspect.getsource(cls).splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        match = re.match(r"^ {4}(\w+)\s*:", line)
        if match and not stripped.startswith("def "):
            name = match.group(1)
            text = " ".join(pending) if pending else _shared(comments, last, name)
            comments[name] = text
            last = name if text else ""
        elif line.startswith("    ") and not line.startswith("        ") and stripped:
            last = ""
        pending = []
    return comments


def _shared(comments: dict[str, str], last: str, name: str) -> str:
    """The previous field's comment when the two names share a prefix (``retry_``)."""
    if not last:
        return ""
    head = last.rsplit("_", 1)[0]
    return comments.get(last, "") if "_" in last and name.startswith(head + "_") else ""


def _unit(info: FieldInfo) -> str:
    """``duration`` or ``size`` when the field parses ``5m`` / ``1GB``, else ""."""
    for item in info.metadata:
        func = getattr(getattr(item, "func", None), "__name__", "")
        if func in ("parse_duration", "parse_size"):
            return "duration" if func == "parse_duration" else "size"
    return ""


def _type_name(info: FieldInfo) -> str:
    unit = _unit(info)
    annotation = info.annotation
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    text = re.sub(
        r"Annotated\[\w+, BeforeValidator\(func=<function parse_(duration|size)[^>]*>[^)]*\)\]",
        r"\1",
        text,
    )
    text = re.sub(r"\b(?:[a-z_]+\.)+([A-Za-z_]\w*)", r"\1", text).replace("NoneType", "None")
    text = re.sub(r"^Optional\[(.*)\]$", r"\1 | None", text)
    if unit:
        return text.replace("float", unit).replace("int", unit)
    return text


def _constraints(info: FieldInfo) -> str:
    words = []
    for item in info.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(item, attr, None)
            if value is not None:
                words.append(f"{sign} {value}")
        if getattr(item, "min_length", None):
            words.append(f"at least {item.min_length} item(s)")
    return ", ".join(words)


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined:
        return "*required*"
    else:
        value = info.default
    if value is None:
        return "unset"
    if isinstance(value, BaseModel):
        return "see below"
    if value == "":
        return '`""`'
    if _unit(info) == "duration" or "parse_duration" in str(info.annotation):
        from shared.contracts.lint import format_duration

        if isinstance(value, list):
            return "`[" + ", ".join(format_duration(v) for v in value) + "]`"
        return f"`{format_duration(value)}`"
    if _unit(info) == "size" and isinstance(value, int):
        return f"`{value:,}` bytes"
    if isinstance(value, float) and _unit(info) == "" and value >= 1000:
        return f"`{value:g}`"
    return _shown(value)


def _shown(value: object) -> str:
    """A default as code; one of Ferry's own files relative to Ferry, wherever it is."""
    from shared.contracts.layout import ROOT

    if isinstance(value, Path) and value.is_absolute() and value.is_relative_to(ROOT):
        return f"Ferry's `{value.relative_to(ROOT)}`"
    return f"`{value}`"


def _cell(text: str) -> str:
    """``text`` for a table cell: pipes escaped, except inside code spans (kept as is)."""
    parts = re.split(r"(`+[^`]*`+)", text.replace("\n", " "))
    return "".join(p if p.startswith("`") else p.replace("|", "\\|") for p in parts)


# ---------------------------------------------------------------- settings


def _settings_classes() -> list[tuple[str, Any]]:
    from services.console.settings import ConsoleSettings
    from services.handlers.settings import HandlerSettings
    from shared.runtime.settings import (
        CommonSettings,
        ConsumerSettings,
        PublisherSettings,
        ReplayerSettings,
        RouterSettings,
    )
    from spark.settings import KpiSettings

    return [
        ("Every role and command", CommonSettings),
        ("outbox-publisher", PublisherSettings),
        ("inbox-consumer", ConsumerSettings),
        ("dlq-router", RouterSettings),
        ("dlq-replayer", ReplayerSettings),
        ("console (`python -m services.console`)", ConsoleSettings),
        ("handler services (`python -m services.handlers`)", HandlerSettings),
        ("KPI job (`python -m spark.kpi_job`)", KpiSettings),
    ]


def _variables(cls: Any, name: str, info: FieldInfo) -> list[str]:
    alias = info.validation_alias
    choices = getattr(alias, "choices", None)
    if choices:
        return [str(c) for c in choices]
    prefix = str(cls.model_config.get("env_prefix", ""))
    return [f"{prefix}{name}".upper()]


def settings_md() -> str:
    """One table per settings class: variables, type, default, constraint, meaning."""
    out: list[str] = []
    for title, cls in _settings_classes():
        own = inspect.get_annotations(cls)
        comments = field_comments(cls)
        out += [f"### {title}", "", f"*{inspect.getdoc(cls)}*", ""]
        out += ["| variable | type | default | meaning |", "|---|---|---|---|"]
        for name, info in cls.model_fields.items():
            if name not in own:
                continue
            names = " / ".join(f"`{v}`" for v in _variables(cls, name, info))
            bounds = _constraints(info)
            meaning = comments.get(name, "") + (f" ({bounds})" if bounds else "")
            out.append(
                f"| {names} | {_cell(_type_name(info))} | "
                f"{_cell(_default(info))} | {_cell(meaning)} |"
            )
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------- models


def _model_md(cls: Any, heading: str) -> list[str]:
    comments: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if isinstance(klass, type) and issubclass(klass, BaseModel) and klass is not BaseModel:
            comments.update(field_comments(klass))
    out = [f"### {heading}", "", inspect.getdoc(cls) or "", ""]
    out += ["| field | type | default | constraint | meaning |", "|---|---|---|---|---|"]
    for name, info in cls.model_fields.items():
        key = info.alias or name
        out.append(
            f"| `{key}` | {_cell(_type_name(info))} | {_cell(_default(info))} | "
            f"{_cell(_constraints(info))} | {_cell(comments.get(name, ''))} |"
        )
    return [*out, ""]


def topology_md() -> str:
    """Every field of a topology file, from its pydantic models."""
    from shared.contracts import topology as t

    models = [
        (t.Topology, "the file (top level)"),
        (t.ContextSpec, "`contexts.<name>`"),
        (t.StreamSpec, "`contexts.<name>.stream`"),
        (t.DurableSpec, "`durables.<name>`"),
        (t.HandlerSpec, "`durables.<name>.handler`"),
        (t.ReplayLimits, "`durables.<name>.replay_limits`"),
        (t.DeadLetterStreamSpec, "`dead_letter_streams[]`"),
    ]
    return "\n".join(line for cls, title in models for line in _model_md(cls, title))


def manifest_md() -> str:
    """Every field of a manifest file, from its pydantic models."""
    from shared.contracts import manifests as m

    models = [
        (m.ManifestFile, "the file (top level)"),
        (m.PublishedEvent, "`publishes[]`"),
        (m.HandledEvent, "`handles[]`"),
    ]
    return "\n".join(line for cls, title in models for line in _model_md(cls, title))


# ---------------------------------------------------------------- command lines


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def capture_parser(entry: Callable[..., Any], *args: Any) -> argparse.ArgumentParser:
    """The parser ``entry`` builds: stopped at its first ``parse_args``, before any work."""

    def stop(self: argparse.ArgumentParser, *_: Any, **__: Any) -> Any:
        raise _Captured(self)

    cls = argparse.ArgumentParser
    try:
        with patch.object(cls, "parse_args", stop), patch.object(cls, "parse_known_args", stop):
            result = entry(*args)
    except _Captured as captured:
        return captured.parser
    if isinstance(result, argparse.ArgumentParser):
        return result
    raise RuntimeError(f"{entry.__qualname__} parsed no arguments")


#: (module, function, arguments) of every command whose parser is documented, in order.
COMMANDS: list[tuple[str, str, tuple[Any, ...]]] = [
    ("shared.cli.main", "build_parser", ()),
    ("services.outbox_publisher.__main__", "main", ([],)),
    ("services.inbox_consumer.__main__", "main", ([],)),
    ("services.dlq_router.__main__", "main", ([],)),
    ("services.dlq_replayer.__main__", "main", ([],)),
    ("services.handlers.__main__", "_parse_args", ([],)),
    ("spark.cli", "parser", ()),
    ("spark.standalone", "parser", ()),
    ("devstack.stack", "main", ([],)),
    ("devstack.demo", "run_demo", ({}, [])),
    ("devstack.__main__", "_build_parser", ()),
    ("k8s.generate", "main", ([],)),
    ("k8s.secrets", "main", ([],)),
    ("chaos.run", "main", ([],)),
    ("chaos.toxiproxy_server", "main", ([],)),
    ("bench.run", "parse_args", ([],)),
]


def _arguments(parser: argparse.ArgumentParser) -> Iterator[str]:
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if action.help == argparse.SUPPRESS:
            continue
        metavar = action.metavar
        shown = " ".join(metavar) if isinstance(metavar, tuple) else metavar
        name = ", ".join(action.option_strings) or (shown or action.dest)
        if action.option_strings and action.nargs != 0:
            name += f" {shown or action.dest.upper()}"
        notes = []
        if action.choices:
            notes.append("one of " + ", ".join(f"`{c}`" for c in action.choices))
        if action.default not in (None, False, argparse.SUPPRESS, []) and action.nargs != 0:
            notes.append(f"default `{action.default}`")
        if action.required and action.option_strings:
            notes.append("required")
        help_text = (action.help or "").replace("%(default)s", str(action.default))
        detail = "; ".join(filter(None, [help_text, *notes]))
        yield f"| `{_cell(str(name))}` | {_cell(detail)} |"


def _parser_md(parser: argparse.ArgumentParser, level: int, summary: str = "") -> list[str]:
    out = ["#" * level + f" `{parser.prog}`", ""]
    if summary or parser.description:
        out += [summary or str(parser.description), ""]
    out += ["```", parser.format_usage().strip(), "```", ""]
    rows = list(_arguments(parser))
    if rows:
        out += ["| argument | meaning |", "|---|---|", *rows, ""]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                out += _parser_md(sub, min(level + 1, 6), helps.get(name, ""))
    return out


def cli_md() -> str:
    """Every command, subcommand and flag, from the parsers themselves."""
    out: list[str] = []
    for module, function, args in COMMANDS:
        entry = getattr(importlib.import_module(module), function)
        out += _parser_md(capture_parser(entry, *args), 3)
    return "\n".join(out)


# ---------------------------------------------------------------- rules and codes


def _docstring_terms(doc: str) -> Iterator[tuple[str, str]]:
    """``name`` / indented-text pairs of a docstring's definition lists."""
    for match in re.finditer(r"^``([a-z-]+(?:`` / ``[a-z-]+)*)``\n((?: {4}.*\n?)+)", doc, re.M):
        yield match.group(1).replace("`` / ``", "`, `"), " ".join(match.group(2).split())


def lint_rules_md() -> str:
    """The lint rules and coverage gates (shared.contracts.lint), then the registry check's own."""
    from shared.contracts import codegen as registry_build
    from shared.contracts import lint

    out = ["| rule | what it refuses and why |", "|---|---|"]
    for name, text in _docstring_terms(lint.__doc__ or ""):
        out.append(f"| `{name}` | {_cell(text)} |")
    out += ["", "`ferry registry check` adds:", "", "| rule | what it refuses |", "|---|---|"]
    for name, text in _docstring_terms(registry_build.__doc__ or ""):
        out.append(f"| `{name}` | {_cell(text.rstrip(';'))} |")
    return "\n".join(out) + "\n"


def ack_table_md() -> str:
    """The ACK decision table, from the docstring of the pure function that decides."""
    from shared.domain import ack

    lines = (ack.__doc__ or "").splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("=====")]
    out = ["| handler outcome | what the consumer does |", "|---|---|"]
    for line in lines[rules[1] + 1 : rules[2]]:
        outcome, decision = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        out.append(f"| {_cell(outcome)} | {_cell(decision)} |")
    return "\n".join(out) + "\n"


def not_replayable_md() -> str:
    """Reason codes the automatic replay holds for an operator."""
    from shared.domain.dead_letter import NOT_REPLAYABLE

    return ", ".join(f"`{code}`" for code in sorted(NOT_REPLAYABLE)) + "\n"


def signing_md() -> str:
    """The signature headers and the default tolerance."""
    from shared.domain import signing

    out = ["| header | value |", "|---|---|"]
    for name, text in re.findall(r"^``([\w-]+)``\s+(.+)$", signing.__doc__ or "", re.M):
        out.append(f"| `{name}` | {_cell(text)} |")
    out += ["", f"Default tolerance: {signing.DEFAULT_TOLERANCE:g} s either side of the clock."]
    return "\n".join(out) + "\n"


def role_exit_codes_md() -> str:
    """The roles' named exit codes."""
    from shared.runtime import lifecycle as runtime

    meaning = {
        "EXIT_OK": "clean stop (SIGTERM, drained in time)",
        "EXIT_CONFIG": "configuration error: settings, topology, lint finding (not retried)",
        "EXIT_CONNECT": "cannot connect, or NATS / PostgreSQL refused the credentials",
        "EXIT_DRAIN_TIMEOUT": "the drain deadline passed with work still in hand",
    }
    out = ["| code | name | meaning |", "|---|---|---|"]
    for name in sorted(meaning, key=lambda n: int(getattr(runtime, n))):
        out.append(f"| {getattr(runtime, name)} | `{name}` | {meaning[name]} |")
    return "\n".join(out) + "\n"


def kpi_exit_codes_md() -> str:
    """The KPI job's exit codes and their meanings (spark.errors.MEANINGS)."""
    from spark.errors import MEANINGS

    rows = [f"| {code} | {_cell(text)} |" for code, text in sorted(MEANINGS.items())]
    return "\n".join(["| code | meaning |", "|---|---|", *rows]) + "\n"


# ---------------------------------------------------------------- metrics


def metric_names() -> set[str]:
    """Every series name declared in a ``metrics.py`` of shared/ or services/."""
    names: set[str] = set()
    pattern = re.compile(r"\"((?:ferry|messaging|http_server)_[a-z0-9_]+)\"")
    for top in ("shared", "services"):
        for path in (ROOT / top).rglob("metrics.py"):
            names |= set(pattern.findall(path.read_text(encoding="utf-8")))
    return names


GENERATORS: dict[str, Callable[[], str]] = {
    "settings": settings_md,
    "topology": topology_md,
    "manifest": manifest_md,
    "cli": cli_md,
    "lint-rules": lint_rules_md,
    "ack-table": ack_table_md,
    "not-replayable": not_replayable_md,
    "signing": signing_md,
    "role-exit-codes": role_exit_codes_md,
    "kpi-exit-codes": kpi_exit_codes_md,
}
