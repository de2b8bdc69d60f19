"""Adapters: the only code that touches PostgreSQL, NATS and HTTP.

Driver exceptions are translated here into :mod:`shared.domain.errors` kinds.
"""
