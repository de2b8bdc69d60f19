"""The configuration lint: settings that would lose or duplicate messages, refused early.

Every role runs it on its topology when it starts (:func:`require_clean_topology`, exit
code 2 on a finding), ``ferry lint`` runs it by hand, and ``ferry registry check`` (CI)
runs it on every shipped topology. Each finding names the file, the field and the rule:

    topologies/sea-vibespro.yaml: durables.sea__from_vibespro.max_deliver: 3 is shorter
    than the back-off ladder (5 steps) ... [max-deliver]

Rules (what each protects against):

``duplicate-window``
    A stream's duplicate window must cover the outbox-publisher's re-publish horizon, or
    a row re-published after a lost PubAck or a crash lands in the stream twice.
``inbox-retention``
    A context's ``inbox_retention`` must outlast every way a copy can still arrive: the
    source stream's ``max_age``, the redelivery horizon (every attempt and back-off) and
    the replay horizon (dead letters kept for their stream's ``max_age``, automatic replay
    schedule). A copy arriving after its inbox row is purged is processed twice.
``claims-retention``
    A context's ``claims_retention`` (the handler SDK's ``handler_applied``) must outlast
    the same horizons: a copy arriving after its claim is purged is applied twice.
``handler-timeout``
    Without heartbeats the handler timeout must stay below ``ack_wait``: otherwise
    JetStream redelivers a message whose handler is still running.
``max-deliver``
    ``max_deliver`` must be finite and at least the back-off ladder's length: unlimited
    redelivery retries a poison message forever, and a shorter one never reaches the
    ladder's last steps (the message is dead-lettered earlier than the ladder promises).
``ack-pending``
    ``max_ack_pending`` must hold at least two batches: the consumer pulls the next batch
    while one is in process (``FERRY_PIPELINE``), and a second replica needs room to pull
    at all. With one batch's worth, replicas take turns and each waits for the other's
    acks (measured: two replicas drained 13 times slower than one).
``dead-letter-stream``
    Every durable's dead-letter subject must be captured by a dead-letter stream (and by
    no event stream): otherwise a dead letter cannot be stored and its message is retried
    forever. Dead-letter streams themselves only take limits retention (the topology model
    refuses any other when the file is loaded), so a record never vanishes once read.
``naming``
    Durables are named ``{target}__from_{source}`` or INFRA-005's ``cg_<stage>``; stream
    subjects stay inside the context's namespace; filters are ``{ns}.>`` or
    ``{ns}.{event|*}.{vN|*}``; dead-letter subjects are the target context's
    ``dead_letter_subject`` (optionally ``.{durable}``). Names are how operators, metrics
    and the dlq tools find things. On a partitioned stream an unordered durable's filter
    ends in the partition token (``{ns}.{event|*}.{vN|*}.*``).
``ordering-replay``
    ``ordering: key`` with ``on_dead_letter: skip`` and ``replay: automatic`` cannot keep
    order: the key's later events go on past the dead letter, and the automatic replay of
    it then arrives after them — order broken twice, with no operator to decide. Use
    ``on_dead_letter: hold`` (the key waits for the replay) or ``replay: operator``.
``ordering-key-field``
    An event's ``ordering_key`` must name a property its schema requires, at every level
    of the dotted path, of type string or integer: otherwise a valid payload can lack its
    key (the publisher would set the row aside) or carry one that is not a scalar.
``ordering-unused``
    ``on_dead_letter`` on a durable with ``ordering: none`` has no effect: nothing is held
    or skipped after a dead letter of an unordered durable. Declare ``ordering: key`` or
    drop the field.
``criticality-throttle``
    A ``criticality: high`` durable may not declare a ``throttle``: a rate limit on a
    critical lane (INFRA-005 §7: "H publish: low frequency but high criticality") holds its
    messages back exactly when they matter, and its lag alert would fire on the throttle.
    Throttles are for non-critical lanes (§7.3: replay, non-critical publish jobs).
    (``criticality: high`` with ``replay: automatic`` is allowed: the first dead letter still
    pages, and the automatic replay only shortens the outage.)

Coverage gates on the declared events (the manifests, via the registry):

``missing-manifests``
    A topology with no declared events would dead-letter everything it receives.
``unreceived-event``
    A context handles an event but no durable targeting it filters the event's subject:
    the event never reaches the handler.
``unhandled-event``
    A context publishes an event version no context handles: its messages reach nobody.
``unexpected-delivery``
    A durable's filter delivers an event to a context that has no handler for it: every
    such message would be dead-lettered as ``UNKNOWN_EVENT``.

The lint is split by what the code does: :mod:`shared.contracts.lint_findings` (a finding,
:class:`Problem`, and :func:`format_duration`), :mod:`shared.contracts.lint_horizons` (the
publisher's timing and the redelivery and replay horizons), :mod:`shared.contracts.lint_rules`
(the setting rules), :mod:`shared.contracts.lint_ordering` (the ordering rules) and
:mod:`shared.contracts.lint_coverage` (the coverage gates). This module runs them all
(:func:`lint_topology`) and re-exports the public names of the others.
"""

from __future__ import annotations

from pathlib import Path

from shared.contracts.lint_coverage import coverage_problems as coverage_problems
from shared.contracts.lint_coverage import event_subject_of as event_subject_of
from shared.contracts.lint_findings import Problem as Problem
from shared.contracts.lint_findings import format_duration as format_duration
from shared.contracts.lint_horizons import PublisherTiming as PublisherTiming
from shared.contracts.lint_horizons import automatic_replay_span as automatic_replay_span
from shared.contracts.lint_horizons import redelivery_horizon as redelivery_horizon
from shared.contracts.lint_horizons import replay_horizon as replay_horizon
from shared.contracts.lint_ordering import ordering
from shared.contracts.lint_ordering import ordering_key_defect as ordering_key_defect
from shared.contracts.lint_retention import claims_retention
from shared.contracts.lint_rules import (
    ack_pending,
    criticality,
    dead_letter_streams,
    duplicate_window,
    handler_timeout,
    inbox_retention,
    max_deliver,
    naming,
)
from shared.contracts.topology import Topology
from shared.domain.errors import ConfigurationError


def lint_topology(
    topology: Topology, *, source: str, publisher: PublisherTiming | None = None
) -> list[Problem]:
    """Every lint finding and coverage-gate failure of ``topology``, sorted."""
    timing = publisher or PublisherTiming.defaults()
    problems = [
        *duplicate_window(topology, source, timing),
        *inbox_retention(topology, source),
        *claims_retention(topology, source),
        *handler_timeout(topology, source),
        *max_deliver(topology, source),
        *ack_pending(topology, source),
        *dead_letter_streams(topology, source),
        *naming(topology, source),
        *ordering(topology, source),
        *criticality(topology, source),
        *coverage_problems(topology, source=source),
    ]
    return sorted(problems)


def require_clean_topology(
    topology: Topology, *, source: str | Path, publisher: PublisherTiming | None = None
) -> None:
    """Raise :class:`ConfigurationError` listing every finding; a role calls it at start."""
    problems = lint_topology(topology, source=str(source), publisher=publisher)
    if problems:
        lines = "\n".join(str(p) for p in problems)
        raise ConfigurationError(
            f"topology {topology.name!r} fails the configuration lint "
            f"({len(problems)} finding(s); `ferry lint` explains):\n{lines}"
        )
