"""The chaos suite: a Toxiproxy-compatible proxy and the chaos run that drives every role.

* :mod:`chaos.toxiproxy_server` — a TCP proxy with the Toxiproxy HTTP API (``python -m
  chaos.toxiproxy_server``), used when no real ``toxiproxy-server`` is on PATH;
* :mod:`chaos.launcher` — starts whichever Toxiproxy is available;
* :mod:`chaos.run` — the chaos run (``python -m chaos.run --seconds N --seed S``).
"""
