"""``hostile-handler``: a hostile front before each handler (:mod:`.front`), its answers
counted (:mod:`.answers`), the scenario itself in :mod:`chaos.scenarios.hostile_handler.play`."""
