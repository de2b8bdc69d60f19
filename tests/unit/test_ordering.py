"""Per-key ordering's pure parts: keys, partitions, partition tokens, per-partition filters.

The filter properties are checked against NATS's own matching rule
(:func:`shared.contracts.topology.subject_matches`): a partition's filter takes exactly the
events the durable's filter names, on that partition and no other.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.contracts.topology import subject_matches
from shared.domain.ordering import (
    MAX_PARTITIONS,
    OrderingKeyError,
    PartitionFilterError,
    all_partitions_filter,
    consumer_name,
    durable_of_consumer,
    ordering_key,
    partition_filter,
    partition_filters,
    partition_of,
    partition_replay_subject,
    partitioned_subject,
    split_partition,
)
from tests.unit.hostile_values import hostile_text

PROPERTY = settings(max_examples=300, deadline=None)
namespaces = st.from_regex(r"[a-z][a-z0-9_]{0,8}(\.[a-z][a-z0-9_]{0,8}){0,3}", fullmatch=True)
event_types = st.sampled_from(["a", "b", "vibe_created", "config_publish_requested"])
versions = st.integers(min_value=1, max_value=3)
counts = st.integers(min_value=2, max_value=16)
NS = "mediation.f_to_g.archive"


@st.composite
def logical_filters(draw: st.DrawFn, namespace: str) -> str:
    """A filter an operator may write for a durable on a partitioned stream."""
    event = draw(st.sampled_from(["*", "a", "b", "vibe_created"]))
    version = draw(st.sampled_from(["*", "v1", "v2", "v3"]))
    shape = draw(st.sampled_from(["all", "event>", "ev", "ev*", "ev>"]))
    tail = {
        "all": ">",
        "event>": f"{event}.>",
        "ev": f"{event}.{version}",
        "ev*": f"{event}.{version}.*",
        "ev>": f"{event}.{version}.>",
    }[shape]
    return f"{namespace}.{tail}"


# --- partition token --------------------------------------------------------------------


@given(namespaces, event_types, versions, st.integers(0, MAX_PARTITIONS - 1))
@PROPERTY
def test_the_partition_token_round_trips(ns: str, event: str, version: int, k: int) -> None:
    subject = f"{ns}.{event}.v{version}"
    assert split_partition(partitioned_subject(subject, k)) == (subject, k)
    assert split_partition(subject) == (subject, None)


@given(hostile_text)
@PROPERTY
def test_split_partition_takes_any_text(text: str) -> None:
    head, k = split_partition(text)
    if k is None:
        assert head == text
    else:
        assert 0 <= k <= 9999 and f"{head}.{text.rpartition('.')[2]}" == text


def test_replay_subjects_and_non_digit_tokens() -> None:
    assert split_partition("ferry.replay.S.cg_g_archive.3") == ("ferry.replay.S.cg_g_archive", 3)
    assert split_partition("ferry.replay.S.cg_g_archive") == ("ferry.replay.S.cg_g_archive", None)
    assert split_partition("a.b.v1.٣") == ("a.b.v1.٣", None)  # not an ASCII digit
    assert split_partition("a.b.v1.12345") == ("a.b.v1.12345", None)  # past MAX_PARTITIONS
    assert partition_replay_subject("ferry.replay.S.d", 2) == "ferry.replay.S.d.2"
    assert partition_replay_subject("ferry.replay.S.d", None) == "ferry.replay.S.d"


# --- keys and partitions ----------------------------------------------------------------


def test_ordering_key_is_the_aggregate_or_a_payload_field() -> None:
    doc = {
        "aggregate_type": "config",
        "aggregate_id": "c-1",
        "payload": {"config_id": "cfg", "n": 7, "target": {"id": 3}, "flag": True},
    }
    assert ordering_key(doc) == "config/c-1"
    assert ordering_key(doc, "config_id") == "cfg"
    assert ordering_key(doc, "n") == "7"
    assert ordering_key(doc, "target.id") == "3"
    for field in ("missing", "target.name", "flag", "target"):
        with pytest.raises(OrderingKeyError):
            ordering_key(doc, field)
    with pytest.raises(OrderingKeyError):
        ordering_key({"aggregate_type": "config", "aggregate_id": ""})


@given(st.text(), counts)
@PROPERTY
def test_partition_of_is_stable_and_in_range(key: str, count: int) -> None:
    k = partition_of(key, count)
    assert 0 <= k < count and k == partition_of(key, count)
    assert partition_of(key, 1) == 0


def test_partition_of_is_fnv1a_and_spreads_keys() -> None:
    # FNV-1a 32 of "a" is 0xe40c292c: the same in every process and every language.
    assert partition_of("a", MAX_PARTITIONS) == 0xE40C292C % MAX_PARTITIONS
    spread = [0] * 4
    for n in range(4000):
        spread[partition_of(f"opportunity/opp-{n}", 4)] += 1
    assert min(spread) > 800, spread
    with pytest.raises(ValueError):
        partition_of("a", 0)


def test_consumer_names_map_back_to_their_durable() -> None:
    durables = {"cg_g_archive", "cg_p"}
    assert consumer_name("cg_g_archive", 3, 4) == "cg_g_archive_p3"
    assert consumer_name("cg_g_archive", 0, 1) == "cg_g_archive"
    assert durable_of_consumer("cg_g_archive_p3", durables) == "cg_g_archive"
    assert durable_of_consumer("cg_g_archive", durables) == "cg_g_archive"
    assert durable_of_consumer("cg_p", durables) == "cg_p"  # a durable whose name ends _p
    assert durable_of_consumer("cg_p_p0", durables) == "cg_p"
    assert durable_of_consumer("other_p1", durables) is None
    assert durable_of_consumer("cg_g_archive_px", durables) is None


# --- filters ----------------------------------------------------------------------------


def test_partition_filters_by_example() -> None:
    assert partition_filters([f"{NS}.>"], NS, 2) == [f"{NS}.*.*.2"]
    assert partition_filters([f"{NS}.t.v1"], NS, 0) == [f"{NS}.t.v1.0"]
    assert partition_filters([f"{NS}.*.v1.*"], NS, 3) == [f"{NS}.*.v1.3"]
    assert partition_filters([f"{NS}.t.>"], NS, 1) == [f"{NS}.t.*.1"]
    assert partition_filters([f"{NS}.t.v1", f"{NS}.t.v1.*"], NS, 1) == [f"{NS}.t.v1.1"]
    assert all_partitions_filter(f"{NS}.>", NS) == f"{NS}.>"
    assert all_partitions_filter(f"{NS}.t.v1", NS) == f"{NS}.t.v1.*"
    assert all_partitions_filter(f"{NS}.t.v1.*", NS) == f"{NS}.t.v1.*"


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        ("other.ns.>", "outside the namespace"),
        (f"{NS}.t", "cannot be read per partition"),
        (f"{NS}.t.v1.2", "names a partition itself"),
        (f"{NS}.t.v1.x.y", "cannot be read per partition"),
        (f"{NS}.>.v1", "not a valid NATS subject filter"),
        (f"{NS}..v1", "not a valid NATS subject filter"),
    ],
)
def test_filters_no_partition_rule_fits_are_refused(pattern: str, says: str) -> None:
    with pytest.raises(PartitionFilterError, match=says):
        partition_filter(pattern, NS, 0)
    with pytest.raises(PartitionFilterError, match=says):
        all_partitions_filter(pattern, NS)


@given(
    st.data(),
    namespaces,
    event_types,
    versions,
    counts,
)
@PROPERTY
def test_a_partition_filter_takes_its_events_on_its_partition_only(
    data: st.DataObject, ns: str, event: str, version: int, count: int
) -> None:
    pattern = data.draw(logical_filters(ns))
    everywhere = all_partitions_filter(pattern, ns)
    subject = f"{ns}.{event}.v{version}"
    named = subject_matches(everywhere, f"{subject}.0")
    # The logical filter names the same events as its all-partition form (where it has one).
    if not pattern.endswith(">"):
        # Without its partition wildcard, if it has one: ns + type + version + partition.
        tokens = pattern.split(".")
        has_partition = len(tokens) == len(ns.split(".")) + 3
        logical = ".".join(tokens[:-1]) if has_partition else pattern
        assert subject_matches(logical, subject) == named
    for k in range(count):
        narrowed = partition_filter(pattern, ns, k)
        for j in range(count):
            wire = partitioned_subject(subject, j)
            assert subject_matches(narrowed, wire) == (named and j == k)
            assert subject_matches(everywhere, wire) == named
        assert not subject_matches(narrowed, subject)  # never a subject without a token


@given(st.data(), namespaces, counts)
@PROPERTY
def test_partition_filters_never_overlap(data: st.DataObject, ns: str, count: int) -> None:
    patterns = data.draw(st.lists(logical_filters(ns), min_size=1, max_size=4))
    by_partition = [partition_filters(patterns, ns, k) for k in range(count)]
    for k, filters in enumerate(by_partition):
        assert len(filters) == len(set(filters))
        assert all(f.endswith(f".{k}") for f in filters)


@given(hostile_text, st.integers(0, 9))
@PROPERTY
def test_any_filter_text_gives_a_filter_or_the_error(text: str, k: int) -> None:
    for attempt in (lambda: partition_filter(text, NS, k), lambda: all_partitions_filter(text, NS)):
        try:
            result = attempt()
        except PartitionFilterError:
            continue
        assert result.startswith(NS + ".")
