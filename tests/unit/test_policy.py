"""shared.domain.policy: the pure policy the lint and the adapters share.

Until the adapters import it (phase 2 of issue 27), their own copies are pinned equal here.
"""

from __future__ import annotations

import random

import pytest

from shared.adapters import dead_letters, outbox
from shared.contracts.lint import PublisherTiming
from shared.contracts.topology import DurableSpec, ReplayLimits
from shared.domain import policy
from shared.domain.errors import AccessDenied, ConfigurationError, TransientError
from shared.domain.reply_subjects import inbox_prefix
from shared.runtime.lifecycle import EXIT_CONFIG, EXIT_CONNECT, exit_code_of
from shared.runtime.settings import PublisherSettings


def test_the_adapters_copies_equal_the_policy() -> None:
    assert outbox.ROW_RETRY_CAP_SECONDS == policy.ROW_RETRY_CAP_SECONDS
    assert dead_letters.NOT_REPLAYABLE == policy.NOT_REPLAYABLE
    assert dead_letters.REPLAYABLE_STATUSES == policy.REPLAYABLE_STATUSES
    assert dead_letters.FINAL_STATUSES == policy.FINAL_STATUSES


@pytest.mark.parametrize("replay", ["automatic", "operator"])
@pytest.mark.parametrize("reason", ["HANDLER_REJECTED", "SCHEMA_INVALID", "MAX_DELIVERIES"])
@pytest.mark.parametrize("attempts", [0, 1, 4, 5, 6])
def test_initial_status_decides_as_the_adapter_does(
    replay: str, reason: str, attempts: int
) -> None:
    spec = DurableSpec.model_validate(
        {
            "target": "sea",
            "stream": "VIBESPRO_EVENTS",
            "filter_subjects": ["vibespro.event.>"],
            "replay": replay,
            "replay_limits": {"max_attempts": 5},
            "handler": {"url": "http://127.0.0.1:1/handle"},
            "dead_letter_subject": "sea.dlq.vibespro",
        }
    )
    assert policy.initial_status(
        replay=spec.replay,
        max_attempts=spec.replay_limits.max_attempts,
        reason_code=reason,
        replay_attempts=attempts,
    ) == dead_letters.initial_status(spec, reason, attempts)


@pytest.mark.parametrize("attempts", [0, 1, 3, 10, 60])
def test_replay_delay_draws_as_the_adapter_does(attempts: int) -> None:
    limits = ReplayLimits(base_delay=5.0, max_delay=600.0)
    ours = policy.replay_delay(limits, attempts, random.Random(attempts))
    theirs = dead_letters.replay_delay(limits, attempts, random.Random(attempts))
    assert ours == theirs
    assert 0.0 <= ours <= 600.0


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
