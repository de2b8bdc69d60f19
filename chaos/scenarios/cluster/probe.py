"""The cluster scenarios' probe: publishes into each event stream throughout the run and
records every PubAck, then checks each acknowledged sequence still holds its message."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass, field

import nats
from nats.js import JetStreamContext

from shared.domain.subjects import replay_subject
from shared.waits import sleep_unless

#: The probe's subject in each stream: a replay subject of no durable.
PROBE_DURABLE = "chaos_probe"
#: Seconds between probe publishes (each to every event stream).
PROBE_EVERY = 0.1


@dataclass
class Probe:
    """Publishes into each event stream and records every PubAck (see the module doc)."""

    servers: list[str]
    streams: list[str]
    acked: list[tuple[str, int, str]] = field(default_factory=list)
    unacked: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    sent: int = 0

    def subject(self, stream: str) -> str:
        """Where the probe publishes in ``stream``."""
        return replay_subject(stream, PROBE_DURABLE)

    async def run(self, stop: asyncio.Event) -> None:
        """Publish until ``stop``; a publish without a PubAck is counted, never retried."""
        nc = await nats.connect(
            servers=self.servers,
            name="chaos-probe",
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.2,
            ping_interval=1,
            max_outstanding_pings=2,
            connect_timeout=2,
        )
        js = nc.jetstream()
        try:
            while not stop.is_set():
                for stream in self.streams:
                    self.sent += 1
                    msg_id = f"probe-{self.sent}"
                    try:
                        ack = await js.publish(
                            self.subject(stream),
                            json.dumps({"probe": self.sent}).encode(),
                            timeout=2,
                            headers={"Nats-Msg-Id": msg_id},
                        )
                    except Exception as exc:  # no PubAck: unknown fate, not counted
                        self.unacked[type(exc).__name__] += 1
                        continue
                    if ack.duplicate:
                        self.duplicates += 1
                    self.acked.append((ack.stream, ack.seq, msg_id))
                await sleep_unless(stop, PROBE_EVERY)
        finally:
            await nc.close()

    async def missing(self, js: JetStreamContext) -> list[str]:
        """Acknowledged publishes whose sequence does not hold their message now."""
        gate = asyncio.Semaphore(64)

        async def check(stream: str, seq: int, msg_id: str) -> str | None:
            async with gate:
                try:
                    raw = await js.get_msg(stream, seq)
                except Exception as exc:
                    return f"{stream}#{seq} {msg_id}: {type(exc).__name__}"
            found = (raw.headers or {}).get("Nats-Msg-Id")
            return None if found == msg_id else f"{stream}#{seq} {msg_id}: holds {found!r}"

        found = await asyncio.gather(*(check(*a) for a in self.acked))
        return [m for m in found if m is not None]

    async def purge(self, js: JetStreamContext) -> None:
        """Take the probe's messages out of the streams (the ordinary count reads them)."""
        for stream in self.streams:
            await js.purge_stream(stream, subject=self.subject(stream))
