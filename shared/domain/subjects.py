"""The subject rule (REQ-057, ADR-032): ``{namespace}.{snake_case_name}.v{n}``.

For SEA and VibesPro the namespace is ``{context}.event``; the Mediation lanes keep
INFRA-005's names (``mediation.e_to_f.events``). Either way the last two tokens are
the event type in snake_case and its version, so one parser serves both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shared.domain.errors import OutboxValidationError

# ``\Z``, not ``$``: ``$`` also matches before a trailing newline, which let
# "vibe_created\n" through as snake_case.
SNAKE_CASE = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)*\Z")
NAMESPACE = re.compile(r"^[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)*\Z")
_VERSION = re.compile(r"^v([1-9][0-9]*)\Z")
#: A version beyond this is almost certainly a bug (a timestamp, a counter).
MAX_EVENT_VERSION = 1000
#: Digits of the largest version: a longer one is refused before it becomes an int (a
#: version of 5,000 digits would exceed Python's int-from-text limit).
_MAX_VERSION_DIGITS = len(str(MAX_EVENT_VERSION))


def _shown(value: str) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True, slots=True)
class EventSubject:
    """A parsed event subject."""

    namespace: str
    event_type: str
    version: int

    def __str__(self) -> str:
        return f"{self.namespace}.{self.event_type}.v{self.version}"


def validate_event_type(event_type: object) -> str:
    """Return ``event_type`` if it is snake_case, else raise ``INVALID_SUBJECT``."""
    if not isinstance(event_type, str) or not event_type:
        raise OutboxValidationError("INVALID_OUTBOX", "event_type", "must be a non-empty string")
    if not SNAKE_CASE.match(event_type):
        raise OutboxValidationError(
            "INVALID_SUBJECT",
            "event_type",
            f"{_shown(event_type)} is not snake_case (lower-case words joined by '_')",
        )
    return event_type


def validate_event_version(version: object) -> int:
    """Return ``version`` if it is an int in 1..MAX_EVENT_VERSION."""
    if isinstance(version, bool) or not isinstance(version, int):
        raise OutboxValidationError("INVALID_SUBJECT", "event_version", "must be an integer")
    if not 1 <= version <= MAX_EVENT_VERSION:
        raise OutboxValidationError(
            "INVALID_SUBJECT",
            "event_version",
            f"{version if abs(version) < 10**12 else 'a huge number'} is outside "
            f"1..{MAX_EVENT_VERSION}",
        )
    return version


def event_subject(namespace: str, event_type: str, version: int) -> EventSubject:
    """Build the subject of an event, validating every part."""
    if not isinstance(namespace, str) or not NAMESPACE.match(namespace):
        raise OutboxValidationError(
            "INVALID_SUBJECT",
            "namespace",
            f"{_shown(str(namespace))} is not a dotted lower-case namespace",
        )
    return EventSubject(namespace, validate_event_type(event_type), validate_event_version(version))


def parse_subject(subject: str) -> EventSubject:
    """Split ``a.b.event_type.vN`` into parts; raise ``INVALID_SUBJECT`` if it breaks the rule."""
    if not isinstance(subject, str):
        raise OutboxValidationError("INVALID_SUBJECT", "subject", "must be a string")
    parts = subject.split(".")
    if len(parts) < 3:
        raise OutboxValidationError(
            "INVALID_SUBJECT", "subject", f"{_shown(subject)} has fewer than three tokens"
        )
    if not all(parts):
        raise OutboxValidationError(
            "INVALID_SUBJECT", "subject", f"{_shown(subject)} has an empty token"
        )
    match = _VERSION.match(parts[-1])
    if match is None:
        raise OutboxValidationError(
            "INVALID_SUBJECT", "subject", f"{_shown(subject)} does not end in .v<n>"
        )
    if len(match.group(1)) > _MAX_VERSION_DIGITS:
        raise OutboxValidationError(
            "INVALID_SUBJECT",
            "subject",
            f"{_shown(subject)}: version is outside 1..{MAX_EVENT_VERSION}",
        )
    return event_subject(".".join(parts[:-2]), parts[-2], int(match.group(1)))


#: Replays go to a subject only the failed durable listens on, inside its own stream, so
#: durables that already processed the event are never re-run (and the subject rule of the
#: envelope's own ``subject`` is untouched).
REPLAY_PREFIX = "ferry.replay"
#: Header of a copy that ``ferry durable rewind`` publishes on a replay subject (its value:
#: the rewind id): a re-delivery of the stream, not a dead letter's replay.
REWIND_HEADER = "Ferry-Rewind"


def replay_subject(stream: str, durable: str) -> str:
    """``ferry.replay.{STREAM}.{durable}``: where replays for ``durable`` are published."""
    return f"{REPLAY_PREFIX}.{stream}.{durable}"


def replay_wildcard(stream: str) -> str:
    """The subject a stream adds to its own so it captures its durables' replays."""
    return f"{REPLAY_PREFIX}.{stream}.*"


#: JetStream's advisories for a message that will not be delivered again.
MAX_DELIVERIES_ADVISORY = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES"
TERMINATED_ADVISORY = "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED"


def advisory_subjects(stream: str, durable: str) -> list[str]:
    """The advisory subjects the dlq-router needs captured for one durable."""
    return [
        f"{MAX_DELIVERIES_ADVISORY}.{stream}.{durable}",
        f"{TERMINATED_ADVISORY}.{stream}.{durable}",
    ]
