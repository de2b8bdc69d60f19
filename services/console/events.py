"""The console's event pages: search, one event's journey with its trace, the KPI report."""

from __future__ import annotations

import asyncio
import glob
import json
from pathlib import Path
from typing import Any

from aiohttp import web

from shared.ops import where as where_ops
from shared.ops.where_render import render as render_journey

from . import data
from .host import Host
from .jobs import new_message_id
from .views import UserError, plain_name, timeline

#: The KPI job's plots the console serves.
KPI_PLOTS = ("latency.png", "windows.png")


class EventPages:
    """``/event`` and ``/kpi``: where an event is, and what the KPI job last proved."""

    def __init__(self, console: Host) -> None:
        self.console = console
        self.settings, self.topology, self.pools = console.settings, console.topology, console.pools

    def add_routes(self, r: web.UrlDispatcher) -> None:
        """The pages' routes."""
        r.add_get("/event", self.event_search)
        r.add_get("/event/{message_id}", self.event)
        r.add_get("/kpi", self.kpi)
        r.add_get("/kpi/file/{run}/{name}", self.kpi_file)

    async def event_search(self, request: web.Request) -> web.Response:
        text = request.query.get("q", "").strip()
        results: list[dict[str, Any]] = []
        error = None
        if text:
            try:
                results = await data.search_events(self.topology, self.pools, text)
            except ValueError as exc:
                error = str(exc)
            if error is None and len(results) == 1:
                raise web.HTTPSeeOther(f"/event/{results[0]['message_id']}")
            if error is None and not results and data.parse_search(text)[0] == "id":
                # Not in an outbox: maybe only in an inbox, a dead letter or a stream.
                raise web.HTTPSeeOther(f"/event/{data.parse_search(text)[1]}")
        return self.console.render(
            request, "search.html", q=text, results=results, error=error, searched=bool(text)
        )

    async def event(self, request: web.Request) -> web.Response:
        message_id = new_message_id(request.match_info["message_id"])
        # On the console's own connection: one per process, not one per page.
        doc = await where_ops.journey(self.settings, self.topology, message_id, self.console.nc)
        trace = doc.get("trace") or None
        spans: list[dict[str, Any]] = []
        link = None
        if trace:
            spans = await asyncio.to_thread(self._spans, trace["trace_id"])
            link = trace.get("url") or (
                f"{self.settings.console_jaeger_url.rstrip('/')}/trace/{trace['trace_id']}"
                if self.settings.console_jaeger_url
                else None
            )
        return self.console.render(
            request,
            "event.html",
            doc=doc,
            text=render_journey(doc),
            spans=spans,
            trace_link=link,
            spans_configured=bool(self.settings.console_spans_glob),
        )

    def _spans(self, trace_id: str) -> list[dict[str, Any]]:
        """The spans of ``trace_id`` in the exported span files, as timeline rows."""
        pattern = self.settings.console_spans_glob
        if not pattern:
            return []
        wanted = "0x" + trace_id
        found = []
        for path in sorted(glob.glob(pattern))[:50]:
            try:
                with open(path, encoding="utf-8", errors="replace") as lines:
                    for line in lines:
                        if wanted not in line:
                            continue
                        try:
                            span = json.loads(line)
                        except ValueError:
                            continue
                        if span.get("context", {}).get("trace_id") == wanted:
                            found.append(span)
            except OSError:
                continue
        return timeline(found)

    def _kpi_dir(self) -> Path | None:
        base = self.settings.console_kpi_dir
        return None if base is None else base / self.topology.name

    async def kpi(self, request: web.Request) -> web.Response:
        runs = await data.kpi_runs(self.topology, self.pools)
        report = None
        run_name = None
        base = self._kpi_dir()
        if base is not None and (base / "latest" / "report.json").is_file():
            latest = (base / "latest").resolve()
            run_name = latest.name
            try:
                report = json.loads((latest / "report.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                report = None
        plots = []
        if report is not None and run_name is not None and base is not None:
            plots = [n for n in KPI_PLOTS if (base / run_name / n).is_file()]
        return self.console.render(
            request,
            "kpi.html",
            runs=runs,
            report=report,
            run_name=run_name,
            plots=plots,
            kpi_dir_set=base is not None,
        )

    async def kpi_file(self, request: web.Request) -> web.StreamResponse:
        base = self._kpi_dir()
        run, name = request.match_info["run"], request.match_info["name"]
        if base is None or name not in KPI_PLOTS or not plain_name(run):
            raise UserError("no such KPI plot", 404)
        path = base / run / name
        if not path.is_file():
            raise UserError("no such KPI plot", 404)
        return web.FileResponse(path, headers={"Cache-Control": "private, max-age=300"})
