"""The ordinary chaos run (``python -m chaos.run [--schedule ci|soak|custom]``): the faults of
a seeded schedule while the workload runs (:mod:`chaos.scenarios.fault_schedule.run`)."""
