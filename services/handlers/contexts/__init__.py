"""The example handler services, one module per target context (named after it)."""
