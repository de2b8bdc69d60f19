"""A hostile handler: ``python -m chaos.scenarios.hostile_handler.front --port P --upstream URL
--seed S``.

It stands between one durable's inbox-consumer and the real handler service and answers
every ``POST /handle`` in one of these ways, drawn from the seed, the message ids the call
carries and the number of calls seen for each (a per-message call carries one id, so its
answers do not depend on arrival order; a batch call, header ``Ferry-Batch``, carries the
ids of its events):

``pass``        forward to the real handler and relay its answer faithfully;
``status``      answer 401, 403, 408, 413, 429 or 500-504 itself (the real handler is
                not called), with a Retry-After of some kind (0, nan, inf, -1, huge,
                an HTTP-date, garbage, empty) and a body of some kind (JSON, non-UTF-8
                bytes, a multi-megabyte body, none);
``replaced``    forward (the effect may be applied), then answer a 5xx instead;
``trickle``     forward, then send the real answer a few bytes at a time, slowly;
``reset``       forward, then send the real answer's headers and half its body and reset
                the connection (TCP RST).

Every call is forwarded as the consumer sent it (body bytes and every header but the
hop-by-hop ones: the signature, ``Ferry-Batch``, ``Idempotency-Key``, ``traceparent``).

Every answer is appended to ``--log`` as one JSON line per event of the call (``at``,
``message_id``, ``call`` number of that id, ``action``, ``status``, ``upstream`` status,
``retry_after``, ``body``, ``batch``: the call's size, ``index``: the event's place in
it). ``status`` is what that event got: for ``pass`` of a batch call its own result in
the upstream's answer (``"missing"`` when the answer has no usable result for it), else
the status sent for the whole call. The chaos scenario counts the faults from it, and a
forwarded call whose answer was spoiled explains the redelivery (answered 409 by the
real handler) that follows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import random
import socket
import struct
import time
from collections import Counter
from email.utils import formatdate
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from shared.domain.batch_call import BATCH_HEADER

#: (action, weight) of each call; ``pass`` keeps the workload progressing.
ACTIONS: tuple[tuple[str, int], ...] = (
    ("pass", 55),
    ("status", 30),
    ("replaced", 5),
    ("trickle", 5),
    ("reset", 5),
)
#: Statuses the ``status`` action answers, with weights (413 dead-letters: kept rare).
STATUSES: tuple[tuple[int, int], ...] = (
    (401, 6),
    (403, 6),
    (408, 10),
    (413, 2),
    (429, 16),
    (500, 12),
    (501, 6),
    (502, 12),
    (503, 18),
    (504, 12),
)
#: Retry-After kinds: a name and how to render it (``None``: no header).
RETRY_AFTER_KINDS = (
    "none",
    "0",
    "nan",
    "inf",
    "-1",
    "huge",
    "http_date",
    "past_date",
    "garbage",
    "empty",
    "fraction",
)
#: Body kinds of a self-made answer.
BODY_KINDS = ("json", "non_utf8", "huge", "none")
#: Size of a ``huge`` body.
HUGE_BODY = 3 * 1024 * 1024
#: Seconds between the pieces of a trickled answer, and bytes per piece.
TRICKLE_PAUSE, TRICKLE_PIECE = 0.15, 4
#: Upstream call timeout (longer than any handler timeout the chaos world sets).
UPSTREAM_TIMEOUT = 30.0
#: Headers not copied from the consumer's request to the real handler.
HOP_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})


def retry_after_value(kind: str, rng: random.Random) -> str | None:
    """The Retry-After header of ``kind`` (None: send none)."""
    now = time.time()
    values: dict[str, str | None] = {
        "none": None,
        "0": "0",
        "nan": "nan",
        "inf": "inf",
        "-1": "-1",
        "huge": "99999999999999999999",
        "http_date": formatdate(now + rng.uniform(0.5, 2.0), usegmt=True),
        "past_date": formatdate(now - 3600, usegmt=True),
        "garbage": rng.choice(("soon", "1;2", "0x10", "3 seconds", "1e309")),
        "empty": "",
        "fraction": f"{rng.uniform(0.1, 0.9):.3f}",
    }
    return values[kind]


def body_of(kind: str, status: int, rng: random.Random) -> tuple[bytes, str]:
    """(body, content type) of a self-made answer."""
    if kind == "json":
        text = json.dumps({"error": "hostile", "status": status, "detail": "Ж" * 40})
        return text.encode(), "application/json"
    if kind == "non_utf8":
        return bytes(rng.randrange(0x80, 0x100) for _ in range(200)), "text/plain; charset=utf-8"
    if kind == "huge":
        return b'{"error": "' + b"x" * HUGE_BODY + b'"}', "application/json"
    return b"", "application/octet-stream"


class Decider:
    """Draws each call's answer from the seed, the call's message ids and their call
    numbers."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.calls: Counter[str] = Counter()

    def rng_for(self, message_id: str) -> tuple[random.Random, int]:
        """A generator for this call of ``message_id``, and the call number (1-based)."""
        rng, calls = self.rng_for_call([message_id])
        return rng, calls[0]

    def rng_for_call(self, message_ids: list[str]) -> tuple[random.Random, list[int]]:
        """A generator for a call carrying ``message_ids`` (a batch call's events), and
        the call number of each id (1-based); the same ids in another order draw the same."""
        numbers = []
        for message_id in message_ids:
            self.calls[message_id] += 1
            numbers.append(self.calls[message_id])
        parts = sorted(f"{mid}/{call}" for mid, call in zip(message_ids, numbers, strict=True))
        key = hashlib.sha256(f"{self.seed}/{'|'.join(parts)}".encode()).digest()
        return random.Random(int.from_bytes(key[:8], "big")), numbers

    @staticmethod
    def action(rng: random.Random) -> str:
        """Which action this call gets."""
        names = [name for name, _ in ACTIONS]
        return rng.choices(names, [weight for _, weight in ACTIONS])[0]


