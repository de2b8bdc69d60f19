"""The chaos suite: a Toxiproxy-compatible proxy and the chaos runs that drive every role.

* :mod:`chaos.toxiproxy_server` — a TCP proxy with the Toxiproxy HTTP API (``python -m
  chaos.toxiproxy_server``; :mod:`chaos.proxy` and :mod:`chaos.toxics` underneath), used
  when no real ``toxiproxy-server`` is on PATH; :mod:`chaos.launcher` starts whichever
  Toxiproxy is available;
* :mod:`chaos.run` — the command (``python -m chaos.run [--schedule ci|soak|custom]
  [--scenario NAME]``); :mod:`chaos.registry` maps each ``--scenario`` name to the package
  of :mod:`chaos.scenarios` that runs it;
* :mod:`chaos.engine` — what every run shares: the world (servers, proxies, roles), the
  workload and its ledger, the faults, the engine that plays, drains and counts, the
  invariants, and the result writer.
"""
