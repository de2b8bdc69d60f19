"""NATS subject wildcards as the topology checks them: does a pattern cover a subject.

:func:`covers` is what the models' validators use (a stream's subjects against its
namespace, a durable's filters against its stream); :func:`subject_matches` is its
public name for matching a concrete subject.
"""

from __future__ import annotations


def covers(pattern: str, subject: str) -> bool:
    """Whether NATS wildcard ``pattern`` matches every subject ``subject`` matches."""
    p_tokens, s_tokens = pattern.split("."), subject.split(".")
    for index, token in enumerate(p_tokens):
        if token == ">":
            return len(s_tokens) > index
        if index >= len(s_tokens):
            return False
        if token not in ("*", s_tokens[index]):
            return False
    return len(p_tokens) == len(s_tokens)


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard match of a concrete ``subject`` against ``pattern``."""
    return covers(pattern, subject)
