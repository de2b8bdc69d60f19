"""Private reply inboxes: the subjects below which each NATS user receives its replies.

Pure naming, shared by the NATS adapter (which connects with the prefix) and the NATS
permissions (which allow each user to subscribe only below its own).
"""

from __future__ import annotations

import re

#: Prefix of every reply inbox; each user gets ``_INBOX.{user}`` below it.
INBOX_ROOT = "_INBOX"
_UNSAFE_TOKEN = re.compile(r"[^A-Za-z0-9_-]")


def inbox_prefix(user: str) -> str:
    """The private reply-inbox prefix of ``user`` (one subject token below ``_INBOX``)."""
    return f"{INBOX_ROOT}.{_UNSAFE_TOKEN.sub('_', user)}"
