"""The dead-letter record (INFRA-005 §4 and EVT-047-002 MessageDeadLettered in one document)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from shared.domain.envelope import format_timestamp


def dead_letter_record(
    *,
    durable: str,
    stream: str,
    stream_sequence: int,
    message_id: str,
    original_subject: str,
    reason_code: str,
    last_error: str,
    attempts: int,
    payload: Any,
    retry_history: list[dict[str, Any]],
    traceparent: str | None = None,
) -> dict[str, Any]:
    """Everything an operator (or the replayer) needs to understand and replay a failure.

    ``payload`` is the original message body: the parsed envelope when it parsed, else
    the raw text, so nothing is lost even for a message that was not JSON.
    """
    return {
        # EVT-047-002
        "message_id": message_id,
        "original_subject": original_subject,
        "reason": reason_code,
        "attempts": attempts,
        # INFRA-005 §4
        "failedStream": stream,
        "reasonCode": reason_code,
        "lastError": last_error,
        "payload": payload,
        "retryHistory": retry_history,
        # Ferry
        "durable": durable,
        "stream_sequence": stream_sequence,
        "traceparent": traceparent,
        "dead_lettered_at": format_timestamp(datetime.now(UTC)),
    }
