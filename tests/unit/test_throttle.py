"""Controlled throttling and criticality (INFRA-005 §7, §7.3): the rate parser, the token
bucket, the topology fields, the lint rule, the command's arguments.

The parser meets hypothesis: any text or number gives a rate in range or a RateError that
says how to write one, and every rate it prints reads back the same. The bucket is run
on a simulated clock: whatever the pattern of takes, no more than ``burst + rate * t``
tokens are ever spent over ``t`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from services.inbox_consumer.throttle import Throttle, split
from shared.adapters.throttles import Override
from shared.cli import throttle as throttle_cli
from shared.contracts.lint import lint_topology
from shared.contracts.topology import DurableSpec, Topology, read_topology
from shared.domain.errors import ConfigurationError
from shared.domain.throttle import (
    MAX_RATE,
    MIN_RATE,
    Limit,
    RateError,
    TokenBucket,
    format_rate,
    parse_rate,
)

PROPERTY = settings(max_examples=300, deadline=None)
ROOT = Path(__file__).resolve().parents[2]
MEDIATION = yaml.safe_load((ROOT / "topologies/mediation.yaml").read_text())


# ---- the rate parser


@pytest.mark.parametrize(
    ("text", "per_second"),
    [("20/s", 20.0), ("300/m", 5.0), ("1/h", 1 / 3600), ("2.5/s", 2.5), (" 7 / S ", 7.0)],
)
def test_rates_read_per_second(text: str, per_second: float) -> None:
    assert parse_rate(text) == pytest.approx(per_second)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (20, "needs a unit"),
        (2.5, "needs a unit"),
        ("20", "needs a unit: write 20/s"),
        ("20/x", "unknown unit 'x'"),
        ("0/s", "below the slowest allowed"),
        ("-1/s", "is not <number>/<unit>"),
        ("1/d", "unknown unit 'd'"),
        ("200000/s", "above the fastest allowed"),
        ("fast", "is not <number>/<unit>"),
        (None, "must be text like 20/s"),
        (True, "must be text like 20/s"),
        (["20/s"], "must be text like 20/s"),
    ],
)
def test_bad_rates_are_refused_saying_how_to_write_one(value: Any, says: str) -> None:
    with pytest.raises(RateError, match=says):
        parse_rate(value)


@PROPERTY
@given(st.one_of(st.text(max_size=30), st.integers(), st.floats(), st.none(), st.booleans()))
def test_any_value_is_a_rate_in_range_or_a_rate_error(value: Any) -> None:
    try:
        rate = parse_rate(value)
    except RateError as exc:
        assert str(exc).startswith("rate")
        return
    assert MIN_RATE <= rate <= MAX_RATE


@PROPERTY
@given(
    st.integers(min_value=1, max_value=10**5),
    st.sampled_from(["s", "m", "h"]),
)
def test_a_rate_printed_reads_back_the_same(count: int, unit: str) -> None:
    try:
        rate = parse_rate(f"{count}/{unit}")
    except RateError:
        return
    assert parse_rate(format_rate(rate)) == pytest.approx(rate, rel=1e-5)


# ---- the token bucket


def test_a_bucket_starts_full_and_refills_at_its_rate() -> None:
    bucket = TokenBucket(Limit.of(5.0, 10), now=0.0)
    assert bucket.available(0.0) == 10
    bucket.take(10, 0.0)
    assert bucket.wait_for(1, 0.0) == pytest.approx(0.2)
    assert bucket.available(1.0) == pytest.approx(5.0)
    assert bucket.available(100.0) == 10  # never more than the burst


def test_no_limit_means_no_wait() -> None:
    bucket = TokenBucket(None, now=0.0)
    bucket.take(10**6, 0.0)
    assert math.isinf(bucket.available(0.0))
    assert bucket.wait_for(1000, 0.0) == 0.0


def test_a_changed_limit_caps_the_tokens_at_the_new_burst() -> None:
    bucket = TokenBucket(Limit.of(100.0, 100), now=0.0)
    bucket.set_limit(Limit.of(1.0, 2), 0.0)
    assert bucket.available(0.0) == 2
    bucket.set_limit(None, 0.0)
    assert math.isinf(bucket.available(0.0))
    bucket.set_limit(Limit.of(1.0, 3), 0.0)  # from no limit: starts full
    assert bucket.available(0.0) == 3


@PROPERTY
@given(
    rate=st.floats(min_value=0.1, max_value=1000),
    burst=st.integers(min_value=1, max_value=100),
    steps=st.lists(
        st.tuples(st.floats(min_value=0, max_value=2), st.integers(min_value=1, max_value=50)),
        max_size=60,
    ),
)
def test_spending_never_outruns_burst_plus_rate_times_time(
    rate: float, burst: int, steps: list[tuple[float, int]]
) -> None:
    """A taker that waits as told, then takes what the bucket allows (as the consumer's
    fetch loop does), spends at most burst + rate * elapsed over any run."""
    bucket = TokenBucket(Limit.of(rate, burst), now=0.0)
    now = spent = 0.0
    for gap, want in steps:
        now += gap
        now += bucket.wait_for(1, now)
        allowed = min(want, math.floor(bucket.available(now) + 1e-9))
        assert allowed >= 1
        bucket.take(allowed, now)
        spent += allowed
        assert spent <= burst + rate * now + 1e-6


def test_limits_refuse_out_of_range_values() -> None:
    with pytest.raises(RateError):
        Limit.of(0.0)
    with pytest.raises(RateError):
        Limit.of(1.0, 0)
    assert Limit.of(2.5).burst == 3  # one second's worth, rounded up
    assert Limit.of(0.01).burst == 1


# ---- the topology fields


def _topology(tmp_path: Path, durable: str, **fields: Any) -> Topology:
    doc = copy.deepcopy(MEDIATION)
    doc["durables"][durable].update(fields)
    path = tmp_path / "mediation.yaml"
    path.write_text(yaml.safe_dump(doc))
    return read_topology(path)


def test_the_shipped_topology_declares_criticality_and_the_replay_throttle() -> None:
    topo = read_topology(ROOT / "topologies/mediation.yaml")
    assert topo.durables["cg_h_publish"].criticality == "high"
    assert topo.durables["cg_h_publish"].throttle is None
    throttle = topo.durables["cg_replay"].throttle
    assert throttle is not None and throttle.limit() == Limit(20.0, 40)
    normal = [n for n, d in topo.durables.items() if d.criticality == "normal"]
    assert sorted(normal) == ["cg_f_ingest", "cg_g_archive", "cg_replay"]


@pytest.mark.parametrize(
    ("fields", "where", "says"),
    [
        ({"throttle": {"rate": "20/x"}}, "durables.cg_replay.throttle.rate", "unknown unit"),
        ({"throttle": {"rate": 20}}, "durables.cg_replay.throttle.rate", "needs a unit"),
        (
            {"throttle": {"rate": "5/s", "burst": 0}},
            "durables.cg_replay.throttle.burst",
            "greater than or equal to 1",
        ),
        ({"throttle": {"burst": 4}}, "durables.cg_replay.throttle.rate", "Field required"),
        ({"throttle": {"rate": "5/s", "every": 1}}, "durables.cg_replay.throttle.every", "Extra"),
        ({"criticality": "urgent"}, "durables.cg_replay.criticality", "'normal' or 'high'"),
    ],
)
def test_invalid_throttles_name_the_file_durable_and_field(
    tmp_path: Path, fields: dict[str, Any], where: str, says: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        _topology(tmp_path, "cg_replay", **fields)
    message = str(caught.value)
    assert f"mediation.yaml: {where}:" in message
    assert says in message


def test_lint_refuses_a_throttle_on_a_high_criticality_durable(tmp_path: Path) -> None:
    topo = _topology(tmp_path, "cg_h_publish", throttle={"rate": "5/s"})
    found = [p for p in lint_topology(topo, source="m.yaml") if p.rule == "criticality-throttle"]
    assert [p.field for p in found] == ["durables.cg_h_publish.throttle"]
    assert "5/s (burst 5) on a criticality: high durable" in found[0].message


def test_lint_allows_high_criticality_with_automatic_replay(tmp_path: Path) -> None:
    topo = _topology(tmp_path, "cg_h_publish", replay="automatic")
    rules = {p.rule for p in lint_topology(topo, source="m.yaml")}
    assert "criticality-throttle" not in rules


# ---- the command's arguments


def test_the_command_reads_rates_and_refuses_bad_ones() -> None:
    assert throttle_cli.rate_argument("5/s") == 5.0
    assert throttle_cli.rate_argument("none") is None
    for bad in ("5", "5/x", "0/s", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            throttle_cli.rate_argument(bad)
    for bad in ("0", "x", "1.5", str(10**6)):
        with pytest.raises(argparse.ArgumentTypeError):
            throttle_cli.burst_argument(bad)


def test_throttle_joins_a_durable_group_another_command_made() -> None:
    parser = argparse.ArgumentParser(prog="ferry")
    sub = parser.add_subparsers(dest="command")
    group = sub.add_parser("durable")
    verbs = group.add_subparsers(dest="durable_command")
    verbs.add_parser("rewind")
    throttle_cli.add_commands(sub)
    args = parser.parse_args(["durable", "throttle", "--durable", "d", "--clear"])
    assert (args.durable_command, args.clear) == ("throttle", True)
    assert parser.parse_args(["durable", "rewind"]).durable_command == "rewind"


# ---- the consumer's throttle (no servers: its limit, window, series)


def _spec(**fields: Any) -> DurableSpec:
    topo = read_topology(ROOT / "topologies/mediation.yaml")
    return topo.durables["cg_replay"].model_copy(update=fields)


def _series(throttle: Throttle) -> str:
    registry = CollectorRegistry()
    registry.register(_Collect(throttle))
    return generate_latest(registry).decode()


class _Collect:
    def __init__(self, throttle: Throttle) -> None:
        self.throttle = throttle

    def collect(self) -> Any:
        return self.throttle.families()


def _override(rate: float | None, burst: int | None = None) -> Override:
    return Override("cg_replay", rate, burst, actor="ops", reason="test")


def test_the_consumer_throttle_follows_overrides_and_exports_what_is_in_force() -> None:
    throttle = Throttle("cg_replay", _spec())
    assert (throttle.source, throttle.limit) == ("topology", Limit(20.0, 40))
    text = _series(throttle)
    assert 'ferry_throttle_rate{durable="cg_replay",source="topology"} 20.0' in text
    assert 'ferry_throttle_burst{durable="cg_replay"} 40.0' in text
    assert 'ferry_throttle_wait_seconds_total{durable="cg_replay"} 0.0' in text
    throttle.apply(_override(5.0))
    assert (throttle.source, throttle.limit) == ("override", Limit(5.0, 5))
    assert 'source="override"} 5.0' in _series(throttle)
    throttle.apply(_override(None))  # --rate none: the topology's limit lifted
    assert (throttle.source, throttle.limit) == ("override", None)
    assert "ferry_throttle_rate{" not in _series(throttle)
    throttle.apply(None)  # cleared
    assert (throttle.source, throttle.limit) == ("topology", Limit(20.0, 40))


def test_the_durables_limit_is_split_among_its_processes() -> None:
    throttle = Throttle("cg_replay", _spec())
    throttle.apply(None, members=3)
    assert throttle.limit == Limit(20.0, 40)  # the durable's
    assert throttle.share == Limit(20.0 / 3, 14)  # this process's part
    assert 'ferry_throttle_processes{durable="cg_replay"} 3.0' in _series(throttle)
    assert 'ferry_throttle_rate{durable="cg_replay",source="topology"} 20.0' in _series(throttle)
    throttle.apply(_override(1.0, 1), members=4)
    assert throttle.share == Limit(0.25, 1)  # at least one token
    throttle.apply(None)  # same members as last time
    assert throttle.share == Limit(5.0, 10)
    assert split(None, 5) is None


def test_the_pull_window_shrinks_with_the_rate() -> None:
    throttle = Throttle("cg_replay", _spec(batch_size=10, ack_wait=120.0))
    assert throttle.window(10) == 10  # 20/s, burst 40: a batch at most
    throttle.apply(_override(2.0, 1))
    assert throttle.window(10) == 1  # the burst
    throttle.apply(_override(1 / 60, 50))
    assert throttle.window(10) == 1  # 1/m: about half an ack_wait's worth, at least one
    throttle.apply(_override(None))
    assert throttle.window(10) == 10


def test_a_high_criticality_durable_ignores_an_override() -> None:
    throttle = Throttle("cg_h_publish", _spec(criticality="high", throttle=None))
    throttle.apply(_override(1.0))
    assert (throttle.source, throttle.limit) == ("none", None)


async def test_admit_hands_out_the_tokens_then_waits_for_the_next() -> None:
    now = [0.0]
    throttle = Throttle("cg_replay", _spec(), clock=lambda: now[0])
    throttle.apply(_override(4.0, 3))
    stop = asyncio.Event()
    assert await throttle.admit(10, stop) == 3
    throttle.spent(3)

    async def later() -> None:
        await asyncio.sleep(0.05)
        now[0] += 0.25  # one token's worth at 4/s: the waiter sees it after its pause

    waker = asyncio.create_task(later())
    assert await asyncio.wait_for(throttle.admit(10, stop), timeout=5) == 1
    await waker
    assert throttle.waited > 0
    stop.set()
    throttle.spent(5)  # in debt
    assert await throttle.admit(10, stop) == 0  # stopped: nothing
