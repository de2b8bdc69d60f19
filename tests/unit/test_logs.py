"""The roles' log lines: asyncio's TLS end-of-connection warning is dropped, nothing else."""

from __future__ import annotations

import json
import logging

import pytest

from shared.runtime.logs import configure_logging


def test_only_the_tls_eof_warning_is_dropped(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure_logging("unit")
        noise = "returning true from eof_received() has no effect when using ssl"
        logging.getLogger("asyncio").warning(noise)
        logging.getLogger("asyncio").warning("Task was destroyed but it is pending!")
        logging.getLogger("ferry.unit").warning(noise)  # ours, though worded alike: kept
        lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    assert [(r["logger"], r["message"]) for r in lines] == [
        ("asyncio", "Task was destroyed but it is pending!"),
        ("ferry.unit", noise),
    ]
