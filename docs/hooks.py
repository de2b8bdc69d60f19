"""MkDocs hooks: generated reference pages, specification-id links, and staleness checks.

Declared in ``mkdocs.yml`` (``hooks:``). Nothing here imports Ferry: the generators that
do live in ``docs/gen_reference.py``, loaded from beside this file. At build time:

- a line ``<!-- gen:NAME -->`` is replaced by the Markdown ``gen_reference.GENERATORS[NAME]``
  returns (the CLI from its parsers, the settings from their models, ...), and
  ``<!-- gen:spec-ids -->`` by the table of ``docs/spec_ids.yml``;
- every specification id in prose (``PRD-022``, ``REQ-059``, ``INFRA-005`` ...) becomes a
  link to its row on the specification-ids page; an id the table lacks is a warning,
  which ``mkdocs build --strict`` turns into a failed build;
- the metrics page must name every series a ``metrics.py`` declares and every alert of
  ``k8s/base/alerts/`` (warning otherwise).
"""

from __future__ import annotations

import importlib.util
import logging
import posixpath
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from mkdocs.exceptions import PluginError

log = logging.getLogger("mkdocs.plugins.ferry")
HERE = Path(__file__).resolve().parent
SPEC_PAGE = "reference/spec-ids.md"
METRICS_PAGE = "reference/metrics.md"
MARKER = re.compile(r"^<!-- gen:([a-z-]+) -->$", re.M)
SPEC_ID = re.compile(
    r"(?<![\w/#-])((?:PRD|SDS|ADR|INFRA|REQ|INV|POL|EVT|CMD|QRY|PORT)-\d{3}(?:-\d{3})?)(?![\w-])"
)
#: Fenced code, inline code, links and HTML comments: left as they are.
_PROTECTED = re.compile(
    r"```.*?```|`[^`\n]+`|\[[^\]\n]*\]\([^)\n]*\)|<!--.*?-->|^#[^\n]*", re.S | re.M
)

_generators: ModuleType | None = None


def _gen() -> ModuleType:
    global _generators
    if _generators is None:
        root = str(HERE.parent)
        if root not in sys.path:
            sys.path.insert(0, root)
        spec = importlib.util.spec_from_file_location("ferry_docs_gen", HERE / "gen_reference.py")
        assert spec is not None and spec.loader is not None
        _generators = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_generators)
    return _generators


def spec_ids() -> dict[str, dict[str, str]]:
    """``docs/spec_ids.yml``: id → title, document, section."""
    data: dict[str, dict[str, str]] = yaml.safe_load(
        (HERE / "spec_ids.yml").read_text(encoding="utf-8")
    )
    return data


def spec_ids_md() -> str:
    """The table of the specification-ids page, one anchored row per id."""
    rows = ["| id | what it asks, in our words | where |", "|---|---|---|"]
    for key, entry in spec_ids().items():
        where = entry["document"] + (f", {entry['section']}" if entry.get("section") else "")
        rows.append(f'| <span id="{key.lower()}">**{key}**</span> | {entry["title"]} | {where} |')
    return "\n".join(rows) + "\n"


def _expand(markdown: str, src: str) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name == "spec-ids":
            return spec_ids_md()
        generators: dict[str, Any] = _gen().GENERATORS
        if name not in generators:
            raise PluginError(f"{src}: no generator named {name!r} (docs/gen_reference.py)")
        try:
            return str(generators[name]())
        except Exception as exc:
            raise PluginError(f"{src}: generator {name!r} failed: {exc!r}") from exc

    return MARKER.sub(one, markdown)


def _link_ids(markdown: str, src: str) -> str:
    known = spec_ids()
    target = posixpath.relpath(SPEC_PAGE, posixpath.dirname(src) or ".")

    def link(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in known:
            log.warning("%s: specification id %s is not in docs/spec_ids.yml", src, key)
            return key
        return f"[{key}]({target}#{key.lower()})"

    out, last = [], 0
    for protected in _PROTECTED.finditer(markdown):
        out.append(SPEC_ID.sub(link, markdown[last : protected.start()]))
        out.append(protected.group(0))
        last = protected.end()
    out.append(SPEC_ID.sub(link, markdown[last:]))
    return "".join(out)


def alert_names() -> set[str]:
    """Every alert of the shipped Prometheus rule files."""
    names: set[str] = set()
    for path in (HERE.parent / "k8s" / "base" / "alerts").glob("*.y*ml"):
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for group in doc.get("groups", []):
            names |= {rule["alert"] for rule in group.get("rules", []) if "alert" in rule}
    return names


def _check_metrics(markdown: str) -> None:
    missing = sorted(
        name for name in _gen().metric_names() if not re.search(rf"\b{name}(_total)?\b", markdown)
    )
    for name in missing:
        log.warning("%s does not document the series %s", METRICS_PAGE, name)
    for alert in sorted(alert_names()):
        if f"`{alert}`" not in markdown:
            log.warning("%s does not document the alert %s", METRICS_PAGE, alert)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Expand the generated sections, link the specification ids, check the metrics."""
    src = page.file.src_uri
    markdown = _expand(markdown, src)
    if src == METRICS_PAGE:
        _check_metrics(markdown)
    if src != SPEC_PAGE:
        markdown = _link_ids(markdown, src)
    return markdown
