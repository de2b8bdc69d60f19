"""``ferry where``'s human output: the journey document as numbered hops, one fact per
line (see :mod:`shared.ops.where`)."""

from __future__ import annotations

from typing import Any


def render(doc: dict[str, Any]) -> str:
    """The journey as numbered hops, one fact per line."""
    if not doc["found"]:
        return (
            f"{doc['message_id']}: not found in any outbox, stream, inbox or dead-letter "
            f"table of topology {doc['topology']}"
        )
    lines = [f"message {doc['message_id']} (topology {doc['topology']})"]
    lines += _render_outbox(doc["outbox"])
    lines += _render_stream(doc["stream"])
    for entry in doc["durables"]:
        lines += _render_durable(doc["message_id"], entry)
    trace = doc["trace"]
    lines.append(
        "trace    " + (f"{trace['trace_id']}" + (f"  {trace['url']}" if "url" in trace else ""))
        if trace
        else "trace    none recorded (no traceparent on any hop)"
    )
    return "\n".join(lines)


def _render_outbox(outbox: dict[str, Any] | None) -> list[str]:
    if outbox is None:
        return ["outbox   not in any outbox of this topology (published by another producer?)"]
    head = (
        f"outbox   {outbox['context']}: {outbox['event_type']}.v{outbox['event_version']} "
        f"of {outbox['aggregate_type']}/{outbox['aggregate_id']}, recorded {outbox['recorded_at']}"
    )
    if outbox["published_at"] is not None:
        state = (
            f"         published {outbox['published_at']} after "
            f"{outbox['publish_attempts']} attempt(s)"
        )
    elif outbox.get("set_aside_at") is not None:
        state = (
            f"         SET ASIDE {outbox['set_aside_at']} ({outbox['set_aside_reason']}) after "
            f"{outbox['publish_attempts']} attempt(s): {outbox['publish_error']}; an operator "
            f"republishes it with ferry outbox republish --context {outbox['context']} "
            f"--id ID --reason ..."
        )
    else:
        state = f"         NOT PUBLISHED yet: {outbox['publish_attempts']} attempt(s)"
        if outbox["publish_error"]:
            state += f", last error: {outbox['publish_error']}"
        if outbox.get("behind_seq") is not None:
            state += (
                f"; waits behind outbox row #{outbox['behind_seq']} of its aggregate, "
                "failing or set aside (ferry outbox list --failed)"
            )
    return [head, state]


def _render_stream(stored: dict[str, Any] | None) -> list[str]:
    if stored is None:
        return ["stream   not found in the stream"]
    return [
        f"stream   {stored['stream']} #{stored['sequence']} on {stored['subject']}, "
        f"stored {stored['stored_at']}"
    ]


def _render_durable(message_id: str, entry: dict[str, Any]) -> list[str]:
    lines = [f"durable  {entry['durable']} (→ {entry['target']}): {place_text(entry['place'])}"]
    if "delivery" in entry:
        delivery = entry["delivery"]
        via = delivery.get("consumer")
        on = f" (consumer {via})" if via and via != entry["durable"] else ""
        lines.append(f"         jetstream{on}: {delivery['state']}")
    if entry.get("ordering") is not None:
        lines += _render_ordering(entry["durable"], message_id, entry["ordering"])
    row = entry["inbox"]
    if row is None:
        lines.append("         inbox: no row yet (not received)")
    else:
        lines.append(
            f"         inbox: {row['status']}, {row['attempts']} attempt(s), received "
            f"{row['received_at']}, processed {row['processed_at'] or '-'}, handler status "
            f"{row['handler_status'] or '-'}, duplicates {row['duplicates']}"
        )
        if row["last_error"]:
            lines.append(f"         last error: {row['reason_code'] or ''} {row['last_error']}")
        for step in row["retry_history"] or []:
            lines.append(
                f"           attempt {step.get('attempt')}: {step.get('reason')} "
                f"({step.get('status') or '-'}) at {step.get('at')}"
            )
    for call in entry["handler_calls"]:
        lines.append(
            f"         handler call: attempt {call['attempt']} → {call['status']} at "
            f"{call['called_at']}"
        )
    lines += _render_dead(entry["dead_letter"])
    return lines


