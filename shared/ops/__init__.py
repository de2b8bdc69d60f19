"""Ops: the use-cases the operator's tools run, one module (and its parts) each.

The ``ferry`` command (:mod:`shared.cli`) and the console (services/console) call the same
functions: finding, showing, replaying, parking and discarding dead letters (:mod:`.dlq`),
parked keys (:mod:`.parked`), one event's journey (:mod:`.where`, rendered as text by
:mod:`.where_render`), rewinding a durable (:mod:`.rewind`), its throttle
(:mod:`.throttle`), set-aside outbox rows (:mod:`.outbox`), retention (:mod:`.purge`),
the handler conformance checks (:mod:`.handler_check`), a handler's payload models
(:mod:`.handler_models`) and the replay API's job worker (:mod:`.replay_jobs`, which the
handler role hosts). No argparse and no printing here: each returns its result or raises.
"""
