"""The event loop a metricsd process runs on (metricsd/cmd/eventloop.py)."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from metricsd.cmd import eventloop


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_asyncio_is_the_default_and_uvloop_is_one_variable_away(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(eventloop.ENV, raising=False)
    assert eventloop.loop_factory() is None
    assert not issubclass(eventloop.run(_loop_type()), uvloop.Loop)
    monkeypatch.setenv(eventloop.ENV, "uvloop")
    assert issubclass(eventloop.run(_loop_type()), uvloop.Loop)
    monkeypatch.setenv(eventloop.ENV, "trio")
    with pytest.raises(ValueError, match="METRICSD_EVENT_LOOP='trio': use asyncio or uvloop"):
        eventloop.loop_factory()
