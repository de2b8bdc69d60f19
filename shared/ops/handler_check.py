"""``ferry handler-check URL --durable NAME``: does a handler service keep the contract?

The conformance test a team runs in its own CI against its handler (docs: Handler
contract). It sends the handler calls built as the durable's inbox-consumer builds them —
the envelope, ``delivery``, ``Idempotency-Key``, a ``traceparent``, signed with the
durable's secret (``FERRY_HANDLER_SECRET`` or ``_FILE``, the consumer's own setting) —
and judges each answer:

=================  ==========================================  ==========================
check              sent                                        the contract's answer
=================  ==========================================  ==========================
unsigned           a valid event, no signature headers         401
bad-signature      signed with another secret                  401
altered-body       signed, then the payload changed            401
expired-timestamp  signed ``--stale-seconds`` ago              401
normal             a valid event of each type the durable      2xx (applied)
                   accepts
duplicate          the same event again (attempt 2)            409, or 2xx with no second
                                                               effect
poison             a payload its schema refuses                422
unknown-version    a known type in a version the durable       422
                   does not accept
unknown-type       a type no manifest declares                 422
=================  ==========================================  ==========================

The valid payload is the schema's first valid ``examples`` entry, a file given with
``--payload TYPE.vN=FILE``, or one built from the schema (:mod:`shared.contracts.samples`);
every call but the duplicate carries a fresh message id and fresh values.

Effects are invisible over HTTP. With ``--effect-sql`` (a query over the handler's own
database, ``--effect-dsn``, by default the durable's target context database) the query
runs before and after every call: the normal event must change its result and no other
call may. Without it, a 2xx to the duplicate is reported ``unverified``, not a breach.

With ``--batch`` (for a durable with ``handler.batch`` >= 2) three batch calls follow
(:mod:`shared.domain.batch_call`), each carrying a valid event of every type and a poison
one: unsigned (401), signed (200 with one well-formed result per event: 2xx for the valid
ones, 422 for the poison, the effect changed) and the same events again (409, or 2xx
without a second effect, for each valid one).

Each answer is also shown as what the consumer would do with it (ack, retry,
dead-letter, hold). Exit codes: 0 every answer conforms, 1 at least one breach, 2 the
handler (or the effect database) cannot be reached, or a usage or configuration error.
"""

from __future__ import annotations

import argparse
import json
import secrets
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import aiohttp
import asyncpg

from shared.adapters.postgres import connect, redact
from shared.contracts.events import AcceptedEvents
from shared.contracts.samples import SampleError, poison_payload, sample_payload
from shared.contracts.topology import DurableSpec, EventSpec, Topology
from shared.domain.ack import (
    Ack,
    DeadLetter,
    HandlerFailure,
    HandlerResponse,
    Nak,
    Outcome,
    RetryPolicy,
    body_retryable,
    decide,
)
from shared.domain.batch_call import (
    ANSWER_LIMIT,
    BatchAnswer,
    MalformedAnswer,
    batch_document,
    batch_headers,
    read_batch_answer,
)
from shared.domain.envelope import Envelope, payload_digest, wire_json
from shared.domain.errors import ConfigurationError, TransientError
from shared.domain.handler_call import request_body, request_headers
from shared.domain.retry_after import parse_retry_after
from shared.domain.signing import sign
from shared.runtime.settings import CommonSettings, ConsumerSettings

Command = Callable[[CommonSettings, argparse.Namespace], Coroutine[Any, Any, int]]

#: Exit codes of the command.
EXIT_CONFORMS, EXIT_BREACH, EXIT_UNREACHABLE = 0, 1, 2
#: Seconds before now an expired-timestamp call is signed (beyond any sane tolerance).
DEFAULT_STALE_SECONDS = 3600.0
#: Most bytes of an answer's body read (as the consumer reads them).
BODY_READ_LIMIT = 2000
#: Characters of an answer's body shown in the report.
DETAIL_SHOWN = 300
#: The event type the unknown-type check sends (no manifest may declare it).
UNKNOWN_TYPE = "ferry_handler_check_unknown"
#: The signing secret of the bad-signature check (never any durable's).
WRONG_SECRET = b"ferry-handler-check-wrong-secret"

