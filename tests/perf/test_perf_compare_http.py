"""perf/compare_http.py's proxy counters on a real HTTP server on 127.0.0.1: reading them must not
move the questions' keep-alive connection off the HTTP hot path (metricsd/http/hotpath.py), or
the CPU per question timed right after measures aiohttp's path, not the hot one."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "perf"))
sys.path.insert(0, str(ROOT / "tests" / "http"))

from compare_http import proxy_counters  # noqa: E402
from http_fixtures import Env, pod_labels, running_env  # noqa: E402

from metricsd.http.hotpath import HotSite  # noqa: E402
from metricsd.http.settings import HttpSettings  # noqa: E402


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async with running_env(HttpSettings(access_log=False)) as e:
        await e.write({pod_labels("up", "p1"): ([590_000], [1.0])})
        yield e


def _hot_connections(env: Env) -> int:
    sites = [s for s in env.runner.sites if isinstance(s, HotSite)]  # type: ignore[attr-defined]
    assert len(sites) == 1 and sites[0].hot_server is not None
    return sum(1 for c in sites[0].hot_server.connections if c.transport is not None)


async def _ask(env: Env) -> None:
    async with env.session.get(env.url + "/api/v1/query", params={"query": "up", "time": "600"}) as r:
        assert r.status == 200 and (await r.json())["data"]["result"]


async def test_a_stats_read_on_the_questions_session_would_take_its_connection_off_the_hot_path(env: Env) -> None:
    """The hazard: the stats route hands the connection that asks it to aiohttp for good."""
    await _ask(env)
    assert _hot_connections(env) == 1
    async with env.session.get(env.url + "/api/v1/metricsd/stats") as r:
        assert r.status == 200
    await _ask(env)
    assert _hot_connections(env) == 0


async def test_the_proxy_counters_leave_the_questions_connection_on_the_hot_path(env: Env) -> None:
    await _ask(env)
    assert _hot_connections(env) == 1
    counted = await proxy_counters(env.url)()
    assert set(counted) and all(v == 0 for v in counted.values())  # a store has none of a proxy's counters
    await _ask(env)
    assert _hot_connections(env) == 1  # the same connection, still answered below aiohttp's web layer
    assert len(env.session.connector._conns) == 1  # type: ignore[union-attr]  # and only that one pooled
