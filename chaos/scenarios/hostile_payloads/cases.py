"""Hostile payloads, written as a user would: ``INSERT INTO outbox_events`` in plain SQL.

The producer API's checks are bypassed, so everything PostgreSQL accepts reaches the
publisher. Each case is one event of ``model_published.v1`` (``sea`` → ``vibespro``),
``name`` carrying the hostile part unless said otherwise:

* multi-byte text (2, 3 and 4 UTF-8 bytes a character) whose payload JSON is exactly a
  size limit, or a few bytes under or over it — the dead-letter record's body limit
  (64 KiB), the producer's payload limit (1 MiB - 64 KiB), the stream's and the
  consumer's message limit and the handler's body limit (1 MiB) — plus the issue's
  300,000 Cyrillic characters;
* deep nesting (an extra property nested 1,000 and 20,000 arrays deep);
* huge numbers (an integer of 5,000 digits, 1e400, a 4,301-digit negative);
* a NUL byte (``\\u0000``: jsonb refuses it, so the INSERT fails and nothing was committed:
  *refused at the source*), and a NUL in ``aggregate_id`` (text refuses it too);
* lone surrogates (``\\ud800`` in the JSON text; the same as a Python string parameter):
  refused at the source as well;
* an undeclared event type and an event version no manifest knows.

:func:`expectation` says what a correct Ferry must make of each case: ``processed``
(a valid event whose envelope fits every limit), or ``any`` (processed or dead-lettered
with a reason code, or set aside by the publisher with a reason).
"""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass

import asyncpg

from chaos.engine.workload import Intent, Ledger
from shared.adapters.postgres import DATABASE_ERRORS

#: The plain INSERT a user writes (the columns SDS-047 documents).
PLAIN_INSERT = (
    "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, event_version,"
    " payload) VALUES ($1::uuid, $2, $3, $4, $5, $6::jsonb)"
)
#: (name, bytes) of every size limit on the way.
LIMITS: tuple[tuple[str, int], ...] = (
    ("dlq_body", 64 * 1024),
    ("producer", 1024 * 1024 - 64 * 1024),
    ("message", 1024 * 1024),
)
#: Bytes around each limit: under, at, over.
OFFSETS = (-16, 0, 16)
#: One character of each UTF-8 width.
WIDE_CHARS = {2: "Ж", 3: "語", 4: "😀"}
#: Where the hostile events go.
CONTEXT, DURABLE, EVENT_TYPE, VERSION = "sea", "vibespro__from_sea", "model_published", 1
#: What goes wrong in PostgreSQL or the client when a value cannot be stored.
REFUSALS: tuple[type[BaseException], ...] = (
    *DATABASE_ERRORS,
    asyncpg.DataError,
    UnicodeEncodeError,
    ValueError,
)


@dataclass(frozen=True)
class Case:
    """One hostile event: its JSON text as INSERTed and what must become of it."""

    name: str
    payload_text: str
    aggregate_id: str = "model-hostile"
    event_type: str = EVENT_TYPE
    version: int = VERSION
    #: ``processed`` or ``any`` (see the module docstring).
    expect: str = "any"

    @property
    def size(self) -> int:
        """UTF-8 bytes of the payload JSON as written."""
        return len(self.payload_text.encode("utf-8", "surrogatepass"))


def _sized_payload(width: int, target: int) -> str:
    """Compact payload JSON of exactly ``target`` UTF-8 bytes, ``name`` multi-byte text."""
    frame = json.dumps({"model_id": "m-sized", "name": ""}, separators=(",", ":"))
    room = target - len(frame.encode())
    chars, pad = divmod(room, width)
    name = WIDE_CHARS[width] * chars + "a" * pad
    text = json.dumps(
        {"model_id": "m-sized", "name": name}, separators=(",", ":"), ensure_ascii=False
    )
    assert len(text.encode()) == target, (width, target)
    return text


def _with_extra(extra_json: str) -> str:
    return '{"model_id":"m-extra","name":"extra","extra":' + extra_json + "}"


def size_cases(widths: tuple[int, ...]) -> list[Case]:
    """Multi-byte text at and around every size limit."""
    cases = []
    for limit_name, limit in LIMITS:
        for width in widths:
            for offset in OFFSETS:
                target = limit + offset
                # Valid and small enough for a 1 MiB envelope: must be processed.
                expect = "processed" if target <= LIMITS[1][1] else "any"
                cases.append(
                    Case(
                        f"text{width}B@{limit_name}{offset:+d}",
                        _sized_payload(width, target),
                        expect=expect,
                    )
                )
    name = json.dumps({"model_id": "m-cyr", "name": "Ж" * 300_000}, ensure_ascii=False)
    cases.append(Case("cyrillic-300000", name, expect="processed"))
    return cases


