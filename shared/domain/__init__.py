"""The pure domain: envelope, subjects, ACK rules, back-off, policy, error codes, ports.

Imports only the standard library (``lint-imports`` enforces it), so it is fast to test
exhaustively.
"""