Verdict = Literal["conforms", "breach", "unverified"]
Signing = Literal["valid", "none", "wrong-secret", "altered", "expired"]
#: The checks a handler must refuse (401), each with how its call is signed.
AUTH_SIGNING: tuple[tuple[str, Signing], ...] = (
    ("unsigned", "none"),
    ("bad-signature", "wrong-secret"),
    ("altered-body", "altered"),
    ("expired-timestamp", "expired"),
)
AUTH_CHECKS = tuple(check for check, _ in AUTH_SIGNING)
#: The contract's answer per check, as shown in the report.
EXPECTED = {
    **dict.fromkeys(AUTH_CHECKS, "401"),
    "normal": "2xx",
    "duplicate": "409, or 2xx with no second effect",
    "poison": "422",
    "unknown-version": "422",
    "unknown-type": "422",
}
#: The contract's answer per batch check (``--batch``, judged by :func:`judge_batch`).
BATCH_EXPECTED = {
    "batch-unsigned": "401",
    "batch": "200, one result per event: 2xx for each valid event, 422 for the poison",
    "batch-duplicate": "200, one result per event: 409 (or 2xx with no second effect) for "
    "each valid event, 422 for the poison",
}


class Unreachable(Exception):
    """The handler (or the effect database) cannot be asked."""


@dataclass(frozen=True, slots=True)
class Probe:
    """One call to send: which check, for which event, the body, how it is signed."""

    check: str
    event: str
    body: dict[str, Any]
    signing: Signing = "valid"
    note: str = ""

    def sent(self) -> str:
        """What was sent, in words."""
        delivery = self.body["delivery"]
        how = {
            "valid": "signed",
            "none": "no signature headers",
            "wrong-secret": "signed with a secret that is not the durable's",
            "altered": "signed, then the payload changed",
            "expired": "signed with a stale timestamp",
        }[self.signing]
        text = (
            f"{self.body['event_type']}.v{self.body['event_version']} "
            f"message {self.body['message_id'][:8]}… attempt {delivery['attempt']}, {how}"
        )
        return f"{text}; {self.note}" if self.note else text


@dataclass(frozen=True, slots=True)
class Answer:
    """What came back: a status (and body head), or why there was none."""

    status: int | None
    detail: str = ""
    failure: str | None = None
    #: ``Retry-After`` in seconds, as the consumer reads it (None: absent or invalid).
    retry_after: float | None = None
    #: The body's ``retryable`` flag (INFRA-005 §3.1), as the consumer reads it.
    retryable: bool | None = None

    def outcome(self) -> Outcome:
        """As the consumer sees it."""
        if self.status is None:
            return HandlerFailure(self.failure or "timeout", self.detail)
        return HandlerResponse(self.status, self.retry_after, self.detail, self.retryable)

    def shown(self) -> str:
        """The status, or the failure."""
        return str(self.status) if self.status is not None else (self.failure or "no answer")


@dataclass(frozen=True, slots=True)
class Result:
    """A probe, the answer, and whether it keeps the contract."""

    check: str
    event: str
    sent: str
    expected: str
    answer: str
    detail: str
    consumer: str
    verdict: Verdict
    why: str
    #: Whether the effect query's result changed over the call (None: no query).
    effect_changed: bool | None = None


@dataclass
class Report:
    """Every result of one run."""

    url: str
    durable: str
    results: list[Result] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Results per verdict."""
        found = {"conforms": 0, "breach": 0, "unverified": 0}
        for result in self.results:
            found[result.verdict] += 1
        return found

    def exit_code(self) -> int:
        """0 when nothing breaches the contract, else 1."""
        return EXIT_BREACH if self.counts()["breach"] else EXIT_CONFORMS

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``--json``)."""
        return {
            "url": self.url,
            "durable": self.durable,
            "conforms": not self.counts()["breach"],
            "counts": self.counts(),
            "results": [asdict(r) for r in self.results],
        }

    def render(self) -> str:
        """The human form."""
        lines = [f"handler-check {self.url} (durable {self.durable})"]
        for r in self.results:
            mark = {"conforms": "ok", "breach": "BREACH", "unverified": "??"}[r.verdict]
            lines.append(f"{mark:<7} {r.check:<18} {r.event}")
            lines.append(f"          sent:     {r.sent}")
            answer = f"{r.answer} {r.detail}".strip() if r.detail else r.answer
            lines.append(f"          answered: {answer}")
            lines.append(f"          expected: {r.expected}; the consumer would {r.consumer}")
            if r.verdict != "conforms" or r.why:
                lines.append(f"          {r.why}")
        counts = self.counts()
        lines.append(
            f"{len(self.results)} checks: {counts['conforms']} conform, "
            f"{counts['breach']} breach the contract, {counts['unverified']} unverified"
        )
        return "\n".join(lines)


