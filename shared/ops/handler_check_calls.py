"""The calls of ``ferry handler-check`` (:mod:`shared.ops.handler_check`): what each check
sends.

:func:`plan_for` builds the :class:`Plan` of one durable, whose :meth:`Plan.probes` are every
call as a :class:`Probe` (the body the durable's inbox-consumer would build, and how it is
signed); :func:`signed_request` turns a probe into the bytes and headers sent.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from shared.contracts.events import AcceptedEvents
from shared.contracts.samples import SampleError, poison_payload, sample_payload
from shared.contracts.topology import DurableSpec, EventSpec, Topology
from shared.domain.envelope import Envelope, payload_digest, wire_json
from shared.domain.errors import ConfigurationError
from shared.domain.handler_call import request_body, request_headers
from shared.domain.signing import sign

#: Seconds before now an expired-timestamp call is signed (beyond any sane tolerance).
DEFAULT_STALE_SECONDS = 3600.0
#: The event type the unknown-type check sends (no manifest may declare it).
UNKNOWN_TYPE = "ferry_handler_check_unknown"
#: The signing secret of the bad-signature check (never any durable's).
WRONG_SECRET = b"ferry-handler-check-wrong-secret"

Signing = Literal["valid", "none", "wrong-secret", "altered", "expired"]
#: The checks a handler must refuse (401), each with how its call is signed.
AUTH_SIGNING: tuple[tuple[str, Signing], ...] = (
    ("unsigned", "none"),
    ("bad-signature", "wrong-secret"),
    ("altered-body", "altered"),
    ("expired-timestamp", "expired"),
)
AUTH_CHECKS = tuple(check for check, _ in AUTH_SIGNING)


@dataclass(frozen=True, slots=True)
class Probe:
    """One call to send: which check, for which event, the body, how it is signed."""

    check: str
    event: str
    body: dict[str, Any]
    signing: Signing = "valid"
    note: str = ""

    def sent(self) -> str:
        """What was sent, in words."""
        delivery = self.body["delivery"]
        how = {
            "valid": "signed",
            "none": "no signature headers",
            "wrong-secret": "signed with a secret that is not the durable's",
            "altered": "signed, then the payload changed",
            "expired": "signed with a stale timestamp",
        }[self.signing]
        text = (
            f"{self.body['event_type']}.v{self.body['event_version']} "
            f"message {self.body['message_id'][:8]}… attempt {delivery['attempt']}, {how}"
        )
        return f"{text}; {self.note}" if self.note else text


@dataclass
class Plan:
    """What to send for one durable."""

    durable_name: str
    durable: DurableSpec
    topology: Topology
    events: list[EventSpec]
    payloads: dict[str, dict[str, Any]]
    stale_seconds: float = DEFAULT_STALE_SECONDS
    _sequence: int = 0

    def body(
        self,
        event: EventSpec,
        payload: dict[str, Any],
        *,
        version: int | None = None,
        event_type: str | None = None,
    ) -> dict[str, Any]:
        """A first delivery's request body, built by the consumer's own builder
        (:func:`shared.domain.handler_call.request_body`)."""
        self._sequence += 1
        event_type = event_type or event.type
        version = version or event.version
        namespace = self.topology.context(event.context).namespace
        envelope = Envelope(
            message_id=str(uuid.uuid4()),
            subject=f"{namespace}.{event_type}.v{version}",
            event_type=event_type,
            event_version=version,
            occurred_at=datetime.now(UTC),
            aggregate_type="handler_check",
            aggregate_id=str(uuid.uuid4()),
            payload=payload,
            context=event.context,
        )
        return request_body(
            envelope,
            attempt=1,
            max_attempts=self.durable.max_deliver,
            stream_sequence=self._sequence,
            durable=self.durable_name,
        )

    def valid_payload(self, event: EventSpec) -> dict[str, Any]:
        """The given payload of ``event``, else its schema's example or a built one."""
        given = self.payloads.get(event.name)
        if given is not None:
            return given
        try:
            return sample_payload(event.payload_schema or {"type": "object"})
        except SampleError as exc:
            raise ConfigurationError(
                f"{event.name} ({event.manifest or 'manifest'}): {exc}; give "
                f"--payload {event.name}=FILE"
            ) from None

    def probes(self) -> Iterator[Probe | tuple[str, str, str]]:
        """Every call, in order; a check that cannot be built is (check, event, why)."""
        first = self.events[0]
        for check, signing in AUTH_SIGNING:
            note = f"{self.stale_seconds:g}s ago" if signing == "expired" else ""
            yield Probe(
                check, first.name, self.body(first, self.valid_payload(first)), signing, note
            )
        for event in self.events:
            normal = self.body(event, self.valid_payload(event))
            yield Probe("normal", event.name, normal)
            again = {**normal, "delivery": {**normal["delivery"], "attempt": 2}}
            again.update(retryCount=1)
            yield Probe("duplicate", event.name, again, note="the same message id again")
            poison = poison_payload(event.payload_schema or {}, self.valid_payload(event))
            if poison is None:
                yield "poison", event.name, "its schema accepts every object: nothing is poison"
            else:
                yield Probe("poison", event.name, self.body(event, poison), note=_diff(poison))
        yield self._unknown_version(first)
        unknown = self.body(first, {"handler_check": True}, event_type=UNKNOWN_TYPE, version=1)
        yield Probe("unknown-type", f"{UNKNOWN_TYPE}.v1", unknown)

    def _unknown_version(self, event: EventSpec) -> Probe:
        taken = {e.version for e in self.topology.events if e.type == event.type} | {
            e.version for e in self.events if e.type == event.type
        }
        version = max(taken) + 1
        body = self.body(event, self.valid_payload(event), version=version)
        return Probe("unknown-version", f"{event.type}.v{version}", body)