def message_id_of(body: bytes) -> str:
    """The envelope's ``message_id`` (or ``?`` when the body is not a JSON object)."""
    try:
        doc: Any = json.loads(body)
    except ValueError:
        return "?"
    return str(doc.get("message_id", "?")) if isinstance(doc, dict) else "?"


def batch_ids_of(body: bytes) -> list[str]:
    """The ``message_id`` of each event of a batch call (``?`` for an unreadable event;
    one ``?`` when the body is not a batch document)."""
    try:
        doc: Any = json.loads(body)
    except ValueError:
        return ["?"]
    events = doc.get("events") if isinstance(doc, dict) else None
    if not isinstance(events, list) or not events:
        return ["?"]
    return [str(e.get("message_id", "?")) if isinstance(e, dict) else "?" for e in events]


def batch_statuses(status: int, answer: bytes, ids: list[str]) -> list[int | str]:
    """What each event of a forwarded batch call got from the upstream's answer: its own
    result's status when the answer is a 200 with exactly one result for it, the call's
    status when the answer is not a 200, else ``"missing"`` (the consumer retries it)."""
    if status != 200:
        return [status] * len(ids)
    try:
        doc: Any = json.loads(answer)
    except ValueError:
        return ["missing"] * len(ids)
    results = doc.get("results") if isinstance(doc, dict) else None
    found: dict[str, list[Any]] = {}
    for entry in results if isinstance(results, list) else []:
        if isinstance(entry, dict):
            found.setdefault(str(entry.get("id")), []).append(entry.get("status"))
    out: list[int | str] = []
    for message_id in ids:
        got = found.get(message_id, [])
        ok = len(got) == 1 and isinstance(got[0], int) and not isinstance(got[0], bool)
        out.append(got[0] if ok else "missing")
    return out


