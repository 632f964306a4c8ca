"""A proxy's whole query (metricsd/proxy/wholequery.py) answered by the HTTP hot path without a task.

On the hot path a request's answer ran in a task of its own: its first step a turn of the event
loop after the request's bytes were read, and its wake-up a turn after the store's answer was. For a
proxy's dashboard read, the (b) of issue 23 (``rate()`` of one pod's counter), those were two of the
~4 turns of the proxy's whole query (perf/RESULTS.md, session 40, s40-23c). Here the frame is sent to
the store from the HTTP connection's ``data_received`` and the HTTP answer is written from the read
port's ``data_received`` (WholeQueryPath.start_now): no task, as long as nothing but the first
store's answer in time happens.

Only for the common case, and the same steps in it as HotRoute.answer (metricsd/http/hotroute.py):
a query or query_range of consistency one (the parameter's or the header's), no bearer tokens (their
check awaits), a query that reads data (metricsd/http/wholehttp.py ``WholeHttp.ask``), parameters
the API accepts. Anything else, and whatever goes wrong before the frame is sent, is answered by
HotRoute.answer in a task as before, with what was already read. Once sent, a hedge's time, the
deadline, a failed ask or a store whose port is not up continues the query in a task: the same
envelope (consistency, missing-cluster collection, the request timeout counted from when the request
began, errors, metrics) around the proxy's ``_send`` adopting the asks under way, so hedging,
replacement, fallback to the proxy's own evaluation and timeouts are exactly as before.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from metricsd.http.hotroute import CONSISTENCY_HEADER_KEY
from metricsd.http.params import Params
from metricsd.http.wholehttp import WholeHttp
from metricsd.rpc.consistency import Consistency
from metricsd.rpc.wholequery import QueryAnswer

if TYPE_CHECKING:
    from metricsd.http.hotpath import HotProtocol, HotQueries, HotRequest

__all__ = ["Continued", "NowQueries", "NowRequest"]

log = logging.getLogger("metricsd.http")

Resume = Callable[[], Awaitable[QueryAnswer | None]]
_INSTANT = {"/api/v1/query": True, "/api/v1/query_range": False}


class _StartNow(Protocol):
    def __call__(self, query: str, *, instant: bool, start_ms: int, end_ms: int, step_ms: int, timeout_s: float,
                 settings: object, done: Callable[[QueryAnswer], None],
                 convert: Callable[[Resume], None]) -> object | None: ...


class Continued:
    """A whole query begun without a task, continued in one (HotQueries.run): ``resume`` the rest
    of the proxy's ``_send``; ``started``, the clock's time its parameters were read (the whole
    query's duration metric)."""

    __slots__ = ("resume", "started")

    def __init__(self, resume: Resume, started: float) -> None:
        self.resume = resume
        self.started = started


class NowQueries:
    """Begins a hot request's answer: without a task when it can (above), else in the protocol's task."""

    def __init__(self, queries: HotQueries, whole: WholeHttp, start_now: _StartNow) -> None:
        self.queries = queries
        self.whole = whole
        self.start_now = start_now

    def take(self, proto: HotProtocol, req: HotRequest) -> None:
        """Answers ``req`` on ``proto`` (which sets its ``task`` to what is under way)."""
        q = self.queries
        started = q.clock.monotonic()
        try:
            prepared = q.prepare(req)
        except Exception:  # HotRoute.answer meets it again and answers the error
            proto.run_task(req, functools.partial(q.answer, req, proto.peer))
            return
        instant = _INSTANT[req.name]  # HotProtocol takes the two query routes here, and no others
        params = prepared[1][0]
        try:
            ask = None
            if q.auth is None and q.consistency_of(
                    prepared[0] or req.headers.get(CONSISTENCY_HEADER_KEY), req.name) is Consistency.ONE:
                ask = self.whole.ask(params, instant)
        except Exception:  # a bad parameter: HotRoute.answer answers its 400
            ask = None
        if ask is None:
            proto.run_task(req, functools.partial(q.answer, req, proto.peer, prepared, started))
            return
        began = asyncio.get_running_loop().time()
        now = NowRequest(self, proto, req, prepared[0], params, began, started)
        proto.task = now
        query, start_ms, end_ms, step_ms, timeout_s = ask
        now.handle = self.start_now(query, instant=instant, start_ms=start_ms, end_ms=end_ms, step_ms=step_ms,
                                    timeout_s=timeout_s, settings=self.whole.runner, done=now.done,
                                    convert=now.convert)
        if now.handle is None:  # not sent: the path's run() from the start, in a task
            now.over = True
            proto.run_task(req, functools.partial(q.answer, req, proto.peer, prepared, started))


class NowRequest:
    """One request whose whole query is under way without a task: the protocol's ``task`` while it
    is (cancelled when the connection goes, awaited by a graceful stop)."""

    __slots__ = ("began", "finished", "handle", "now", "over", "params", "proto", "req", "started", "text")

    def __init__(self, now: NowQueries, proto: HotProtocol, req: HotRequest, text: str | None, params: Params,
                 began: float, started: float) -> None:
        self.now, self.proto, self.req, self.text, self.params = now, proto, req, text, params
        self.began = began  # the loop's time, for the request timeout
        self.started = started  # the clock's, for the request metrics
        self.handle: object | None = None
        self.over = False
        self.finished: asyncio.Future[None] | None = None  # made when a graceful stop waits

    def done(self, got: QueryAnswer) -> None:
        """The store's answer, in the turn of the loop that read it: the HTTP answer written now.
        Called from the read port's ``data_received``, so nothing raised here may reach it (it
        would end the connection that other queries wait on): an unexpected failure closes this
        HTTP connection instead, as a failed request task's would leave it unanswered."""
        if self.over:
            return
        self.over = True
        q = self.now.queries
        try:
            try:
                body = self.now.whole.body(got, self.started)
                assert body is not None  # an answer is never None
                status = 200
            except Exception as e:  # the query's own error
                status, body = q.failed(self.req, e)
            q.counted(self.req, status, self.started)
            self._finish()
            self.proto.reply(self.req, (status, body, ""))
        except Exception:
            log.exception("answering %s %s", self.req.method, self.req.name)
            self.proto.close()

    def convert(self, resume: Resume) -> None:
        """The rest of the query in a task: HotRoute.answer's envelope around ``resume``."""
        if self.over:
            return
        self.over = True
        q = self.now.queries
        state = (self.params, Continued(resume, self.started))
        task = self.proto.run_task(self.req, functools.partial(q.answer, self.req, self.proto.peer, (self.text, state),
                                                               self.started, self.began))
        task.add_done_callback(self._ended)

    def _ended(self, _: object) -> None:
        """The continuing task's end: its asks let go even if it was cancelled before its first step
        (when ``_send``, which cancels them as it ends, never ran); a graceful stop's wait ends."""
        abandon = getattr(self.handle, "abandon", None)
        if abandon is not None:
            abandon()
        self._finish()

    def cancel(self) -> None:
        if self.over:
            return
        self.over = True
        cancel = getattr(self.handle, "cancel", None)
        if cancel is not None:
            cancel()
        self._finish()

    def wait(self) -> asyncio.Future[None]:
        """A future done when the request is answered or cancelled (a graceful stop's wait)."""
        if self.finished is None:
            self.finished = asyncio.get_running_loop().create_future()
            if self.over:
                self.finished.set_result(None)
        return self.finished

    def _finish(self) -> None:
        if self.finished is not None and not self.finished.done():
            self.finished.set_result(None)
