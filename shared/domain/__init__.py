"""The pure domain: envelope, subjects, ACK rules, back-off, error codes.

Imports only the standard library and pydantic, so it is fast to test exhaustively.
"""
