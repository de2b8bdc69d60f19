"""``ordering``: per-key order under kills, restarts, scaling, dead letters and replays
(:mod:`chaos.scenarios.ordering.play`; its workload and count beside it)."""