def _diff(poison: Mapping[str, Any]) -> str:
    return "payload " + json.dumps(poison, ensure_ascii=False)[:120]


def plan_for(
    topology: Topology,
    durable: str,
    *,
    only: list[str] | None = None,
    payloads: dict[str, dict[str, Any]] | None = None,
    stale_seconds: float = DEFAULT_STALE_SECONDS,
) -> Plan:
    """The calls for ``durable``: every event it accepts (or those named in ``only``)."""
    spec = topology.durable(durable)
    accepted = sorted(
        (e for e in topology.events if durable in e.handled_by), key=lambda e: (e.type, e.version)
    )
    if not accepted:
        raise ConfigurationError(
            f"durable {durable!r} of topology {topology.name!r} accepts no declared event "
            "(its manifests declare none it handles)"
        )
    if only:
        known = {e.name: e for e in accepted}
        missing = [name for name in only if name not in known]
        if missing:
            raise ConfigurationError(
                f"{durable} does not accept {', '.join(missing)} (it accepts {', '.join(known)})"
            )
        accepted = [known[name] for name in dict.fromkeys(only)]
    payloads = payloads or {}
    for name in payloads:
        if name not in {e.name for e in accepted}:
            raise ConfigurationError(f"--payload {name}: {durable} does not accept {name}")
    for event in accepted:
        if event.name in payloads and event.payload_schema is not None:
            key = (event.type, event.version)
            schemas = AcceptedEvents({key: event.payload_schema})
            problem = schemas.payload_error(key, payloads[event.name])
            if problem is not None:
                raise ConfigurationError(
                    f"--payload {event.name}: its schema refuses it: {problem}"
                )
    return Plan(durable, spec, topology, accepted, payloads, stale_seconds)


def signed_request(
    probe: Probe, secret: bytes, now: float, stale: float
) -> tuple[bytes, dict[str, str]]:
    """The bytes and headers of ``probe``'s call."""
    data = wire_json(probe.body)
    trace = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
    headers = {
        **request_headers(probe.body["message_id"], trace),
        "Content-Type": "application/json",
    }
    durable = probe.body["delivery"]["durable"]
    if probe.signing == "valid":
        headers.update(sign(secret, durable, data, now))
    elif probe.signing == "wrong-secret":
        headers.update(sign(WRONG_SECRET, durable, data, now))
    elif probe.signing == "expired":
        headers.update(sign(secret, durable, data, now - stale))
    elif probe.signing == "altered":
        headers.update(sign(secret, durable, data, now))
        changed = {**probe.body, "payload": {**probe.body["payload"], "handler_check": "altered"}}
        changed["payload_digest"] = changed["payloadDigest"] = payload_digest(changed["payload"])
        data = wire_json(changed)
    return data, headers
