"""A Toxiproxy-compatible server: the HTTP API of Shopify's Toxiproxy over :mod:`chaos.proxy`.

``python -m chaos.toxiproxy_server [--port 8474] [--seed N] [--config proxies.json]``

It serves the endpoints Toxiproxy clients (``toxiproxy-python`` among them) call:

=========================================  ==========================================
``GET /version``                           ``{"version": ...}``
``GET /proxies``                           every proxy with its toxics, by name
``POST /proxies``                          create (201); 409 if the name exists
``POST /populate``                         create or replace a list of proxies (201)
``GET /proxies/{p}``                       one proxy; 404 if unknown
``POST|PATCH /proxies/{p}``                update ``enabled`` / ``listen`` / ``upstream``
``DELETE /proxies/{p}``                    stop and delete (204)
``GET /proxies/{p}/toxics``                the proxy's toxics
``POST /proxies/{p}/toxics``               add a toxic (400 bad type/attribute, 409 name)
``GET /proxies/{p}/toxics/{t}``            one toxic
``POST|PATCH /proxies/{p}/toxics/{t}``     update attributes / toxicity
``DELETE /proxies/{p}/toxics/{t}``         remove (204)
``POST /reset``                            enable every proxy, remove every toxic (204)
=========================================  ==========================================

Errors are ``{"error": "...", "status": N}`` naming what is wrong. Everything listens on
loopback only: a non-loopback ``--host`` or proxy ``listen`` address is refused.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from chaos.proxy import AddressError, Proxy, loopback_listen, split_address
from chaos.toxics import ToxicError, ToxicSpec, parse_attributes, parse_toxic, parse_toxicity

log = logging.getLogger("chaos.toxiproxy")

#: What ``GET /version`` reports: this implementation, speaking Toxiproxy's v2 API.
VERSION = "2.0.0-ferry-chaos"
DEFAULT_PORT = 8474

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(Exception):
    """An error answered as ``{"error": message, "status": status}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return web.json_response({"error": exc.message, "status": exc.status}, status=exc.status)
    except (ToxicError, AddressError) as exc:
        return web.json_response({"error": str(exc), "status": 400}, status=400)


