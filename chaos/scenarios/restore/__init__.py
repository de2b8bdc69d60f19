"""``restore``: a restore drill of one context's database while the workload runs
(:mod:`chaos.scenarios.restore.play`; its settings, database steps and count beside it)."""
