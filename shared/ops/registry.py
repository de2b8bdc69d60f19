"""``ferry registry generate|check`` and ``ferry lint``: the registry build and the lint.

    ferry registry generate [--root DIR]   manifests → shared/contracts/generated_registry.py + lock
    ferry registry check [--root DIR]      stale registry, changed locked versions, broken
                                           handler references, gates and lint of every
                                           topology (exit 1 on any finding)
    ferry lint [--topology FILE]           what every role runs at start, on one topology
                                           (default FERRY_TOPOLOGY; exit 1 on any finding)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from shared.contracts.codegen import ROOT, check, generate
from shared.contracts.lint import Problem, PublisherTiming, lint_topology
from shared.contracts.loading import load_topology
from shared.runtime.settings import CommonSettings, PublisherSettings


def _print_problems(args: argparse.Namespace, problems: list[Problem], clean: str) -> int:
    if args.json:
        print(json.dumps([vars_of(p) for p in problems], indent=2))
    elif problems:
        print("\n".join(str(p) for p in problems))
        print(f"{len(problems)} finding(s)")
    else:
        print(clean)
    return 1 if problems else 0


def vars_of(problem: Problem) -> dict[str, str]:
    """A finding as a JSON object."""
    return {
        "source": problem.source,
        "field": problem.field,
        "rule": problem.rule,
        "message": problem.message,
    }


async def cmd_registry_generate(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Regenerate the registry module and extend the schema lock."""
    result = generate(Path(args.root))
    if args.json:
        print(json.dumps({"written": result.written, "locked": result.locked}, indent=2))
        return 0
    for key in result.locked:
        print(f"locked {key}")
    print("\n".join(f"wrote {path}" for path in result.written) or "up to date")
    return 0


async def cmd_registry_check(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Every reason the manifests, lock, generated module or topologies are not releasable."""
    return _print_problems(args, check(Path(args.root)), "registry, lock and topologies clean")


async def cmd_lint(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Lint one topology as a role would at start (publisher timing from FERRY_* settings)."""
    path = Path(args.topology) if args.topology else settings.topology
    topology = load_topology(path)
    timing = PublisherTiming.of(PublisherSettings())
    problems = lint_topology(topology, source=str(path), publisher=timing)
    return _print_problems(args, problems, f"{path}: clean")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``registry generate|check`` and ``lint`` on ``ferry``'s subcommands."""
    registry = sub.add_parser("registry", help="generate or check the handler registry")
    actions = registry.add_subparsers(dest="registry_command", required=True)
    gen = actions.add_parser("generate", help="manifests -> generated module and schema lock")
    gen.set_defaults(func=cmd_registry_generate)
    chk = actions.add_parser("check", help="fail on a stale registry, changed versions, lint")
    chk.set_defaults(func=cmd_registry_check)
    for parser in (gen, chk):
        parser.add_argument("--root", default=str(ROOT), help="project root (default: this one)")
    lint = sub.add_parser("lint", help="the configuration lint every role runs at start")
    lint.add_argument("--topology", help="topology file (default: FERRY_TOPOLOGY)")
    lint.set_defaults(func=cmd_lint)
    for parser in (gen, chk, lint):
        parser.add_argument("--json", action="store_true", help="machine-readable output")
