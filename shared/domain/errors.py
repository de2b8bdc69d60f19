"""Error kinds shared by every role.

Two families matter at runtime (STYLE.md §7): :class:`TransientError` (retry later,
nothing is wrong with the message) and :class:`PoisonError` (the message itself can
never succeed). Validation errors carry the policy's error code so an operator can
look them up in SDS-047.
"""

from __future__ import annotations


class FerryError(Exception):
    """Base class of every error Ferry raises on purpose."""


class ConfigurationError(FerryError):
    """Settings or topology are wrong; the process cannot do its job until fixed."""


class TransientError(FerryError):
    """A dependency failed in a way that may heal by itself (network, restart)."""


class PoisonError(FerryError):
    """The message can never be processed as it is.

    ``reason_code`` is a stable, machine-readable code (e.g. ``MALFORMED_JSON``).
    """

    def __init__(self, reason_code: str, detail: str) -> None:
        super().__init__(f"{reason_code}: {detail}")
        self.reason_code = reason_code
        self.detail = detail


class MalformedInput(FerryError, ValueError):
    """Text from outside (a peer, a file, an operator) that does not parse as the value it
    must be: a timestamp, a duration, a size. A ``ValueError`` too, so validators that
    turn ``ValueError`` into their own report (pydantic) keep doing so.
    """


class OutboxValidationError(FerryError, ValueError):
    """An event was refused by the producer API before anything was written.

    ``code`` is the SDS-047 error code (``INVALID_OUTBOX``, ``FUTURE_EVENT``,
    ``INVALID_SUBJECT``), ``field`` names the offending argument.
    """

    def __init__(self, code: str, field: str, reason: str) -> None:
        super().__init__(f"{code}: {field}: {reason}")
        self.code = code
        self.field = field
        self.reason = reason


class AccessDenied(ConfigurationError):
    """A server refused this process's credentials (wrong user, password or certificate).

    A configuration error, but reported as "cannot connect" (exit 3): the process is fine,
    its secret or the server's authorization is not.
    """
