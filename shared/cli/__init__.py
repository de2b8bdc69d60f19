"""The ``ferry`` operator command: the command layer over :mod:`shared.ops`.

:mod:`.main` is the entry point (``ferry``, ``python -m shared.cli``): the parser and the
exit codes. Each command group has a module of its own holding its argparse declaration
and its run and render functions — ``ferry dlq`` (:mod:`.dlq`, :mod:`.dlq_read`,
:mod:`.dlq_change`), ``ferry where`` (:mod:`.where`), ``ferry durable rewind``
(:mod:`.rewind`) and ``throttle`` (:mod:`.throttle`), ``ferry outbox`` (:mod:`.outbox`),
``ferry parked`` (:mod:`.parked`), ``ferry purge`` (:mod:`.purge`), ``ferry registry``,
``lint`` and ``asyncapi`` (:mod:`.registry`), ``ferry nats-auth`` and ``db-roles``
(:mod:`.access`), ``ferry handler-check`` (:mod:`.handler_check`) and ``ferry
handler-models`` (:mod:`.handler_models`); :mod:`.audit_args` holds the argument types
they share. The use-cases they run live in :mod:`shared.ops` (the console calls the same
ones). The top layer of ``shared``: no role and not the console imports it.
"""