# --- judging (pure) ---------------------------------------------------------------------


def consumer_action(answer: Answer, durable: DurableSpec) -> str:
    """What the durable's inbox-consumer does with ``answer`` on a first delivery."""
    if answer.status in (401, 403):
        return "hold the message and alert (credentials refused), calling again until fixed"
    policy = RetryPolicy(tuple(durable.backoff), durable.max_deliver)
    decision = decide(answer.outcome(), attempt=1, policy=policy)
    if isinstance(decision, Ack):
        return f"ack it ({decision.reason})"
    if isinstance(decision, DeadLetter):
        return f"dead-letter it as {decision.reason_code}"
    assert isinstance(decision, Nak)
    alert = ", alerting" if decision.alert else ""
    return f"retry it in {decision.delay:g}s{alert} (dead-letter after {durable.max_deliver})"


def judge(
    check: str, answer: Answer, effect_changed: bool | None, consumer: str = ""
) -> tuple[Verdict, str]:
    """Whether ``answer`` to ``check`` keeps the contract, and why (empty when it plainly
    does). ``effect_changed`` is None without an effect query."""
    status = answer.status
    if status is None:
        return "breach", (
            f"no answer ({answer.failure}: {answer.detail}): the consumer retries until "
            "max_deliver, then dead-letters MAX_DELIVERIES_EXCEEDED"
        )
    if check == "normal":
        return _judge_normal(status, effect_changed)
    if check == "duplicate":
        verdict, why = _judge_duplicate(status, effect_changed)
    elif check in AUTH_CHECKS:
        verdict, why = _judge_auth(check, status)
    else:
        verdict, why = _judge_refusal(check, status, consumer)
    if not effect_changed:
        return verdict, why
    changed = (
        "the redelivery was applied a second time"
        if check == "duplicate"
        else "the call had an effect"
    )
    changed += " (the effect query's result changed)"
    return "breach", f"{why}; {changed}" if verdict == "breach" else changed


def _judge_normal(status: int, effect_changed: bool | None) -> tuple[Verdict, str]:
    if 200 <= status < 300:
        if effect_changed is False:
            return "unverified", (
                "answered 2xx but the effect query's result did not change: check the query"
            )
        return "conforms", ""
    if status == 409:
        return "breach", (
            "409 to a message id never sent before: the consumer acks it as already "
            "applied, so the event is lost"
        )
    return "breach", f"a valid event the durable accepts must be applied (2xx), not {status}"


def _judge_duplicate(status: int, effect_changed: bool | None) -> tuple[Verdict, str]:
    if status == 409:
        return "conforms", ""
    if 200 <= status < 300:
        if effect_changed:
            return "breach", "the redelivery was answered as a new message (the contract: 409)"
        if effect_changed is None:
            return "unverified", (
                "2xx to a redelivery keeps the contract only if it had no second effect; "
                "give --effect-sql to check it (the SDK and Ferry's handlers answer 409)"
            )
        return "conforms", "2xx with no second effect (the effect query did not change)"
    return "breach", f"a redelivered message must be answered 409 (already applied), not {status}"


def _judge_auth(check: str, status: int) -> tuple[Verdict, str]:
    if status == 401:
        return "conforms", ""
    if status == 403:
        return "conforms", "403: the consumer treats it as 401 (the contract says 401)"
    what = {
        "unsigned": "an unsigned call",
        "bad-signature": "a call signed with another secret",
        "altered-body": "a call whose body is not the one signed",
        "expired-timestamp": "a call signed outside the tolerance (a captured request replayed)",
    }[check]
    if 200 <= status < 300 or status == 409:
        return "breach", f"{what} was accepted: anyone reaching the handler can drive it"
    return "breach", f"{what} must be refused with 401, not {status}"


