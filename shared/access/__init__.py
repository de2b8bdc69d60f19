"""Access: who each role is and what it may touch, and the JetStream objects it needs.

Identities and the secrets folder (:mod:`.identities`), NATS users and permissions
(:mod:`.nats_auth`), PostgreSQL login roles and grants (:mod:`.db_roles`), streams and
consumers provisioned from the topology (:mod:`.streams`), and the Kubernetes init step
that copies a secret privately (:mod:`.secret_copy`). Above :mod:`shared.adapters`: it
hands out the adapters' credentials (:class:`~shared.adapters.nats.NatsAuth`).
"""