async def _body(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return json.loads(raw or b"{}")
    except ValueError as exc:
        raise ApiError(400, f"bad request body: not JSON ({exc})") from None


def _object(doc: Any, what: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ApiError(400, f"bad request body: {what} must be a JSON object")
    return doc


class ToxiproxyServer:
    """The proxies and the HTTP API that manages them, on one event loop."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = DEFAULT_PORT, seed: int | None = None
    ) -> None:
        self.host, self.port = loopback_listen(f"{host}:{port}")
        self.rng = random.Random(seed)
        self.proxies: dict[str, Proxy] = {}
        self._lock = asyncio.Lock()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """Base URL of the HTTP API."""
        return f"http://{self.host}:{self.port}"

    def app(self) -> web.Application:
        """The aiohttp application of the API."""
        app = web.Application(middlewares=[_errors])
        add = app.router.add_route
        add("GET", "/version", self.version)
        add("POST", "/reset", self.reset)
        add("GET", "/proxies", self.list_proxies)
        add("POST", "/proxies", self.create_proxy)
        add("POST", "/populate", self.populate)
        add("GET", "/proxies/{proxy}", self.show_proxy)
        add("POST", "/proxies/{proxy}", self.update_proxy)
        add("PATCH", "/proxies/{proxy}", self.update_proxy)
        add("DELETE", "/proxies/{proxy}", self.delete_proxy)
        add("GET", "/proxies/{proxy}/toxics", self.list_toxics)
        add("POST", "/proxies/{proxy}/toxics", self.create_toxic)
        add("GET", "/proxies/{proxy}/toxics/{toxic}", self.show_toxic)
        add("POST", "/proxies/{proxy}/toxics/{toxic}", self.update_toxic)
        add("PATCH", "/proxies/{proxy}/toxics/{toxic}", self.update_toxic)
        add("DELETE", "/proxies/{proxy}/toxics/{toxic}", self.delete_toxic)
        return app

    async def start(self) -> None:
        """Serve the API (port 0 picks a free one; :attr:`port` then tells which)."""
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise AddressError(f"cannot listen on {self.host}:{self.port}: {exc.strerror}") from exc
        self.port = int(self._runner.addresses[0][1])
        log.info("toxiproxy API on %s", self.url)

    async def stop(self) -> None:
        """Stop every proxy and the API."""
        async with self._lock:
            for proxy in list(self.proxies.values()):
                await proxy.disable()
            self.proxies.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- proxies -----------------------------------------------------------------------

    def _proxy(self, request: web.Request) -> Proxy:
        name = request.match_info["proxy"]
        proxy = self.proxies.get(name)
        if proxy is None:
            raise ApiError(404, f"proxy not found: {name!r}")
        return proxy

    async def version(self, _: web.Request) -> web.Response:
        return web.json_response({"version": VERSION})

    async def list_proxies(self, _: web.Request) -> web.Response:
        return web.json_response({name: p.to_json() for name, p in self.proxies.items()})

    async def show_proxy(self, request: web.Request) -> web.Response:
        return web.json_response(self._proxy(request).to_json())

    async def create_proxy(self, request: web.Request) -> web.Response:
        doc = _object(await _body(request), "a proxy")
        async with self._lock:
            proxy = await self._create(doc)
        return web.json_response(proxy.to_json(), status=201)

    async def _create(self, doc: dict[str, Any]) -> Proxy:
        name, upstream = doc.get("name"), doc.get("upstream")
        if not isinstance(name, str) or not name:
            raise ApiError(400, "missing required field: name")
        if not isinstance(upstream, str) or not upstream:
            raise ApiError(400, f"missing required field: upstream (proxy {name!r})")
        if name in self.proxies:
            raise ApiError(409, f"proxy already exists: {name!r}")
        listen = doc.get("listen") or "127.0.0.1:0"
        if not isinstance(listen, str):
            raise ApiError(400, f"listen must be a string, got {listen!r}")
        enabled = doc.get("enabled", True)
        if not isinstance(enabled, bool):
            raise ApiError(400, f"enabled must be true or false, got {enabled!r}")
        proxy = Proxy(name, listen, upstream, self.rng)
        if enabled:
            try:
                await proxy.enable()
            except AddressError as exc:
                raise ApiError(500, str(exc)) from None
        self.proxies[name] = proxy
        return proxy

    async def populate(self, request: web.Request) -> web.Response:
        docs = await _body(request)
        if not isinstance(docs, list):
            raise ApiError(400, "bad request body: /populate takes a JSON array of proxies")
        done: list[Proxy] = []
        async with self._lock:
            for doc in docs:
                try:
                    done.append(await self._populate_one(_object(doc, "each proxy")))
                except (ApiError, AddressError) as exc:
                    status = exc.status if isinstance(exc, ApiError) else 400
                    message = exc.message if isinstance(exc, ApiError) else str(exc)
                    body = {"error": message, "status": status, "proxies": _dump(done)}
                    return web.json_response(body, status=status)
        return web.json_response({"proxies": _dump(done)}, status=201)

    async def populate_docs(self, docs: list[Any]) -> list[Proxy]:
        """Create or replace each proxy of ``docs`` (what ``-config`` files hold)."""
        async with self._lock:
            return [await self._populate_one(_object(doc, "each proxy")) for doc in docs]

    async def _populate_one(self, doc: dict[str, Any]) -> Proxy:
        existing = self.proxies.get(str(doc.get("name")))
        if existing is not None:
            same_listen = doc.get("listen") in (None, existing.listen)
            if same_listen and doc.get("upstream") == existing.upstream:
                return existing
            await existing.disable()
            del self.proxies[existing.name]
        return await self._create(doc)

    async def update_proxy(self, request: web.Request) -> web.Response:
        proxy = self._proxy(request)
        doc = _object(await _body(request), "a proxy update")
        async with self._lock:
            await self._update(proxy, doc)
        return web.json_response(proxy.to_json())

    async def _update(self, proxy: Proxy, doc: dict[str, Any]) -> None:
        enabled = doc.get("enabled", proxy.enabled)
        if not isinstance(enabled, bool):
            raise ApiError(400, f"enabled must be true or false, got {enabled!r}")
        listen, upstream = doc.get("listen", proxy.listen), doc.get("upstream", proxy.upstream)
        if not isinstance(listen, str) or not isinstance(upstream, str):
            raise ApiError(400, "listen and upstream must be host:port strings")
        if listen != proxy.listen or upstream != proxy.upstream:
            host, port = loopback_listen(listen)
            split_address(upstream, "upstream")
            await proxy.disable()  # changing an address drops every connection
            proxy.host, proxy.port, proxy.upstream = host, port, upstream
        try:
            if enabled:
                await proxy.enable()
            else:
                await proxy.disable()
        except AddressError as exc:
            raise ApiError(500, str(exc)) from None

    async def delete_proxy(self, request: web.Request) -> web.Response:
        proxy = self._proxy(request)
        async with self._lock:
            await proxy.disable()
            self.proxies.pop(proxy.name, None)
        return web.Response(status=204)

    async def reset(self, _: web.Request) -> web.Response:
        async with self._lock:
            for proxy in self.proxies.values():
                for toxic in list(proxy.toxics):
                    await proxy.remove_toxic(toxic)
                try:
                    await proxy.enable()
                except AddressError as exc:
                    raise ApiError(500, str(exc)) from None
        return web.Response(status=204)

    # -- toxics ------------------------------------------------------------------------

    def _toxic(self, proxy: Proxy, request: web.Request) -> ToxicSpec:
        name = request.match_info["toxic"]
        for toxic in proxy.toxics:
            if toxic.name == name:
                return toxic
        raise ApiError(404, f"toxic not found: {name!r} on proxy {proxy.name!r}")

    async def list_toxics(self, request: web.Request) -> web.Response:
        return web.json_response([t.to_json() for t in self._proxy(request).toxics])

    async def show_toxic(self, request: web.Request) -> web.Response:
        proxy = self._proxy(request)
        return web.json_response(self._toxic(proxy, request).to_json())

    async def create_toxic(self, request: web.Request) -> web.Response:
        proxy = self._proxy(request)
        spec = parse_toxic(await _body(request))
        async with self._lock:
            if any(t.name == spec.name for t in proxy.toxics):
                raise ApiError(409, f"toxic already exists: {spec.name!r} on proxy {proxy.name!r}")
            await proxy.add_toxic(spec)
        return web.json_response(spec.to_json())

    async def update_toxic(self, request: web.Request) -> web.Response:
        proxy = self._proxy(request)
        toxic = self._toxic(proxy, request)
        doc = _object(await _body(request), "a toxic update")
        async with self._lock:
            attributes = parse_attributes(toxic.type, doc.get("attributes") or {}, toxic.attributes)
            toxicity = parse_toxicity(doc.get("toxicity", toxic.toxicity))
            toxic.attributes, toxic.toxicity = attributes, toxicity
            await proxy.update_toxic(toxic)
        return web.json_response(toxic.to_json())

    async def delete_toxic(self, request: web.Request) -> web.Response:
        proxy = self._proxy(request)
        toxic = self._toxic(proxy, request)
        async with self._lock:
            await proxy.remove_toxic(toxic)
        return web.Response(status=204)


def _dump(proxies: list[Proxy]) -> list[dict[str, object]]:
    return [p.to_json() for p in proxies]


class ConfigError(Exception):
    """A ``--config`` file that cannot be used; the message names the file and the problem."""


async def populate_from_file(server: ToxiproxyServer, path: Path) -> None:
    """Create the proxies listed in a JSON file (Toxiproxy's ``-config`` format)."""
    try:
        docs = json.loads(await asyncio.to_thread(path.read_text))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read proxies: {exc}") from None
    if not isinstance(docs, list):
        raise ConfigError(f"{path}: expected a JSON array of proxies")
    try:
        await server.populate_docs(docs)
    except (ApiError, AddressError) as exc:
        raise ConfigError(f"{path}: {exc}") from None


@dataclass(frozen=True)
class Endpoint:
    """Where a running server's API answers."""

    host: str
    port: int

    @property
    def url(self) -> str:
        """Base URL of the HTTP API."""
        return f"http://{self.host}:{self.port}"


@contextlib.contextmanager
def serve_in_thread(
    host: str = "127.0.0.1", port: int = 0, seed: int | None = None
) -> Iterator[Endpoint]:
    """Run a server on its own event loop in a thread (for synchronous callers and tests)."""
    loop = asyncio.new_event_loop()
    server = ToxiproxyServer(host, port, seed)
    ready = threading.Event()
    failure: list[BaseException] = []
    stopped = asyncio.Event()

    async def main() -> None:
        try:
            await server.start()
        except BaseException as exc:
            failure.append(exc)
            ready.set()
            return
        ready.set()
        await stopped.wait()
        await server.stop()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    started = ready.wait(timeout=30)
    try:
        if failure:
            raise failure[0]
        if not started:
            raise TimeoutError("the toxiproxy server thread did not start within 30s")
        yield Endpoint(server.host, server.port)
    finally:
        loop.call_soon_threadsafe(stopped.set)
        thread.join(timeout=30)
        loop.close()


async def _serve(args: argparse.Namespace) -> None:
    server = ToxiproxyServer(args.host, args.port, args.seed)
    await server.start()
    if args.config:
        try:
            await populate_from_file(server, Path(args.config))
        except ConfigError:
            await server.stop()
            raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"toxiproxy API listening on {server.url}", flush=True)
    await stop.wait()
    await server.stop()


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m chaos.toxiproxy_server",
        description="Toxiproxy-compatible TCP proxy with the Toxiproxy HTTP API (loopback only).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="API address (loopback only)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="API port (0: any free)")
    parser.add_argument("--seed", type=int, help="seed of the toxicity/jitter dice")
    parser.add_argument("--config", help="JSON array of proxies to create at start")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    try:
        asyncio.run(_serve(args))
    except (AddressError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
