"""shared.domain.policy (the outbox numbers the lint, the settings and the adapter share),
the reply-inbox naming, and the one exception-to-exit-code mapping.

Until the outbox adapter imports the policy (phase 2 of issue 27), its copy is pinned here.
"""

from __future__ import annotations

from shared.adapters import outbox
from shared.contracts.lint import PublisherTiming
from shared.domain import policy
from shared.domain.errors import AccessDenied, ConfigurationError, TransientError
from shared.domain.reply_subjects import inbox_prefix
from shared.runtime.lifecycle import EXIT_CONFIG, EXIT_CONNECT, exit_code_of
from shared.runtime.settings import PublisherSettings


def test_the_adapters_copy_equals_the_policy() -> None:
    assert outbox.ROW_RETRY_CAP_SECONDS == policy.ROW_RETRY_CAP_SECONDS


def test_publisher_defaults_are_the_policy() -> None:
    defaults = PublisherSettings.model_fields
    assert defaults["publish_timeout"].default == policy.PUBLISH_TIMEOUT
    assert defaults["retry_max"].default == policy.RETRY_MAX
    assert defaults["poll_interval"].default == policy.POLL_INTERVAL
    assert PublisherTiming.defaults() == PublisherTiming(
        policy.PUBLISH_TIMEOUT, policy.RETRY_MAX, policy.POLL_INTERVAL
    )


def test_reply_inbox_is_one_safe_token_per_user() -> None:
    assert inbox_prefix("outbox-publisher-sea") == "_INBOX.outbox-publisher-sea"
    assert inbox_prefix("a.b *>") == "_INBOX.a_b___"


def test_exceptions_become_exit_codes_in_one_place() -> None:
    assert exit_code_of(ConfigurationError("x")) == EXIT_CONFIG
    assert exit_code_of(AccessDenied("x")) == EXIT_CONNECT
    assert exit_code_of(TransientError("x")) == EXIT_CONNECT