class Hostile:
    """The application's state: the upstream session, the decider and the answer log."""

    def __init__(self, upstream: str, seed: int, log_path: Path) -> None:
        self.upstream, self.decider, self.log_path = upstream, Decider(seed), log_path
        self.session: aiohttp.ClientSession | None = None

    async def start(self, _: web.Application) -> None:
        """Open the upstream session."""
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=UPSTREAM_TIMEOUT))

    async def stop(self, _: web.Application) -> None:
        """Close the upstream session."""
        if self.session is not None:
            await self.session.close()

    def record(
        self, ids: list[str], calls: list[int], statuses: list[int | str], **fields: Any
    ) -> None:
        """Append one answer to the log: one line per event of the call."""
        at, size = round(time.time(), 3), len(ids)
        lines = [
            json.dumps(
                {
                    "at": at,
                    "message_id": message_id,
                    "call": call,
                    **fields,
                    "status": status,
                    "batch": size,
                    "index": index,
                }
            )
            + "\n"
            for index, (message_id, call, status) in enumerate(
                zip(ids, calls, statuses, strict=True)
            )
        ]
        with self.log_path.open("a") as out:
            out.write("".join(lines))

    async def forward(self, request: web.Request, body: bytes) -> tuple[int, bytes, str]:
        """(status, body, content type) of the real handler's answer to the same request."""
        assert self.session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        async with self.session.post(self.upstream, data=body, headers=headers) as resp:
            return resp.status, await resp.read(), resp.headers.get("Content-Type", "")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """One call (see the module docstring)."""
        body = await request.read()
        batch = request.headers.get(BATCH_HEADER) is not None
        ids = batch_ids_of(body) if batch else [message_id_of(body)]
        rng, calls = self.decider.rng_for_call(ids)
        action = self.decider.action(rng)

        def record(status: int | list[int | str], **fields: Any) -> None:
            statuses: list[int | str] = status if isinstance(status, list) else [status] * len(ids)
            self.record(ids, calls, statuses, action=action, **fields)

        if action == "status":
            return self._self_made(rng, record)
        try:
            status, answer, content_type = await self.forward(request, body)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            record(502, upstream=None, error=type(exc).__name__)
            return web.Response(status=502, text=f"upstream: {type(exc).__name__}")
        if action == "pass":
            record(batch_statuses(status, answer, ids) if batch else status, upstream=status)
            return web.Response(status=status, body=answer, content_type=_mime(content_type))
        if action == "replaced":
            replaced = rng.choice((500, 502, 503, 504))
            record(replaced, upstream=status)
            return web.Response(status=replaced, text="replaced by the hostile handler")
        if action == "trickle":
            record(status, upstream=status)
            # A few bytes per event each pause: a batch answer trickles as slowly per
            # event as a per-message one (not 50 times slower).
            piece = TRICKLE_PIECE * len(ids)
            return await _trickle(request, status, answer, content_type, piece)
        record(status, upstream=status, reset=True)
        return await _reset_mid_body(request, status, answer, content_type)

    def _self_made(self, rng: random.Random, record: Any) -> web.Response:
        status = rng.choices([s for s, _ in STATUSES], [w for _, w in STATUSES])[0]
        ra_kind, body_kind = rng.choice(RETRY_AFTER_KINDS), rng.choice(BODY_KINDS)
        retry_after = retry_after_value(ra_kind, rng)
        body, content_type = body_of(body_kind, status, rng)
        headers = {} if retry_after is None else {"Retry-After": retry_after}
        if status == 401:
            headers["WWW-Authenticate"] = 'Ferry-HMAC realm="handle"'
        record(status, retry_after=ra_kind, body=body_kind)
        response = web.Response(status=status, body=body, headers=headers)
        response.content_type = content_type.split(";")[0]
        if "charset" in content_type:
            response.charset = "utf-8"
        return response


def _mime(content_type: str) -> str:
    return content_type.split(";")[0].strip() or "application/json"


async def _trickle(
    request: web.Request, status: int, body: bytes, content_type: str, piece: int = TRICKLE_PIECE
) -> web.StreamResponse:
    response = web.StreamResponse(status=status)
    response.content_type = _mime(content_type)
    response.content_length = len(body)
    await response.prepare(request)
    for start in range(0, len(body), piece):
        await response.write(body[start : start + piece])
        await asyncio.sleep(TRICKLE_PAUSE)
    await response.write_eof()
    return response


async def _reset_mid_body(
    request: web.Request, status: int, body: bytes, content_type: str
) -> web.StreamResponse:
    response = web.StreamResponse(status=status)
    response.content_type = _mime(content_type)
    response.content_length = max(len(body), 2)
    await response.prepare(request)
    await response.write(body[: len(body) // 2])
    transport = request.transport
    if transport is not None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    return response


def make_app(upstream: str, seed: int, log_path: Path) -> web.Application:
    """The hostile application (``POST /handle``, ``GET /healthz``)."""
    hostile = Hostile(upstream, seed, log_path)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/handle", hostile.handle)
    app.router.add_get("/healthz", _healthz)
    app.on_startup.append(hostile.start)
    app.on_cleanup.append(hostile.stop)
    return app


async def _healthz(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "handler": "hostile"})


def read_log(path: Path) -> list[dict[str, Any]]:
    """Every answer the hostile handler logged (none if it never answered)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m chaos.scenarios.hostile_handler.front")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the real handler's /handle URL")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log", type=Path, required=True, help="JSON lines, one per event")
    args = parser.parse_args(argv)
    args.log.parent.mkdir(parents=True, exist_ok=True)
    app = make_app(args.upstream, args.seed, args.log)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