def place_text(place: dict[str, Any]) -> str:
    """The event's place for one durable, in words (shared.domain.whereabouts)."""
    text = str(place["place"]).upper()
    if "meaning" in place:
        text += f" ({place['dead_letter_status']}: {place['meaning']})"
    if place.get("head"):
        held = "held " if place.get("behind_held_head") else ""
        text += f" behind the {held}head {place['head']}"
    elif "parked_state" in place:
        text += f" (the head of its key, {place['parked_state']})"
    if place.get("waited_behind_held_head"):
        text += f" (after waiting behind the held head {place['waited_behind_held_head']})"
    return text


def _render_ordering(durable: str, message_id: str, ordering: dict[str, Any]) -> list[str]:
    """The key, the partition and the event's place in its key's parked queue."""
    if ordering["key"] is None:
        key = f"key unknown ({ordering['key_error']})"
    else:
        of = f"payload field {ordering['key_field']}" if ordering["key_field"] else "aggregate"
        key = f"key {ordering['key']} ({of})"
    where = ""
    if ordering["partition"] is not None:
        where = f", partition {ordering['partition']} of {ordering['partitions']}"
    lines = [f"         ordering: {key}{where}, on_dead_letter {ordering['on_dead_letter']}"]
    parked = ordering["parked"]
    if parked is not None:
        state = f"         parked: {parked['state']}, {parked['attempts']} attempt(s)"
        state += _when_tried(parked) + f", since {parked['parked_at']}"
        if parked["reason"]:
            state += f", reason {_short(parked['reason'])}"
        lines.append(state)
        if parked["is_head"]:
            lines.append(
                f"         the head of its key: {parked['after']} parked event(s) wait behind it"
            )
        else:
            head = parked["head"]
            lines.append(
                f"         waits behind {parked['before']} parked event(s) of its key "
                f"({parked['after']} behind it); the head {head['message_id']} is "
                f"{head['state']} x{head['attempts']}: {_short(head['reason']) or '-'}"
            )
        head_id = message_id if parked["is_head"] else parked["head"]["message_id"]
        if (parked if parked["is_head"] else parked["head"])["state"] == "held":
            lines.append(
                f"         the held head waits for an operator: ferry dlq replay {durable} "
                f"{head_id} --reason ..., or ferry parked discard --durable {durable} "
                f"--key {ordering['key']} --reason ..."
            )
    elif ordering["key_parked"] is not None:
        waiting = ordering["key_parked"]
        head = waiting["head"]
        lines.append(
            f"         not parked itself; its key has {waiting['events']} parked event(s) now, "
            f"head {head['message_id']} {head['state']} x{head['attempts']}: "
            f"{_short(head['reason']) or '-'}"
        )
    return lines


def _when_tried(parked: dict[str, Any]) -> str:
    """When a parked event is tried next, as a clause."""
    if parked["state"] == "held":
        return ""  # a held head is never tried until an operator acts
    if not parked["is_head"]:
        return ", waits its turn behind the events before it"
    if _at_infinity(parked["next_attempt_at"]):
        return ", due once its partition's drainer next looks (a head left waiting)"
    return f", next attempt {parked['next_attempt_at']}"


def _at_infinity(next_attempt_at: Any) -> bool:
    """A parked event behind its key's head waits at 'infinity' (migration 0022,
    parking._PARK), which the driver reads as the last moment of year 9999: no time."""
    return str(next_attempt_at).startswith(("9999-", "infinity"))


def _short(text: Any, width: int = 120) -> str:
    return " ".join(str(text or "").split())[:width]


def _render_dead(dead: dict[str, Any] | None) -> list[str]:
    if dead is None:
        return []
    lines = [
        f"         dead letter: {dead['status']} ({dead['reason_code']}: {dead['last_error']}), "
        f"via {dead['source']}, {dead['dlq_subject']}, generation {dead['generation']}, "
        f"replays {dead['replay_attempts']}"
    ]
    for event in dead["replay_history"] or []:
        lines.append(
            f"           {event.get('event')} at {event.get('at')}: {event.get('reason')} "
            f"{event.get('detail') or ''}".rstrip()
        )
    for action in dead["actions"]:
        # An edit-and-retry names what it changed (both versions: `ferry dlq show`).
        changed = (action.get("details") or {}).get("changed")
        edited = f" (edited {', '.join(changed)})" if changed else ""
        lines.append(
            f"           action {action['action']} by {action['actor']} at {action['at']}: "
            f"{action['reason']}{edited}"
        )
    return lines
