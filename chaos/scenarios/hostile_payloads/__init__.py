"""``hostile-payloads``: plain-SQL INSERTs at and around every limit (:mod:`.cases`), the
scenario itself in :mod:`chaos.scenarios.hostile_payloads.play`."""
