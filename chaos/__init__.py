"""The chaos suite: a Toxiproxy-compatible proxy and the chaos run that drives every role.

* :mod:`chaos.toxiproxy_server` — a TCP proxy with the Toxiproxy HTTP API (``python -m
  chaos.toxiproxy_server``; :mod:`chaos.proxy` and :mod:`chaos.toxics` underneath), used
  when no real ``toxiproxy-server`` is on PATH;
* :mod:`chaos.launcher` — starts whichever Toxiproxy is available;
* :mod:`chaos.run` — the chaos run (``python -m chaos.run --schedule ci|soak|custom``):
  :mod:`chaos.world` (servers, proxies, roles), :mod:`chaos.schedule` (the plans),
  :mod:`chaos.workload` (events and the intent ledger), :mod:`chaos.faults` and
  :mod:`chaos.stall` (injecting faults), :mod:`chaos.accounting` (the invariants).
"""
