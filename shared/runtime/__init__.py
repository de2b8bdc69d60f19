"""Runtime: what every role's process needs around its behaviour.

Settings from the environment (:mod:`.settings`), JSON logs (:mod:`.logs`), readiness
checks (:mod:`.readiness`), the health and metrics endpoint (:mod:`.health`), the
Prometheus metrics (:mod:`.metrics`), the connections a topology-wide role opens
(:mod:`.connections`) and the one role lifecycle: signals, drain deadline, exit codes
(:mod:`.lifecycle`).
"""
