"""``ferry registry generate|check``, ``ferry lint`` and ``ferry asyncapi``.

ferry registry generate [--root DIR]      Ferry's manifests → shared/contracts/registry.json + lock
ferry registry generate --manifests DIR --out FILE
                                          a team's manifests → its registry file + DIR/schemas.lock
ferry registry check [same options]       stale registry, changed locked versions, broken
                                          handler references, gates and lint of every
                                          topology (exit 1 on any finding)
ferry lint [--topology FILE]              what every role runs at start, on one topology
                                          (default FERRY_TOPOLOGY; exit 1 on any finding)
ferry asyncapi [--topology FILE] [--out FILE]
                                          the AsyncAPI 3.0 document of a topology
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from shared.contracts.asyncapi import asyncapi_document
from shared.contracts.codegen import ROOT, Layout, check, generate
from shared.contracts.lint import Problem, PublisherTiming, lint_topology
from shared.contracts.loading import load_topology
from shared.domain.errors import ConfigurationError
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


def layout_of(settings: CommonSettings, args: argparse.Namespace) -> Layout:
    """The layout the options name: a project root, or a team's manifests and registry file."""
    if args.manifests is None:
        if args.topologies or args.topology_files or args.lock or args.out:
            raise ConfigurationError(
                "--topologies, --topology, --lock and --out go with --manifests DIR"
            )
        return Layout.project(Path(args.root) if args.root else ROOT)
    if args.root:
        raise ConfigurationError("--root and --manifests exclude each other")
    out = Path(args.out) if args.out else settings.registry
    if out is None:
        raise ConfigurationError(
            "with --manifests, name the registry file with --out FILE (or FERRY_REGISTRY)"
        )
    return Layout.of(
        Path(args.manifests),
        out,
        topologies=Path(args.topologies) if args.topologies else None,
        topology_files=tuple(Path(p) for p in args.topology_files or ()),
        lock=Path(args.lock) if args.lock else None,
    )


async def cmd_registry_generate(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Regenerate the registry file and extend the schema lock."""
    result = generate(layout_of(settings, args))
    if args.json:
        print(json.dumps({"written": result.written, "locked": result.locked}, indent=2))
        return 0
    for key in result.locked:
        print(f"locked {key}")
    print("\n".join(f"wrote {path}" for path in result.written) or "up to date")
    return 0


async def cmd_registry_check(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Every reason the manifests, lock, generated module or topologies are not releasable."""
    layout = layout_of(settings, args)
    return _print_problems(args, check(layout), "registry, lock and topologies clean")


async def cmd_lint(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Lint one topology as a role would at start (publisher timing from FERRY_* settings)."""
    path = Path(args.topology) if args.topology else settings.topology
    topology = load_topology(path, registry=settings.registry)
    timing = PublisherTiming.of(PublisherSettings())
    problems = lint_topology(topology, source=str(path), publisher=timing)
    return _print_problems(args, problems, f"{path}: clean")


async def cmd_asyncapi(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Write (or print) the AsyncAPI 3.0 document of one topology."""
    path = Path(args.topology) if args.topology else settings.topology
    topology = load_topology(path, registry=settings.registry)
    doc = asyncapi_document(topology, servers=settings.nats_servers())
    text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    if args.out:
        await asyncio.to_thread(Path(args.out).write_text, text, encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``registry generate|check``, ``lint`` and ``asyncapi`` on ``ferry``."""
    registry = sub.add_parser("registry", help="generate or check the handler registry")
    actions = registry.add_subparsers(dest="registry_command", required=True)
    gen = actions.add_parser("generate", help="manifests -> registry file and schema lock")
    gen.set_defaults(func=cmd_registry_generate)
    chk = actions.add_parser("check", help="fail on a stale registry, changed versions, lint")
    chk.set_defaults(func=cmd_registry_check)
    for parser in (gen, chk):
        parser.add_argument(
            "--root", help="a project root holding topologies/ and manifests/ (default: Ferry's)"
        )
        parser.add_argument(
            "--manifests",
            metavar="DIR",
            help="a manifests directory (DIR/<topology>/<context>.yaml) outside Ferry's tree",
        )
        parser.add_argument(
            "--out",
            "--registry",
            dest="out",
            metavar="FILE",
            help="with --manifests: the registry file to write or check (default: FERRY_REGISTRY)",
        )
        parser.add_argument(
            "--topologies",
            metavar="DIR",
            help="with --manifests: directory of the topology files (default: DIR/../topologies)",
        )
        parser.add_argument(
            "--topology",
            dest="topology_files",
            action="append",
            metavar="FILE",
            help="with --manifests: a topology file (repeatable; instead of --topologies)",
        )
        parser.add_argument(
            "--lock",
            metavar="FILE",
            help="with --manifests: the schema lock (default: DIR/schemas.lock)",
        )
    lint = sub.add_parser("lint", help="the configuration lint every role runs at start")
    lint.add_argument("--topology", help="topology file (default: FERRY_TOPOLOGY)")
    lint.set_defaults(func=cmd_lint)
    api = sub.add_parser("asyncapi", help="the AsyncAPI 3.0 document of a topology")
    api.add_argument("--topology", help="topology file (default: FERRY_TOPOLOGY)")
    api.add_argument("--out", metavar="FILE", help="write it to FILE (default: standard output)")
    api.set_defaults(func=cmd_asyncapi)
    for parser in (gen, chk, lint):
        parser.add_argument("--json", action="store_true", help="machine-readable output")
    api.add_argument("--json", action="store_true", help="accepted: the document is JSON anyway")
