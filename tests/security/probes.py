"""Probes of a server's TLS from outside, shared by the per-hop tests and the stack's."""

from __future__ import annotations

import asyncio


async def clear_text_attempt(port: int, host: str = "127.0.0.1") -> str:
    """What a nats-server that requires TLS answers a client sending CONNECT without it
    ("" if it just closes the connection). Its INFO must say TLS is required."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        info = await asyncio.wait_for(reader.readline(), 5)
        assert b'"tls_required":true' in info, info
        writer.write(b'CONNECT {"verbose":false}\r\nPING\r\n')
        await writer.drain()
        return (await asyncio.wait_for(reader.read(4096), 5)).decode(errors="replace")
    finally:
        writer.close()
