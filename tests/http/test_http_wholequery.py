"""A store's end of the QUERY frame (metricsd/http/wholequery.py QueryService): its deadline."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from metricsd.promql.limits import QueryLimits
from metricsd.rpc.wholequery import ANSWER_ERROR, LIMIT_NAMES, QueryFrame, RunnerSettings, encode_request
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

QUERY = 'rate(cpu{pod="p1"}[1m])'


class Stalled:
    """A store whose reads never come back (a read stuck behind a lock, a disk): only the query's
    deadline ends a query over it."""

    def __init__(self) -> None:
        self.inner = LocalBackend(StoreAPI(Store()))
        self.reads = 0

    async def _never(self, *args: Any, **kwargs: Any) -> Any:
        self.reads += 1
        await asyncio.Event().wait()

    read = aggregate = read_columns = read_selection = list_columns = _never

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _frame(timeout_s: float, query_timeout_s: float) -> bytes:
    limits = QueryLimits()
    settings = RunnerSettings(300_000, 50_000_000, True, query_timeout_s,
                              tuple((k, int(getattr(limits, k))) for k in LIMIT_NAMES))
    return encode_request(QueryFrame(QUERY, False, 1_700_000_000_000, 1_700_003_600_000, 30_000, timeout_s, 16, None,
                                     settings))


async def test_a_frame_past_its_own_timeout_is_answered_as_the_http_api_words_a_timeout() -> None:
    """One deadline (the runner's), answered as the HTTP API's request timeout: no query limit named."""
    from metricsd.http.wholequery import QueryService

    backend = Stalled()
    answer = await asyncio.wait_for(QueryService(backend).answer(_frame(0.05, 30.0)), 10)  # type: ignore[arg-type]
    assert backend.reads >= 1
    assert answer[0] == ANSWER_ERROR
    assert orjson.loads(answer[1:]) == {"errorType": "timeout", "error": "query timed out in expression evaluation",
                                        "status": 503, "limit": ""}


async def test_a_frame_past_the_proxys_query_timeout_names_that_limit() -> None:
    """A frame asking longer than the proxy's --query.timeout it carries: that limit ends it, named."""
    from metricsd.http.wholequery import QueryService

    answer = await asyncio.wait_for(QueryService(Stalled()).answer(_frame(30.0, 0.05)), 10)  # type: ignore[arg-type]
    assert answer[0] == ANSWER_ERROR
    doc = orjson.loads(answer[1:])
    assert (doc["errorType"], doc["status"], doc["limit"]) == ("timeout", 503, "timeout")
    assert "--query.timeout" in doc["error"]
