"""The measurements, one coroutine per section of the table.

Every Ferry measurement runs the roles as processes on a fresh :class:`Deployment`;
every count that decides a figure is read back from the databases or the stream, not
from what the bench believes it sent.

    base         the run's options and state (:class:`Bench`), the shared helpers
    baselines    raw JetStream, PostgreSQL and HTTP figures; two again at the end
    drains       backlog drains: the publisher alone, end to end, batch calls, order
                 (each kind's topology in drains_kinds, per-key order in drains_order)
    steps        one fixed-rate step: the producer, the pipeline waited out, latencies
    latency      fixed offered loads, and the highest sustained rate
    bare_bones   the bare-bones pipeline, the yardstick of latency and sustained
    mediation    lanes E→F and F→G together
    peer         faststream-outbox, the closest Python peer
    soak         resident memory over a long steady run
    retention_soak  database sizes and memory over a long run with short retention
    tls          drains and latency with TLS off and on (issue 47)
    volume       every hot path on empty tables and after a year of history (issue 48)
"""

from bench.sections.bare_bones import prototype
from bench.sections.base import Bench, Options, fill_outbox
from bench.sections.baselines import baselines, baselines_again
from bench.sections.drains import (
    batch_drain,
    count_order_violations,
    e2e_drain,
    finish_ordered_ratio,
    ordered_drain,
    publisher_drain,
)
from bench.sections.latency import latency
from bench.sections.mediation import mediation
from bench.sections.peer import finish_peer_ratio, peer
from bench.sections.retention_soak import retention_soak
from bench.sections.soak import soak
from bench.sections.tls import tls
from bench.sections.volume import volume

__all__ = [
    "Bench",
    "Options",
    "baselines",
    "baselines_again",
    "batch_drain",
    "count_order_violations",
    "e2e_drain",
    "fill_outbox",
    "finish_ordered_ratio",
    "finish_peer_ratio",
    "latency",
    "mediation",
    "ordered_drain",
    "peer",
    "prototype",
    "publisher_drain",
    "retention_soak",
    "soak",
    "tls",
    "volume",
]