def _judge_refusal(check: str, status: int, consumer: str) -> tuple[Verdict, str]:
    what = {
        "poison": "a payload its schema refuses",
        "unknown-version": "an event version the durable does not accept",
        "unknown-type": "an event type no manifest declares",
    }[check]
    if status == 422:
        return "conforms", ""
    if 200 <= status < 300 or status == 409:
        return "breach", f"{what} was accepted as applied: it must be refused with 422"
    if consumer.startswith("dead-letter"):
        return "breach", (
            f"{what} must be answered 422 (HANDLER_REJECTED, a reason_code in the body); "
            f"with {status} the consumer would {consumer}"
        )
    return "breach", (
        f"{what} can never succeed: {status} makes the consumer retry it until max_deliver "
        "instead of dead-lettering it at once (422)"
    )


# --- building the calls -----------------------------------------------------------------


@dataclass
class Plan:
    """What to send for one durable."""

    durable_name: str
    durable: DurableSpec
    topology: Topology
    events: list[EventSpec]
    payloads: dict[str, dict[str, Any]]
    stale_seconds: float = DEFAULT_STALE_SECONDS
    _sequence: int = 0

    def body(
        self,
        event: EventSpec,
        payload: dict[str, Any],
        *,
        version: int | None = None,
        event_type: str | None = None,
    ) -> dict[str, Any]:
        """A first delivery's request body, built by the consumer's own builder
        (:func:`shared.domain.handler_call.request_body`)."""
        self._sequence += 1
        event_type = event_type or event.type
        version = version or event.version
        namespace = self.topology.context(event.context).namespace
        envelope = Envelope(
            message_id=str(uuid.uuid4()),
            subject=f"{namespace}.{event_type}.v{version}",
            event_type=event_type,
            event_version=version,
            occurred_at=datetime.now(UTC),
            aggregate_type="handler_check",
            aggregate_id=str(uuid.uuid4()),
            payload=payload,
            context=event.context,
        )
        return request_body(
            envelope,
            attempt=1,
            max_attempts=self.durable.max_deliver,
            stream_sequence=self._sequence,
            durable=self.durable_name,
        )

    def valid_payload(self, event: EventSpec) -> dict[str, Any]:
        """The given payload of ``event``, else its schema's example or a built one."""
        given = self.payloads.get(event.name)
        if given is not None:
            return given
        try:
            return sample_payload(event.payload_schema or {"type": "object"})
        except SampleError as exc:
            raise ConfigurationError(
                f"{event.name} ({event.manifest or 'manifest'}): {exc}; give "
                f"--payload {event.name}=FILE"
            ) from None

    def probes(self) -> Iterator[Probe | tuple[str, str, str]]:
        """Every call, in order; a check that cannot be built is (check, event, why)."""
        first = self.events[0]
        for check, signing in AUTH_SIGNING:
            note = f"{self.stale_seconds:g}s ago" if signing == "expired" else ""
            yield Probe(
                check, first.name, self.body(first, self.valid_payload(first)), signing, note
            )
        for event in self.events:
            normal = self.body(event, self.valid_payload(event))
            yield Probe("normal", event.name, normal)
            again = {**normal, "delivery": {**normal["delivery"], "attempt": 2}}
            again.update(retryCount=1)
            yield Probe("duplicate", event.name, again, note="the same message id again")
            poison = poison_payload(event.payload_schema or {}, self.valid_payload(event))
            if poison is None:
                yield "poison", event.name, "its schema accepts every object: nothing is poison"
            else:
                yield Probe("poison", event.name, self.body(event, poison), note=_diff(poison))
        yield self._unknown_version(first)
        unknown = self.body(first, {"handler_check": True}, event_type=UNKNOWN_TYPE, version=1)
        yield Probe("unknown-type", f"{UNKNOWN_TYPE}.v1", unknown)

    def _unknown_version(self, event: EventSpec) -> Probe:
        taken = {e.version for e in self.topology.events if e.type == event.type} | {
            e.version for e in self.events if e.type == event.type
        }
        version = max(taken) + 1
        body = self.body(event, self.valid_payload(event), version=version)
        return Probe("unknown-version", f"{event.type}.v{version}", body)


