"""Does a handler service keep the contract? (``ferry handler-check URL --durable NAME``,
shared/cli/handler_check.py.)

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

The pieces: the calls (:mod:`shared.ops.handler_check_calls`), judging their answers
(:mod:`shared.ops.handler_check_judge`), sending them (:mod:`shared.ops.handler_check_send`)
and the batch checks (:mod:`shared.ops.handler_check_batch`); this module runs them
(:func:`check_handler`) and holds the report.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from shared.adapters.postgres import connect, redact
from shared.domain.batch_call import batch_headers
from shared.domain.envelope import wire_json
from shared.domain.errors import ConfigurationError, TransientError
from shared.domain.signing import sign
from shared.ops.handler_check_batch import BATCH_EXPECTED, batch_probe, judge_batch
from shared.ops.handler_check_calls import (
    DEFAULT_STALE_SECONDS,
    Plan,
    Probe,
    plan_for,
    signed_request,
)
from shared.ops.handler_check_judge import EXPECTED, Verdict, consumer_action, judge
from shared.ops.handler_check_send import (
    DETAIL_SHOWN,
    EffectProbe,
    Unreachable,
    call,
    post_batch,
)
from shared.runtime.settings import CommonSettings, ConsumerSettings

#: Exit codes of the command.
EXIT_CONFORMS, EXIT_BREACH, EXIT_UNREACHABLE = 0, 1, 2


# --- the report ---------------------------------------------------------------------------


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


# --- running the checks -------------------------------------------------------------------


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
            status, head = await post_batch(session, url, data, headers)
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


# --- one run ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckOptions:
    """How one run checks: the events (``only``: all the durable accepts), valid payloads
    given instead of built, the expired signature's age, each call's timeout (None: the
    durable's handler timeout), the effect query and its database, the batch checks."""

    only: list[str] | None = None
    payloads: dict[str, dict[str, Any]] | None = None
    stale_seconds: float = DEFAULT_STALE_SECONDS
    timeout: float | None = None
    effect_sql: str | None = None
    effect_dsn: str | None = None
    batch: bool = False


async def check_handler(
    settings: CommonSettings, url: str, durable: str, options: CheckOptions
) -> Report:
    """Send ``durable``'s calls to the handler at ``url`` and judge its answers (the
    module doc); :class:`Unreachable` when the handler or the effect database cannot be
    reached, :class:`ConfigurationError` when the durable's signing secret is not set."""
    topology = settings.load_topology()
    secret = ConsumerSettings(durable=durable).signing_secret()
    if secret is None:
        raise ConfigurationError(
            "FERRY_HANDLER_SECRET (or _FILE) is not set: the durable's signing secret is "
            "needed to sign the calls"
        )
    plan = plan_for(
        topology,
        durable,
        only=options.only,
        payloads=options.payloads,
        stale_seconds=options.stale_seconds,
    )
    timeout = options.timeout or plan.durable.handler.timeout
    conn = None
    effects = None
    try:
        if options.effect_sql:
            dsn = options.effect_dsn or settings.dsn(topology.context(plan.durable.target).database)
            try:
                conn = await connect(dsn)
            except TransientError as exc:
                raise Unreachable(f"effect database {redact(dsn)}: {exc}") from None
            effects = EffectProbe(conn, options.effect_sql)
        report = await run_checks(plan, url, secret, timeout=timeout, effects=effects)
        if options.batch:
            report.results += await run_batch_checks(
                plan, url, secret, timeout=timeout, effects=effects
            )
    finally:
        if conn is not None:
            await conn.close()
    return report
