"""``pg-failover``: the PostgreSQL primary SIGKILLed mid-workload, the synchronous standby
promoted (:mod:`chaos.scenarios.pg_failover.run`)."""
