"""Ops: the ``ferry`` operator command (:mod:`.cli`) and its subcommands, one module each.

``ferry dlq`` (:mod:`.dlq`), ``ferry where`` (:mod:`.where`), ``ferry purge``
(:mod:`.purge`), ``ferry registry``/``ferry lint`` (:mod:`.registry`) and ``ferry
nats-auth``/``ferry db-roles`` (:mod:`.access`). The top layer: nothing imports it.
"""
