"""A stand-in for an OpenTelemetry collector: accepts OTLP/HTTP traces and counts them.

    python -m bench.otlp_sink --port P

``POST /v1/traces`` (protobuf, optionally gzip) is decoded and its spans counted, then
answered 200 like a collector would; ``GET /stats`` returns the requests, spans and
bytes received so far. Tracing-on measurements export to it, so the roles pay the
whole cost of tracing (spans, batching, encoding, the HTTP export), and the bench can
tell how many spans the sampler let through. Its own CPU is booked separately.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import signal
import sys

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


class Sink:
    """Counts what arrives."""

    def __init__(self) -> None:
        self.requests = 0
        self.spans = 0
        self.bytes = 0
        self.errors = 0

    async def traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.requests += 1
        self.bytes += len(body)
        if request.headers.get("Content-Encoding", "").lower() == "gzip":
            body = gzip.decompress(body)
        message = ExportTraceServiceRequest()
        try:
            message.ParseFromString(body)
        except Exception:  # a malformed export is counted, and refused like a collector would
            self.errors += 1
            return web.Response(status=400)
        self.spans += sum(
            len(scope.spans)
            for resource in message.resource_spans
            for scope in resource.scope_spans
        )
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    async def stats(self, _: web.Request) -> web.Response:
        return web.json_response(
            {"requests": self.requests, "spans": self.spans, "bytes": self.bytes,
             "errors": self.errors}
        )  # fmt: skip


async def serve(port: int) -> None:
    sink = Sink()
    app = web.Application(client_max_size=64 * 1024**2)
    app.router.add_post("/v1/traces", sink.traces)
    app.router.add_get("/stats", sink.stats)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.otlp_sink")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