def _diff(poison: Mapping[str, Any]) -> str:
    return "payload " + json.dumps(poison, ensure_ascii=False)[:120]


def plan_for(
    topology: Topology,
    durable: str,
    *,
    only: list[str] | None = None,
    payloads: dict[str, dict[str, Any]] | None = None,
    stale_seconds: float = DEFAULT_STALE_SECONDS,
) -> Plan:
    """The calls for ``durable``: every event it accepts (or those named in ``only``)."""
    spec = topology.durable(durable)
    accepted = sorted(
        (e for e in topology.events if durable in e.handled_by), key=lambda e: (e.type, e.version)
    )
    if not accepted:
        raise ConfigurationError(
            f"durable {durable!r} of topology {topology.name!r} accepts no declared event "
            "(its manifests declare none it handles)"
        )
    if only:
        known = {e.name: e for e in accepted}
        missing = [name for name in only if name not in known]
        if missing:
            raise ConfigurationError(
                f"{durable} does not accept {', '.join(missing)} (it accepts {', '.join(known)})"
            )
        accepted = [known[name] for name in dict.fromkeys(only)]
    payloads = payloads or {}
    for name in payloads:
        if name not in {e.name for e in accepted}:
            raise ConfigurationError(f"--payload {name}: {durable} does not accept {name}")
    for event in accepted:
        if event.name in payloads and event.payload_schema is not None:
            key = (event.type, event.version)
            schemas = AcceptedEvents({key: event.payload_schema})
            problem = schemas.payload_error(key, payloads[event.name])
            if problem is not None:
                raise ConfigurationError(
                    f"--payload {event.name}: its schema refuses it: {problem}"
                )
    return Plan(durable, spec, topology, accepted, payloads, stale_seconds)


# --- sending ------------------------------------------------------------------------------


def signed_request(
    probe: Probe, secret: bytes, now: float, stale: float
) -> tuple[bytes, dict[str, str]]:
    """The bytes and headers of ``probe``'s call."""
    data = wire_json(probe.body)
    trace = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
    headers = {
        **request_headers(probe.body["message_id"], trace),
        "Content-Type": "application/json",
    }
    durable = probe.body["delivery"]["durable"]
    if probe.signing == "valid":
        headers.update(sign(secret, durable, data, now))
    elif probe.signing == "wrong-secret":
        headers.update(sign(WRONG_SECRET, durable, data, now))
    elif probe.signing == "expired":
        headers.update(sign(secret, durable, data, now - stale))
    elif probe.signing == "altered":
        headers.update(sign(secret, durable, data, now))
        changed = {**probe.body, "payload": {**probe.body["payload"], "handler_check": "altered"}}
        changed["payload_digest"] = changed["payloadDigest"] = payload_digest(changed["payload"])
        data = wire_json(changed)
    return data, headers


class EffectProbe:
    """Runs the effect query on the handler's database (``--effect-sql``)."""

    def __init__(self, conn: asyncpg.Connection, sql: str) -> None:
        self.conn, self.sql = conn, sql

    async def value(self) -> str:
        """The query's result, as text (compared, never interpreted)."""
        try:
            rows = await self.conn.fetch(self.sql)
        except asyncpg.PostgresError as exc:
            raise ConfigurationError(f"--effect-sql failed: {exc}") from None
        return json.dumps([list(r.values()) for r in rows], default=str)


async def call(
    session: aiohttp.ClientSession, url: str, data: bytes, headers: dict[str, str]
) -> Answer:
    """POST one call; :class:`Unreachable` when no connection can be made."""
    try:
        async with session.post(url, data=data, headers=headers, allow_redirects=False) as resp:
            head = await resp.content.read(BODY_READ_LIMIT)
            return _answer(resp.status, head, resp.headers.get("Retry-After"))
    except TimeoutError:
        return Answer(None, f"no answer within {session.timeout.total}s", "timeout")
    except aiohttp.ClientConnectorError as exc:
        raise Unreachable(f"cannot reach {url}: {exc}") from None
    except (aiohttp.ClientError, OSError) as exc:
        return Answer(None, f"{type(exc).__name__}: {exc}", "unreachable")


