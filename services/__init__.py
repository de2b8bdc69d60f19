"""One package per role; each runs as ``python -m services.<role>``."""
