"""FERRY_EVENT_LOOP: which loop a Ferry process runs on, and what a bad value gets."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from shared.domain.errors import ConfigurationError
from shared.runtime import loop
from shared.runtime.settings import CommonSettings


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_auto_runs_on_uvloop_where_it_is_installed() -> None:
    assert loop.loop_name("auto") == "uvloop"
    assert loop.run(_loop_module(), choice="auto").startswith("uvloop")


def test_asyncio_runs_on_the_standard_loop() -> None:
    assert loop.loop_name("asyncio") == "asyncio"
    assert loop.run(_loop_module(), choice="asyncio").startswith("asyncio")


def test_the_variable_chooses_when_no_choice_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_EVENT_LOOP", "asyncio")
    assert loop.run(_loop_module()).startswith("asyncio")
    monkeypatch.setenv("FERRY_EVENT_LOOP", " UVLOOP ")
    assert loop.run(_loop_module()).startswith("uvloop")


def test_an_unknown_value_is_refused_by_name() -> None:
    main = _loop_module()
    with pytest.raises(ConfigurationError, match=r"FERRY_EVENT_LOOP='tokio' is not one of"):
        loop.run(main, choice="tokio")


def test_uvloop_where_it_cannot_be_imported_is_refused_and_auto_falls_back() -> None:
    # A fresh interpreter in which importing uvloop fails, as where it is not installed.
    script = (
        "import sys; sys.modules['uvloop'] = None\n"
        "from shared.runtime import loop\n"
        "from shared.domain.errors import ConfigurationError\n"
        "print(loop.loop_name('auto'))\n"
        "try:\n"
        "    loop.loop_name('uvloop')\n"
        "except ConfigurationError as exc:\n"
        "    print('refused:', exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[0] == "asyncio"
    assert out[1].startswith("refused: FERRY_EVENT_LOOP=uvloop but uvloop cannot be imported")


def test_the_setting_is_validated_with_the_other_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_EVENT_LOOP", "asyncio")
    assert CommonSettings().event_loop == "asyncio"
    monkeypatch.setenv("FERRY_EVENT_LOOP", "nope")
    with pytest.raises(ValueError, match="event_loop"):
        CommonSettings()