def _answer(status: int, head: bytes, retry_after: str | None) -> Answer:
    """An answer as the consumer reads it: detail, ``Retry-After``, ``retryable``."""
    text = " ".join(head.decode("utf-8", "replace").split())
    return Answer(
        status,
        text[:DETAIL_SHOWN],
        retry_after=parse_retry_after(retry_after, now=datetime.now(UTC)),
        retryable=body_retryable(head) if status >= 400 else None,
    )


async def run_checks(
    plan: Plan,
    url: str,
    secret: bytes,
    *,
    timeout: float,
    effects: EffectProbe | None = None,
) -> Report:
    """Send every probe of ``plan`` to ``url`` and judge the answers."""
    report = Report(url, plan.durable_name)
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    async with aiohttp.ClientSession(timeout=client_timeout) as session:
        for probe in plan.probes():
            if not isinstance(probe, Probe):
                check, event, why = probe
                report.results.append(
                    Result(
                        check,
                        event,
                        "nothing",
                        EXPECTED[check],
                        "-",
                        "",
                        "-",
                        "conforms",
                        f"skipped: {why}",
                    )
                )
                continue
            before = await effects.value() if effects else None
            data, headers = signed_request(probe, secret, time.time(), plan.stale_seconds)
            answer = await call(session, url, data, headers)
            changed = None if effects is None else (await effects.value()) != before
            action = consumer_action(answer, plan.durable)
            verdict, why = judge(probe.check, answer, changed, action)
            report.results.append(
                Result(
                    check=probe.check,
                    event=probe.event,
                    sent=probe.sent(),
                    expected=EXPECTED[probe.check],
                    answer=answer.shown(),
                    detail=answer.detail,
                    consumer=action,
                    verdict=verdict,
                    why=why,
                    effect_changed=changed,
                )
            )
    return report


# --- batch calls (--batch) ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchProbe:
    """The events of the batch checks: (label, body, poison) each."""

    events: list[tuple[str, dict[str, Any], bool]]

    def document(self, attempt: int) -> dict[str, Any]:
        """The batch body, every event at delivery ``attempt``."""
        bodies = []
        for _, body, _ in self.events:
            again = {**body, "delivery": {**body["delivery"], "attempt": attempt}}
            again.update(retryCount=attempt - 1)
            bodies.append(again)
        return batch_document(bodies)

    def sent(self, how: str) -> str:
        """What was sent, in words."""
        return f"a batch of {len(self.events)} ({', '.join(e[0] for e in self.events)}), {how}"


def batch_probe(plan: Plan) -> BatchProbe:
    """A valid event of every type the plan checks, and the first poison one."""
    events: list[tuple[str, dict[str, Any], bool]] = []
    poisoned = False
    for event in plan.events:
        events.append((event.name, plan.body(event, plan.valid_payload(event)), False))
        poison = poison_payload(event.payload_schema or {}, plan.valid_payload(event))
        if poison is not None and not poisoned:
            events.append((f"poison {event.name}", plan.body(event, poison), True))
            poisoned = True
    return BatchProbe(events)


def judge_batch(
    check: str, probe: BatchProbe, status: int | None, head: bytes, effect_changed: bool | None
) -> tuple[Verdict, str, str]:
    """The verdict of a batch check, why, and each event's answer in words."""
    if check == "batch-unsigned":
        return _judge_unsigned_batch(status)
    if status != 200:
        return "breach", f"a batch call is answered 200 with one result per event, not {status}", ""
    ids = [uuid.UUID(body["message_id"]) for _, body, _ in probe.events]
    answer = read_batch_answer(head, ids)
    if isinstance(answer, MalformedAnswer):
        return "breach", f"the batch answer is malformed: {answer.detail}", ""
    problems, shown, unseen = _judge_results(check, probe, answer, effect_changed)
    if check == "batch" and effect_changed is False:
        problems.append("the batch's valid events changed nothing (--effect-sql)")
    if problems:
        return "breach", "; ".join(problems), ", ".join(shown)
    if unseen:
        return (
            "unverified",
            "a 2xx to a redelivery is unverified without --effect-sql",
            ", ".join(shown),
        )
    return "conforms", "", ", ".join(shown)