def odd_cases() -> list[Case]:
    """Nesting, numbers, NUL, lone surrogates, undeclared types and versions."""
    return [
        Case("nested-1000", _with_extra("[" * 1000 + "]" * 1000)),
        Case("nested-20000", _with_extra("[" * 20_000 + "]" * 20_000)),
        Case("integer-5000-digits", _with_extra("9" * 5000)),
        Case("integer-4301-digits-negative", _with_extra("-" + "1" * 4301)),
        Case("number-1e400", _with_extra("1e400")),
        Case("number-tiny", _with_extra("1e-400")),
        Case("nul-in-json", '{"model_id":"m-nul","name":"a\\u0000b"}'),
        Case("nul-in-aggregate", '{"model_id":"m-nul2","name":"n"}', aggregate_id="a\x00b"),
        Case("lone-surrogate-escaped", '{"model_id":"m-s","name":"x\\ud800y"}'),
        Case("lone-surrogate-raw", '{"model_id":"m-s2","name":"x\ud800y"}'),
        Case("low-surrogate-first", '{"model_id":"m-s3","name":"\\udc00\\ud800"}'),
        Case(
            "paired-surrogates", '{"model_id":"m-s4","name":"\\ud83d\\ude00"}', expect="processed"
        ),
        Case(
            "controls-and-bidi",
            json.dumps({"model_id": "m-c", "name": "\u202e\u2028\x1f\x7f"}),
            expect="processed",
        ),
        Case("aggregate-multibyte-8k", '{"model_id":"m-a","name":"a"}', aggregate_id="語" * 8000),
        Case("undeclared-type", '{"x":1}', event_type="model_vanished"),
        Case("unknown-version", '{"model_id":"m-v","name":"v"}', version=999),
    ]


def catalogue(rounds: int = 1, widths: tuple[int, ...] = (2, 3, 4)) -> list[Case]:
    """Every case, ``rounds`` times (each round its own ids and aggregates)."""
    base = size_cases(widths) + odd_cases()
    out = []
    for r in range(rounds):
        for n, case in enumerate(base):
            name = case.name if rounds == 1 else f"{case.name}#{r}"
            aggregate = f"{case.aggregate_id}/{r}/{n}"  # each case its own aggregate
            out.append(
                Case(name, case.payload_text, aggregate, case.event_type, case.version, case.expect)
            )
    return out


def train(followers: int) -> list[Case]:
    """A row over the stream's limit, then ``followers`` valid rows of its aggregate.

    The followers must wait behind it (order), and must not starve other aggregates.
    """
    head = Case(
        "train-head-over-limit",
        _sized_payload(2, LIMITS[2][1] + 4096),
        aggregate_id="hostile-train",
    )
    tail = [
        Case(
            f"train-follower-{n}",
            json.dumps({"model_id": f"m-t{n}", "name": f"t{n}"}),
            aggregate_id="hostile-train",
        )
        for n in range(followers)
    ]
    return [head, *tail]


@dataclass
class SqlOutcome:
    """What the INSERT of one case did."""

    case: Case
    intent: Intent
    refused: str = ""


async def insert_case(conn: asyncpg.Connection, case: Case, intent: Intent) -> str:
    """INSERT one case in its own transaction; '' when committed, else why it was refused."""
    try:
        async with conn.transaction():
            await conn.execute(
                PLAIN_INSERT,
                intent.id,
                "model",
                case.aggregate_id,
                case.event_type,
                case.version,
                case.payload_text,
            )
    except REFUSALS as exc:
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return ""


def intent_for(case: Case, rng: random.Random, due: float) -> Intent:
    """The ledger entry of one case (``klass`` is the case name)."""
    return Intent(
        id=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        context=CONTEXT,
        durable=DURABLE,
        event_type=case.event_type,
        version=case.version,
        klass=case.name,
        aggregate_id=case.aggregate_id,
        payload={},
        due=due,
    )


async def insert_all(dsn: str, cases: list[Case], ledger: Ledger, seed: int) -> list[SqlOutcome]:
    """INSERT every case (one transaction each); mark each committed or refused."""
    rng = random.Random(f"hostile-payloads-{seed}")
    outcomes = []
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        for n, case in enumerate(cases):
            intent = intent_for(case, rng, float(n))
            ledger.mark([intent], "pending")
            refused = await insert_case(conn, case, intent)
            ledger.mark([intent], "refused" if refused else "committed")
            outcomes.append(SqlOutcome(case, intent, refused))
    finally:
        await conn.close()
    return outcomes
