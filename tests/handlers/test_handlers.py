"""The example handler services against a real PostgreSQL, over real HTTP.

Each test serves a handler app in-process on a free port and speaks the handler
contract to it: 200 once, 409 after, 422 for what can never succeed, 503 for what may,
and an effects ledger that counts every call.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from services.handlers.service import build_service
from services.handlers.specs import service_spec
from shared.contracts.topology import EventSpec
from shared.domain.envelope import payload_digest
from shared.domain.errors import ConfigurationError
from tests.conftest import Env

from .conftest import HTTP_TIMEOUT, RunningHandler, make_doc, mediation_doc_for, running

pytestmark = pytest.mark.integration

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def vibe_v1(vibe_id: str = "v1", title: str = "first", **extra: Any) -> dict[str, Any]:
    return make_doc("vibe_created", 1, {"vibe_id": vibe_id, "title": title, **extra})


def vibe_v2(vibe_id: str = "v1", title: str = "first", owner: str = "u1") -> dict[str, Any]:
    return make_doc("vibe_created", 2, {"vibe_id": vibe_id, "title": title, "owner_id": owner})


def with_payload(doc: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    """``doc`` carrying ``payload`` (digest recomputed, so only the payload is at fault)."""
    return {**doc, "payload": payload, "payload_digest": payload_digest(payload)}


def redelivery(doc: dict[str, Any], attempt: int) -> dict[str, Any]:
    return {**doc, "delivery": {**doc["delivery"], "attempt": attempt}}


async def vibes(handler: RunningHandler) -> list[asyncpg.Record]:
    return list(await handler.pool.fetch("SELECT * FROM handler_sea_vibes ORDER BY vibe_id"))


# --- idempotency ---------------------------------------------------------------------


async def test_processed_once_then_409(sea: RunningHandler) -> None:
    doc = vibe_v1()
    first = await sea.post(doc)
    second = await sea.post(redelivery(doc, 2))
    assert (first.status, first.body["status"]) == (200, "processed")
    assert (second.status, second.body["status"]) == (409, "already_processed")
    assert second.body["message_id"] == doc["message_id"] and "applied_at" in second.body
    assert [(r["vibe_id"], r["title"]) for r in await vibes(sea)] == [("v1", "first")]
    assert await sea.applied() == 1
    assert await sea.calls(doc["message_id"]) == [200, 409], "the ledger never deduplicates"


async def test_concurrent_deliveries_of_one_id_apply_once(sea: RunningHandler) -> None:
    doc = vibe_v1()
    replies = await asyncio.gather(*(sea.post(redelivery(doc, n)) for n in range(1, 9)))
    assert sorted(r.status for r in replies) == [200] + [409] * 7
    assert await sea.applied() == 1
    assert len(await sea.calls(doc["message_id"])) == 8


async def test_distinct_ids_for_one_vibe_are_each_applied(sea: RunningHandler) -> None:
    assert (await sea.post(vibe_v1(title="a"))).status == 200
    assert (await sea.post(vibe_v1(title="b"))).status == 200
    assert [r["title"] for r in await vibes(sea)] == ["b"]
    assert await sea.applied() == 2


# --- versions side by side -------------------------------------------------------------


async def test_v1_and_v2_side_by_side(sea: RunningHandler) -> None:
    assert (await sea.post(vibe_v1("a", "from v1"))).status == 200
    assert (await sea.post(vibe_v2("b", "from v2", owner="owner-7"))).status == 200
    rows = {r["vibe_id"]: r for r in await vibes(sea)}
    assert (rows["a"]["owner_id"], rows["a"]["version"]) == (None, 1)
    assert (rows["b"]["owner_id"], rows["b"]["version"]) == ("owner-7", 2)


async def test_a_late_v1_keeps_the_owner_a_v2_stored(sea: RunningHandler) -> None:
    assert (await sea.post(vibe_v2("a", "v2 title", owner="o"))).status == 200
    assert (await sea.post(vibe_v1("a", "v1 title"))).status == 200
    (row,) = await vibes(sea)
    assert (row["title"], row["owner_id"], row["version"]) == ("v1 title", "o", 1)


# --- poison: 422 naming the defect, no state, one ledger row --------------------------

Mutation = Callable[[dict[str, Any]], tuple[bytes, dict[str, str]]]


def _send(doc: dict[str, Any], **headers: str) -> tuple[bytes, dict[str, str]]:
    return json.dumps(doc).encode(), {"Idempotency-Key": doc["message_id"], **headers}


def _without(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != name}


POISON_CASES: dict[str, tuple[Mutation, str]] = {
    "poison flag": (
        lambda d: _send(with_payload(d, {**d["payload"], "_ferry_test": {"poison": True}})),
        "TEST_POISON",
    ),
    "unknown version": (
        lambda d: _send({**d, "event_version": 3, "subject": "vibespro.event.vibe_created.v3"}),
        "unknown event type/version vibe_created.v3",
    ),
    "unknown type": (
        lambda d: _send(
            {**d, "event_type": "vibe_deleted", "subject": "vibespro.event.vibe_deleted.v1"}
        ),
        "unknown event type/version vibe_deleted.v1",
    ),
    "schema type": (
        lambda d: _send(with_payload(d, {"vibe_id": "v1", "title": 42})),
        "SCHEMA_INVALID: vibe_created.v1: payload.title: 42 is not of type 'string'",
    ),
    "schema required": (
        lambda d: _send(with_payload(d, {"vibe_id": "v1"})),
        "payload.title: required property is missing",
    ),
    "missing envelope field": (
        lambda d: _send(_without(d, "aggregate_id")),
        "envelope lacks aggregate_id",
    ),
    "missing delivery": (lambda d: _send(_without(d, "delivery")), "delivery"),
    "bad attempt": (
        lambda d: _send({**d, "delivery": {"attempt": 0}}),
        "delivery.attempt must be an integer",
    ),
    "key mismatch": (
        lambda d: (json.dumps(d).encode(), {"Idempotency-Key": str(uuid.uuid4())}),
        "IDEMPOTENCY_KEY_MISMATCH",
    ),
    "key missing": (lambda d: (json.dumps(d).encode(), {}), "Idempotency-Key header is missing"),
    "not json": (
        lambda d: (b"{not json", {"Idempotency-Key": d["message_id"]}),
        "MALFORMED_JSON",
    ),
    "not an object": (
        lambda d: (b"[1, 2]", {"Idempotency-Key": d["message_id"]}),
        "not an object",
    ),
    "deep nesting": (
        lambda d: (b'{"a":' * 5000 + b"1" + b"}" * 5000, {"Idempotency-Key": d["message_id"]}),
        "MALFORMED_JSON",
    ),
    "huge number": (
        lambda d: (b'{"a":' + b"9" * 5000 + b"}", {"Idempotency-Key": d["message_id"]}),
        "MALFORMED_JSON",
    ),
    "not a number": (
        lambda d: (b'{"a":1e400}', {"Idempotency-Key": d["message_id"]}),
        "MALFORMED_JSON",
    ),
    "digest mismatch": (
        lambda d: _send({**d, "payload_digest": "sha256:" + "0" * 64}),
        "DIGEST_MISMATCH",
    ),
    "subject mismatch": (
        lambda d: _send({**d, "subject": "vibespro.event.vibe_created.v2"}),
        "SUBJECT_MISMATCH",
    ),
    "directive typo": (
        lambda d: _send(with_payload(d, {**d["payload"], "_ferry_test": {"fail_attempt": 1}})),
        "unknown key(s) fail_attempt",
    ),
    "unstorable value": (
        lambda d: _send(with_payload(d, {"vibe_id": "v1", "title": "nul \u0000 byte"})),
        "UNSTORABLE_VALUE",
    ),
}


#: Defects of the request itself (not JSON, not an envelope, headers): 400, not 422.
MALFORMED = frozenset(
    {
        "missing envelope field",
        "missing delivery",
        "bad attempt",
        "key mismatch",
        "key missing",
        "not json",
        "not an object",
        "deep nesting",
        "huge number",
        "not a number",
        "digest mismatch",
        "subject mismatch",
    }
)


@pytest.mark.parametrize("case", sorted(POISON_CASES))
async def test_poison_is_400_or_422_naming_the_defect(sea: RunningHandler, case: str) -> None:
    mutate, expected = POISON_CASES[case]
    doc = vibe_v1()
    body, headers = mutate(doc)
    reply = await sea.post(body=body, headers=headers)
    status = 400 if case in MALFORMED else 422
    assert reply.status == status, reply.body
    assert expected in f"{reply.body['reason_code']}: {reply.body['error']}"
    assert reply.body["reason_code"] and reply.body["retryable"] is False
    assert await sea.applied() == 0 and await vibes(sea) == []
    statuses = [r["status"] for r in await sea.pool.fetch("SELECT status FROM handler_calls")]
    assert statuses == [status], "a rejected call is still recorded"


async def test_a_poison_directive_wins_over_every_attempt(sea: RunningHandler) -> None:
    doc = vibe_v1(_ferry_test={"poison": True, "fail_attempts": 5})
    assert (await sea.post(doc)).status == 422
    assert (await sea.post(redelivery(doc, 9))).status == 422


# --- injected transient failures -------------------------------------------------------


async def test_fail_attempts_then_success_with_retry_after(sea: RunningHandler) -> None:
    doc = vibe_v1(_ferry_test={"fail_attempts": 2, "retry_after": 7})
    replies = [await sea.post(redelivery(doc, n)) for n in (1, 2, 3, 4)]
    assert [r.status for r in replies] == [503, 503, 200, 409]
    assert [r.headers.get("Retry-After") for r in replies[:2]] == ["7", "7"]
    assert "Retry-After" not in replies[2].headers
    assert "attempt 1 of 2" in replies[0].body["error"]
    assert await sea.calls(doc["message_id"]) == [503, 503, 200, 409]
    assert len(await vibes(sea)) == 1 and await sea.applied() == 1


async def test_retry_after_may_be_fractional_or_absent(sea: RunningHandler) -> None:
    doc = vibe_v1(_ferry_test={"fail_attempts": 1, "retry_after": 0.25})
    reply = await sea.post(doc)
    assert (reply.status, reply.headers.get("Retry-After")) == (503, "0.25")
    plain = vibe_v1(vibe_id="v2", _ferry_test={"fail_attempts": 1})
    reply = await sea.post(plain)
    assert reply.status == 503 and "Retry-After" not in reply.headers


@pytest.mark.parametrize("status", [404, 400, 301, 500])
async def test_injected_status_on_every_attempt(sea: RunningHandler, status: int) -> None:
    doc = vibe_v1(_ferry_test={"status": status})
    replies = [await sea.post(redelivery(doc, n)) for n in (1, 5)]
    assert [r.status for r in replies] == [status, status]
    assert await sea.applied() == 0
    assert await sea.calls(doc["message_id"]) == [status, status]


async def test_slow_ms_delays_the_answer(sea: RunningHandler) -> None:
    started = time.monotonic()
    reply = await sea.post(vibe_v1(_ferry_test={"slow_ms": 300}))
    assert reply.status == 200
    assert time.monotonic() - started >= 0.3


async def test_a_sleep_beyond_the_bound_is_refused_at_once(sea: RunningHandler) -> None:
    started = time.monotonic()
    reply = await sea.post(vibe_v1(_ferry_test={"slow_ms": 3_600_000}))
    assert (reply.status, reply.body["reason_code"]) == (422, "INVALID_TEST_DIRECTIVE")
    assert time.monotonic() - started < HTTP_TIMEOUT
    assert await sea.applied() == 0


# --- fault injection off (the default): the directive is plain data -------------------

DIRECTIVES: list[dict[str, Any]] = [
    {"poison": True},
    {"status": 500},
    {"fail_attempts": 3, "retry_after": 9},
    {"reject_until": "2999-01-01T00:00:00Z"},
    {"slow_ms": 600_000},  # ten minutes: obeyed, the test could not finish
    {"fail_attempt": 1},  # a typo: refused when on, ignored like any data when off
    "not even an object",
]


@pytest.mark.parametrize("directive", DIRECTIVES, ids=repr)
async def test_without_the_setting_a_directive_changes_nothing(env: Env, directive: Any) -> None:
    doc = vibe_v1(_ferry_test=directive)
    async with running(env, "sea") as plain:
        assert plain.service.fault_injection is False
        started = time.monotonic()
        first = await plain.post(doc)
        elapsed = time.monotonic() - started
        second = await plain.post(redelivery(doc, 2))
        rows = await vibes(plain)
    assert (first.status, second.status) == (200, 409), first.body
    assert "Retry-After" not in first.headers
    # Not a speed bound: a ten-minute sleep obeyed would have shown as one (or a timeout).
    assert elapsed < 60.0, "slow_ms must not sleep when fault injection is off"
    assert [(r["vibe_id"], r["title"]) for r in rows] == [("v1", "first")]


# --- real failures ---------------------------------------------------------------------


async def test_a_failing_route_rolls_the_claim_back(sea: RunningHandler) -> None:
    await sea.pool.execute("DROP TABLE handler_sea_vibes")
    doc = vibe_v1()
    reply = await sea.post(doc)
    assert reply.status == 500 and "UndefinedTableError" in reply.body["error"]
    assert await sea.applied() == 0, "the claim must roll back with the route"
    await sea.service.install()
    assert (await sea.post(redelivery(doc, 2))).status == 200
    assert await sea.calls(doc["message_id"]) == [500, 200]


async def test_database_gone_is_503_and_not_ready(env: Env) -> None:
    async with running(env, "sea") as sea:
        assert await sea.get("/healthz") == 200
        assert await sea.get("/readyz") == 200
        await sea.pool.close()
        reply = await sea.post(vibe_v1())
        assert reply.status == 503 and "database unavailable" in reply.body["error"]
        assert await sea.get("/readyz") == 503
        assert await sea.get("/healthz") == 200


# --- other services --------------------------------------------------------------------


async def test_vibespro_stores_published_models(vibespro: RunningHandler) -> None:
    doc = make_doc(
        "model_published",
        1,
        {"model_id": "m1", "name": "Model"},
        namespace="sea.event",
        context="sea",
        durable="vibespro__from_sea",
    )
    assert (await vibespro.post(doc)).status == 200
    assert (await vibespro.post(doc)).status == 409
    (row,) = await vibespro.pool.fetch("SELECT * FROM handler_vibespro_models")
    assert (row["model_id"], row["name"]) == ("m1", "Model")


def scored(key: str = "opp-1", score: float = 0.5, **kw: Any) -> dict[str, Any]:
    return mediation_doc_for(
        "opportunity_scored",
        {"opportunity_key": key, "score": score},
        lane="mediation.e_to_f.events",
        module="module_e",
        durable="cg_f_ingest",
        **kw,
    )


async def test_module_f_forwards_through_its_outbox(mediation_env: Env) -> None:
    correlation = str(uuid.uuid4())
    doc = scored(correlation_id=correlation)
    async with running(mediation_env, "module_f") as f:
        headers = {"Idempotency-Key": doc["message_id"], "traceparent": TRACEPARENT}
        assert (await f.post(doc, headers=headers)).status == 200
        assert (await f.post(redelivery(doc, 2))).status == 409
        (opp,) = await f.pool.fetch("SELECT * FROM handler_f_opportunities")
        (event,) = await f.pool.fetch("SELECT * FROM outbox_events")
    assert (opp["opportunity_key"], opp["score"]) == ("opp-1", 0.5)
    assert (event["event_type"], event["event_version"]) == ("opportunity_archived", 1)
    assert (event["aggregate_type"], event["aggregate_id"]) == ("opportunity", "opp-1")
    assert json.loads(event["payload"]) == {"opportunity_key": "opp-1"}
    assert str(event["causation_id"]) == doc["message_id"]
    assert str(event["correlation_id"]) == correlation
    assert event["traceparent"] == TRACEPARENT and event["published_at"] is None


async def test_module_f_correlates_to_the_message_without_a_correlation_id(
    mediation_env: Env,
) -> None:
    doc = scored()
    async with running(mediation_env, "module_f") as f:
        assert (await f.post(doc)).status == 200
        correlation = await f.pool.fetchval("SELECT correlation_id FROM outbox_events")
    assert str(correlation) == doc["message_id"]


async def test_module_f_state_and_outbox_row_commit_together(mediation_env: Env) -> None:
    doc = scored()
    async with running(mediation_env, "module_f") as f:
        # An outbox that refuses rows: the upsert that ran before must roll back too.
        await f.pool.execute(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN RAISE EXCEPTION 'outbox refuses'; END $$;"
            "CREATE TRIGGER refuse BEFORE INSERT ON outbox_events"
            " FOR EACH ROW EXECUTE FUNCTION refuse()"
        )
        assert (await f.post(doc)).status == 500
        assert await f.pool.fetchval("SELECT count(*) FROM handler_f_opportunities") == 0
        assert await f.applied() == 0
        await f.pool.execute("DROP TRIGGER refuse ON outbox_events")
        assert (await f.post(redelivery(doc, 2))).status == 200
        assert await f.pool.fetchval("SELECT count(*) FROM handler_f_opportunities") == 1
        assert await f.pool.fetchval("SELECT count(*) FROM outbox_events") == 1


async def test_module_f_refuses_an_unforwardable_key_as_poison(mediation_env: Env) -> None:
    async with running(mediation_env, "module_f") as f:
        reply = await f.post(scored(key=""))
        assert reply.status == 422 and "opportunity_key" in reply.body["error"]
        assert await f.pool.fetchval("SELECT count(*) FROM outbox_events") == 0


async def test_mediation_message_id_alias_must_agree(mediation_env: Env) -> None:
    doc = {**scored(), "messageId": str(uuid.uuid4())}
    async with running(mediation_env, "module_f") as f:
        reply = await f.post(doc)
    assert reply.status == 400 and "messageId" in reply.body["error"]


async def test_module_g_archives_and_records_replays(mediation_env: Env) -> None:
    archived = mediation_doc_for(
        "opportunity_archived",
        {"opportunity_key": "opp-1"},
        lane="mediation.f_to_g.archive",
        module="module_f",
        durable="cg_g_archive",
    )
    replay = mediation_doc_for(
        "replay_requested",
        {"opportunity_key": "opp-1", "reason": "dispute"},
        lane="mediation.replay.jobs",
        module="module_g",
        durable="cg_replay",
    )
    async with running(mediation_env, "module_g") as g:
        assert [(await g.post(d)).status for d in (archived, archived, replay, replay)] == [
            200,
            409,
            200,
            409,
        ]
        (row,) = await g.pool.fetch("SELECT * FROM handler_g_archive")
        (rep,) = await g.pool.fetch("SELECT * FROM handler_g_replays")
    assert (str(row["message_id"]), row["opportunity_key"]) == (archived["message_id"], "opp-1")
    assert json.loads(rep["payload"]) == {"opportunity_key": "opp-1", "reason": "dispute"}


def _publish(revision: int, config_id: str = "c1", **extra: Any) -> dict[str, Any]:
    return mediation_doc_for(
        "config_publish_requested",
        {"config_id": config_id, "revision": revision, **extra},
        lane="mediation.h.publish.jobs",
        module="module_h",
        durable="cg_h_publish",
    )


async def _configs(h: RunningHandler) -> list[tuple[str, int, int | None]]:
    rows = await h.pool.fetch(
        "SELECT config_id, revision, previous_revision FROM handler_h_configs ORDER BY 1"
    )
    return [(r["config_id"], r["revision"], r["previous_revision"]) for r in rows]


async def _out_of_order_metric(h: RunningHandler) -> float:
    async with h.client.get("/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith("ferry_handler_out_of_order_total{") and 'handler="module_h"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_module_h_applies_requests_in_arrival_order(mediation_env: Env) -> None:
    # cg_h_publish is ordered by config: what arrives last was committed last, so it
    # wins, even a lower revision (a rollback) — no "keep the highest revision" any more.
    async with running(mediation_env, "module_h") as h:
        assert [(await h.post(_publish(r))).status for r in (1, 2, 3)] == [200, 200, 200]
        assert await _configs(h) == [("c1", 3, 2)]
        other = await h.post(_publish(7, config_id="c2"))
        assert other.status == 200 and await _configs(h) == [("c1", 3, 2), ("c2", 7, None)]
        assert await _out_of_order_metric(h) == 0.0, "in-order requests are not reported"


async def test_module_h_is_idempotent_per_message_id(mediation_env: Env) -> None:
    first, second = _publish(1), _publish(2)
    async with running(mediation_env, "module_h") as h:
        assert (await h.post(first)).status == 200
        assert (await h.post(second)).status == 200
        # A redelivery of the first request (its answer was lost) is a 409, not a rollback.
        again = await h.post({**first, "delivery": {**first["delivery"], "attempt": 2}})
        assert again.status == 409
        assert await _configs(h) == [("c1", 2, 1)]
        assert await h.calls(first["message_id"]) == [200, 409]


async def test_module_h_applies_and_reports_an_out_of_order_revision(
    mediation_env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    late = _publish(4)
    async with running(mediation_env, "module_h") as h:
        before = await _out_of_order_metric(h)
        assert (await h.post(_publish(5))).status == 200
        with caplog.at_level("WARNING", logger="ferry.handlers"):
            assert (await h.post(late)).status == 200
        # Applied in arrival order (the guard reports, it does not second-guess the order)...
        assert await _configs(h) == [("c1", 4, 5)]
        # ...and visible: a warning naming the config and both revisions, and the counter.
        assert await _out_of_order_metric(h) == before + 1
        bad = await h.post(with_payload(_publish(1), {"config_id": "c1", "revision": "x"}))
    [record] = [r for r in caplog.records if "out-of-order" in r.getMessage()]
    assert "c1 revision 4 arrived after revision 5" in record.getMessage()
    assert getattr(record, "message_id", None) == late["message_id"]
    assert bad.status == 422


async def test_module_h_keeps_the_directive_as_data_unless_fault_injection_is_on(
    mediation_env: Env,
) -> None:
    directive = {"status": 500}
    async with running(mediation_env, "module_h") as h:
        assert (await h.post(_publish(1, _ferry_test=directive))).status == 200
        stored = await h.pool.fetchval("SELECT payload FROM handler_h_configs")
    assert json.loads(stored)["_ferry_test"] == directive, "off: the field is ordinary data"
    async with running(mediation_env, "module_h", fault_injection=True) as h:
        assert (await h.post(_publish(2, _ferry_test={"fail_attempts": 0}))).status == 200
        stored = await h.pool.fetchval("SELECT payload FROM handler_h_configs")
    assert json.loads(stored) == {"config_id": "c1", "revision": 2}, "on: the directive is ours"


# --- wiring against the topology --------------------------------------------------------


async def test_refuses_a_topology_event_it_has_no_route_for(env: Env) -> None:
    # Events come from the generated registry; this one stands for a manifest change
    # that was regenerated without adding the route.
    extra = EventSpec.model_validate(
        {
            "context": "vibespro",
            "type": "vibe_deleted",
            "version": 1,
            "handled_by": ["sea__from_vibespro"],
        }
    )
    topology = env.topology.model_copy(update={"events": [*env.topology.events, extra]})
    pool = await asyncpg.create_pool(env.dsn("sea"), min_size=1, max_size=1)
    try:
        with pytest.raises(ConfigurationError, match=r"vibe_deleted\.v1 to context 'sea'"):
            build_service(service_spec("sea"), pool=pool, topology=topology)
    finally:
        await pool.close()


async def test_enforces_every_keyword_of_the_schema_over_http(env: Env) -> None:
    # The old home-made validator refused maxLength, enum, minimum...; jsonschema
    # enforces them as the consumer does (tests/handlers/test_schema.py compares both).
    events = []
    for event in env.topology.events:
        if event.name == "vibe_created.v1":
            schema = copy.deepcopy(event.payload_schema or {})
            schema["properties"]["title"]["maxLength"] = 10
            schema["properties"]["rank"] = {"type": "integer", "minimum": 1}
            event = event.model_copy(update={"payload_schema": schema})
        events.append(event)
    env.topology = env.topology.model_copy(update={"events": events})
    async with running(env, "sea") as sea:
        too_long = await sea.post(vibe_v1(title="eleven char"))
        too_low = await sea.post(vibe_v1(rank=0))
        fine = await sea.post(vibe_v1(title="ten chars!", rank=1))
    assert (too_long.status, too_long.body["reason_code"]) == (422, "SCHEMA_INVALID")
    assert "payload.title: 'eleven char' is too long" in too_long.body["error"]
    assert (too_low.status, too_low.body["reason_code"]) == (422, "SCHEMA_INVALID")
    assert "payload.rank: 0 is less than the minimum of 1" in too_low.body["error"]
    assert fine.status == 200