def _judge_results(
    check: str, probe: BatchProbe, answer: BatchAnswer, effect_changed: bool | None
) -> tuple[list[str], list[str], bool]:
    """Each event's result judged: the problems, each answer in words, and whether a 2xx
    to a redelivery went unverified (no effect query)."""
    problems, shown, unseen = [], [], False
    for label, body, poison in probe.events:
        outcome = answer.outcomes[uuid.UUID(body["message_id"])]
        if not isinstance(outcome, HandlerResponse):
            problems.append(f"{label}: {outcome.detail}")
            shown.append(f"{label}: no result")
            continue
        shown.append(f"{label}: {outcome.status}")
        wanted = _batch_expected(check, poison, outcome.status, effect_changed)
        if wanted:
            problems.append(f"{label} answered {outcome.status}: {wanted}")
        elif check == "batch-duplicate" and not poison and outcome.status != 409:
            unseen = unseen or effect_changed is None
    return problems, shown, unseen


def _judge_unsigned_batch(status: int | None) -> tuple[Verdict, str, str]:
    if status in (401, 403):
        return "conforms", "", ""
    return "breach", "an unsigned batch must be refused 401", ""


def _batch_expected(check: str, poison: bool, status: int, effect_changed: bool | None) -> str:
    """What is wrong with one event's status (empty: nothing)."""
    if poison:
        return "" if status == 422 else "expected 422"
    if check == "batch":
        return "" if 200 <= status < 300 else "expected 2xx"
    if status == 409 or (200 <= status < 300 and effect_changed is not True):
        return ""
    return "expected 409 (or 2xx with no second effect)"


async def run_batch_checks(
    plan: Plan, url: str, secret: bytes, *, timeout: float, effects: EffectProbe | None = None
) -> list[Result]:
    """The batch checks (``--batch``), judged."""
    probe = batch_probe(plan)
    found: list[Result] = []
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    async with aiohttp.ClientSession(timeout=client_timeout) as session:
        for check, attempt, signed in (
            ("batch-unsigned", 1, False),
            ("batch", 1, True),
            ("batch-duplicate", 2, True),
        ):
            data = wire_json(probe.document(attempt))
            headers = {**batch_headers(len(probe.events)), "Content-Type": "application/json"}
            if signed:
                headers.update(sign(secret, plan.durable_name, data, time.time()))
            before = await effects.value() if effects else None
            status, head = await _post_batch(session, url, data, headers)
            changed = None if effects is None else (await effects.value()) != before
            verdict, why, each = judge_batch(check, probe, status, head, changed)
            how = "signed" if signed else "no signature headers"
            if attempt > 1:
                how += ", the same events again (attempt 2)"
            found.append(
                Result(
                    check=check,
                    event="batch",
                    sent=probe.sent(how),
                    expected=BATCH_EXPECTED[check],
                    answer=str(status) if status is not None else "no answer",
                    detail=each or " ".join(head[:DETAIL_SHOWN].decode("utf-8", "replace").split()),
                    consumer="settle each result by the ACK table" if status == 200 else "-",
                    verdict=verdict,
                    why=why,
                    effect_changed=changed,
                )
            )
    return found


async def _post_batch(
    session: aiohttp.ClientSession, url: str, data: bytes, headers: dict[str, str]
) -> tuple[int | None, bytes]:
    try:
        async with session.post(url, data=data, headers=headers, allow_redirects=False) as resp:
            return resp.status, await resp.content.read(ANSWER_LIMIT + 1)
    except TimeoutError:
        return None, b"no answer (timeout)"
    except aiohttp.ClientConnectorError as exc:
        raise Unreachable(f"cannot reach {url}: {exc}") from None
    except (aiohttp.ClientError, OSError) as exc:
        return None, f"{type(exc).__name__}: {exc}".encode()


# --- the command --------------------------------------------------------------------------


