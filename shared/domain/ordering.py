"""Per-key ordering (INFRA-005 §5.3): an event's ordering key, its partition, and the
partition token of subjects.

A durable declared ``ordering: key`` hands the events of one key to its handler one at a
time, in stream order. The key is the event's aggregate (``aggregate_type/aggregate_id``)
unless its manifest names a payload field (``ordering_key: config_id``).

A stream declared with ``partitions: N > 1`` carries the key's partition as the last token
of every subject: ``{namespace}.{event_type}.v{n}.{partition}``. The publisher adds it —
the key is not a subject token, so NATS's own ``partition()`` mapping could not see it
without putting (and escaping) aggregate ids into subjects — and everything else (the
consumer, the replayer, ``ferry where``) computes the same partition with
:func:`partition_of`, a stable FNV-1a hash that does not depend on the process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: Most partitions a stream may declare.
MAX_PARTITIONS = 1024
_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193

#: Lifetime (s) of one pull request of an ``ordering: key`` partition consumer: short,
#: because a replica that lost its partition's lease (cut off from NATS too) may leave
#: requests the server still serves until they expire, and a message delivered into them
#: is redeliverable only ``ack_wait`` later; the partition lease must outlast both
#: (services/inbox_consumer/partitions.py). The consumer renews an expired one at once.
ORDERED_PULL_LIFETIME = 1.0


class OrderingKeyError(ValueError):
    """The event lacks the field its ordering key is read from (or it is not a scalar)."""


def ordering_key(doc: Mapping[str, Any], field: str | None = None) -> str:
    """The ordering key of an envelope document (its ``to_dict()`` form or the wire JSON).

    Without ``field``: ``aggregate_type/aggregate_id``. With ``field``: the payload value at
    that dotted path (``config_id``, ``target.id``), a string or an integer.
    """
    if field is None:
        kind, ident = doc.get("aggregate_type"), doc.get("aggregate_id")
        if not isinstance(kind, str) or not isinstance(ident, str) or not kind or not ident:
            raise OrderingKeyError("aggregate_type and aggregate_id must be non-empty strings")
        return f"{kind}/{ident}"
    node: Any = doc.get("payload")
    for part in field.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise OrderingKeyError(f"payload has no field {field!r} (the ordering key)")
        node = node[part]
    if isinstance(node, bool) or not isinstance(node, (str, int)) or node == "":
        raise OrderingKeyError(
            f"payload field {field!r} (the ordering key) must be a string or an integer"
        )
    return str(node)


def partition_of(key: str, partitions: int) -> int:
    """The partition (``0..partitions-1``) of ``key``: FNV-1a (32 bit) of its UTF-8 bytes."""
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ValueError(f"partitions must be within 1..{MAX_PARTITIONS}, not {partitions}")
    digest = _FNV_OFFSET
    for byte in key.encode("utf-8", "surrogatepass"):
        digest = ((digest ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return digest % partitions


def partitioned_subject(subject: str, partition: int) -> str:
    """``subject`` with its partition token appended."""
    return f"{subject}.{partition}"


def split_partition(subject: str) -> tuple[str, int | None]:
    """``(subject without its partition token, partition)``; ``(subject, None)`` when the
    last token is not a partition (a subject ending in ``.v<n>``, a replay subject)."""
    head, _, last = subject.rpartition(".")
    if head and last.isascii() and last.isdigit() and len(last) <= 4:
        return head, int(last)
    return subject, None


def consumer_name(durable: str, partition: int, partitions: int) -> str:
    """The JetStream consumer of one partition of ``durable`` (the durable itself when the
    stream has one partition)."""
    return durable if partitions == 1 else f"{durable}_p{partition}"


def durable_of_consumer(name: str, durables: Mapping[str, Any] | set[str]) -> str | None:
    """The durable a JetStream consumer name belongs to (``x_p3`` → ``x``), or None."""
    if name in durables:
        return name
    head, sep, tail = name.rpartition("_p")
    if sep and tail.isascii() and tail.isdigit() and head in durables:
        return head
    return None


class PartitionFilterError(ValueError):
    """A filter subject that cannot be narrowed to one partition (the message says why)."""


def _event_tokens(pattern: str, namespace: str) -> list[str]:
    """The tokens of ``pattern`` after ``namespace``; refuse what no partition rule fits."""
    prefix = namespace + "."
    if not pattern.startswith(prefix):
        raise PartitionFilterError(
            f"{pattern!r} is outside the namespace {namespace}: only the namespace's own "
            "subjects carry a partition token"
        )
    tokens = pattern[len(prefix) :].split(".")
    if any(not t for t in tokens) or ">" in tokens[:-1]:
        raise PartitionFilterError(f"{pattern!r} is not a valid NATS subject filter")
    return tokens


def _shape_error(pattern: str, namespace: str) -> PartitionFilterError:
    return PartitionFilterError(
        f"{pattern!r} cannot be read per partition: a partitioned stream's subjects are "
        f"{namespace}.<event_type>.v<n>.<partition>, so write {namespace}.>, "
        f"{namespace}.<event_type|*>.> or {namespace}.<event_type|*>.<vN|*>"
    )


def partition_filter(pattern: str, namespace: str, partition: int) -> str:
    """``pattern`` (a filter on the namespace's event subjects) narrowed to ``partition``.

    ``{ns}.>`` → ``{ns}.*.*.{k}``, ``{ns}.t.>`` → ``{ns}.t.*.{k}``, ``{ns}.t.v1`` (and its
    all-partition forms ``{ns}.t.v1.*`` / ``{ns}.t.v1.>``) → ``{ns}.t.v1.{k}``; ``*``
    tokens are kept. Anything else raises :class:`PartitionFilterError`.
    """
    if partition < 0:
        raise ValueError(f"a partition is never negative, not {partition}")
    tokens = _event_tokens(pattern, namespace)
    token = str(partition)
    if tokens == [">"]:
        narrowed = ["*", "*", token]
    elif len(tokens) == 2 and tokens[1] == ">":
        narrowed = [tokens[0], "*", token]
    elif len(tokens) == 2:
        narrowed = [*tokens, token]
    elif len(tokens) == 3 and tokens[2] in ("*", ">"):
        narrowed = [*tokens[:2], token]
    elif len(tokens) == 3 and tokens[2].isascii() and tokens[2].isdigit():
        raise PartitionFilterError(
            f"{pattern!r} names a partition itself: partitions are chosen by the ordering "
            "key, so filter on the event (the consumer of each partition narrows it)"
        )
    else:
        raise _shape_error(pattern, namespace)
    return ".".join([namespace, *narrowed])


def partition_filters(filter_subjects: Sequence[str], namespace: str, partition: int) -> list[str]:
    """Every filter of a durable narrowed to ``partition`` (see :func:`partition_filter`),
    without repeats, in order."""
    narrowed = (partition_filter(p, namespace, partition) for p in filter_subjects)
    return list(dict.fromkeys(narrowed))


def all_partitions_filter(pattern: str, namespace: str) -> str:
    """The form of ``pattern`` that matches the events it names on every partition.

    ``{ns}.>``, ``{ns}.t.>``, ``{ns}.t.v1.*`` and ``{ns}.t.v1.>`` already do and come
    back unchanged; ``{ns}.t.v1`` becomes ``{ns}.t.v1.*``. A filter of an unordered
    durable on a partitioned stream must be written in this form.
    """
    tokens = _event_tokens(pattern, namespace)
    if tokens[-1] == ">" and len(tokens) <= 3:
        return pattern
    if len(tokens) == 2:
        return f"{pattern}.*"
    if len(tokens) == 3 and tokens[2] == "*":
        return pattern
    if len(tokens) == 3 and tokens[2].isascii() and tokens[2].isdigit():
        raise PartitionFilterError(
            f"{pattern!r} names a partition itself: partitions are chosen by the ordering "
            "key; filter on the event with '*' as the partition token"
        )
    raise _shape_error(pattern, namespace)


def partition_replay_subject(replay_subject: str, partition: int | None) -> str:
    """A durable's replay subject (``ferry.replay.{STREAM}.{durable}``) for one partition
    (``….{k}``), or unchanged when ``partition`` is None (one consumer takes every replay)."""
    return replay_subject if partition is None else f"{replay_subject}.{partition}"
