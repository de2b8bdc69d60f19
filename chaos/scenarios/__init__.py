"""The chaos scenarios, one package each; :mod:`chaos.registry` maps each ``--scenario`` name
to the one that runs it."""