def add_command(sub: Any) -> None:
    """Register ``ferry handler-check`` on the ``ferry`` parser's subcommands."""
    check = sub.add_parser(
        "handler-check",
        help="conformance test of a handler service: signed calls as the durable's consumer "
        "sends them (a valid event, a redelivery, poison, unknown events, forged and stale "
        "signatures), each answer judged against the handler contract; exit 0 all conform, "
        "1 a breach, 2 unreachable or usage",
    )
    check.add_argument("url", help="the handler's URL (e.g. http://127.0.0.1:8101/handle)")
    check.add_argument(
        "--durable", required=True, help="the durable whose calls to send (its events, secret)"
    )
    check.add_argument(
        "--event",
        action="append",
        metavar="TYPE.vN",
        help="check only this event (repeatable; default: every event the durable accepts)",
    )
    check.add_argument(
        "--payload",
        action="append",
        metavar="TYPE.vN=FILE",
        help="a JSON file holding a valid payload of TYPE.vN, sent instead of one built from "
        "the schema (repeatable)",
    )
    check.add_argument(
        "--timeout",
        type=float,
        help="seconds each call may take (default: the durable's handler timeout)",
    )
    check.add_argument(
        "--stale-seconds",
        type=float,
        default=DEFAULT_STALE_SECONDS,
        help="how old the expired-timestamp call's signature is (default 3600; must exceed "
        "the handler's FERRY_SIGNATURE_TOLERANCE)",
    )
    check.add_argument(
        "--effect-sql",
        metavar="SQL",
        help="a query over the handler's database whose result changes when an event is "
        "applied (e.g. SELECT count(*) FROM my_table): run around every call, so a second "
        "effect of the redelivery, or any effect of a refused call, is a breach",
    )
    check.add_argument(
        "--effect-dsn",
        metavar="DSN",
        help="the database of --effect-sql (default: the durable's target context database)",
    )
    check.add_argument(
        "--batch",
        action="store_true",
        help="also send batch calls (for a durable with handler.batch >= 2): unsigned, "
        "signed, and the same events again; each must be answered 200 with one result per "
        "event",
    )
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.set_defaults(func=cmd_handler_check)


def read_payloads(items: list[str] | None) -> dict[str, dict[str, Any]]:
    """``TYPE.vN=FILE`` options as event name → payload."""
    found: dict[str, dict[str, Any]] = {}
    for item in items or ():
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ConfigurationError(f"--payload {item!r}: write TYPE.vN=FILE")
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigurationError(
                f"--payload {name}: cannot read {path}: {exc.strerror}"
            ) from None
        except ValueError as exc:
            raise ConfigurationError(f"--payload {name}: {path} is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise ConfigurationError(f"--payload {name}: {path} must hold a JSON object")
        found[name] = doc
    return found


async def cmd_handler_check(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Run the checks; print the report."""
    topology = settings.load_topology()
    secret = ConsumerSettings(durable=args.durable).signing_secret()
    if secret is None:
        raise ConfigurationError(
            "FERRY_HANDLER_SECRET (or _FILE) is not set: the durable's signing secret is "
            "needed to sign the calls"
        )
    plan = plan_for(
        topology,
        args.durable,
        only=args.event,
        payloads=read_payloads(args.payload),
        stale_seconds=args.stale_seconds,
    )
    timeout = args.timeout or plan.durable.handler.timeout
    conn = None
    try:
        if args.effect_sql:
            dsn = args.effect_dsn or settings.dsn(topology.context(plan.durable.target).database)
            try:
                conn = await connect(dsn)
            except TransientError as exc:
                raise Unreachable(f"effect database {redact(dsn)}: {exc}") from None
        effects = EffectProbe(conn, args.effect_sql) if conn is not None else None
        report = await run_checks(plan, args.url, secret, timeout=timeout, effects=effects)
        if args.batch:
            report.results += await run_batch_checks(
                plan, args.url, secret, timeout=timeout, effects=effects
            )
    except Unreachable as exc:
        print(json.dumps({"error": str(exc)}) if args.json else f"ferry: {exc}")
        return EXIT_UNREACHABLE
    finally:
        if conn is not None:
            await conn.close()
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.render())
    return report.exit_code()
