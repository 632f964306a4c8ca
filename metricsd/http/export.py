"""``/api/v1/export`` and ``/api/v1/import``: raw samples out and in, in VictoriaMetrics' JSON-lines
format (vmjson.py), over any backend (one store, a proxy, a federation).

Export streams: it lists the matching series (labels only), then reads their samples a few pods
at a time (``EXPORT_SERIES_PER_READ`` series a read: a selector narrowed to one namespace and a
regex of its pods) and writes each read's lines before the next read. Memory is bounded by one
read, whatever the selection. A series matched by several ``match[]`` is exported once.

Import takes the body whole (the HTTP body limit, 413 past it, counted on the inflated bytes of
a gzip body, so a small bomb is refused too), parses and checks every line before anything is written, so a bad
line is a 400 naming it and nothing is stored; then writes in batches through the backend. Series
are keyed as remote-written ones are (metricsd/http/remote_series.py: the relabel rules, then
``namespace`` / ``pod`` fallbacks). Samples of one series across lines are merged in time order;
a timestamp given twice keeps its first value.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

import numpy as np
from aiohttp import web

from metricsd.clock import Clock
from metricsd.http.params import ApiError, bad, read_params
from metricsd.http.remote_series import resolve
from metricsd.http.selfmetrics import SelfMetrics
from metricsd.http.settings import HttpSettings
from metricsd.http.vmjson import ImportError_, Line, format_line, lines_of, parse_line
from metricsd.model import InvalidSeries, Labels, series_id, validate_labels
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import MetricsBackend
from metricsd.rpc.wire import labels_from_pb, labels_to_pb, matchers_to_pb
from metricsd.selector import Matcher, MatchOp

__all__ = ["EXPORT_SERIES_PER_READ", "ExportAPI", "re_escape", "read_batches"]

EXPORT_SERIES_PER_READ = 200
IMPORT_SAMPLES_PER_WRITE = 200_000
_RE_SPECIAL = re.compile(r"([\\.+*?()|\[\]{}^$])")


def re_escape(value: str) -> str:
    """A literal for an RE2 alternation (Python's re.escape escapes more than RE2 knows)."""
    return _RE_SPECIAL.sub(r"\\\1", value)


def read_batches(listed: Iterable[tuple[int, Labels]], per_read: int) -> list[tuple[str, list[str]]]:
    """(namespace, pods) groups of about ``per_read`` series each, pods whole. Pure."""
    by_ns: dict[str, dict[str, int]] = defaultdict(dict)
    for _, labels in listed:
        d = dict(labels)
        pods = by_ns[d.get("namespace", "")]
        pod = d.get("pod", "")
        pods[pod] = pods.get(pod, 0) + 1
    out: list[tuple[str, list[str]]] = []
    for ns in sorted(by_ns):
        group: list[str] = []
        n = 0
        for pod, k in sorted(by_ns[ns].items()):
            if group and n + k > per_read:
                out.append((ns, group))
                group, n = [], 0
            group.append(pod)
            n += k
        if group:
            out.append((ns, group))
    return out


class ExportAPI:
    def __init__(self, backend: MetricsBackend, settings: HttpSettings, clock: Clock, metrics: SelfMetrics) -> None:
        self.backend = backend
        self.settings = settings
        self.clock = clock
        self.metrics = metrics

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/api/v1/export", self.export)
        app.router.add_post("/api/v1/export", self.export)
        app.router.add_post("/api/v1/import", self.import_)

    # --- export -------------------------------------------------------------------------------

    async def export(self, request: web.Request) -> web.StreamResponse:
        params = await read_params(request)
        selectors = params.matchers()
        if not selectors:
            raise bad("match[]", "at least one series selector is required")
        start = params.time_ms("start", 0)
        end = params.time_ms("end", self.clock.now_ms())
        if end < start:
            raise bad("end", "end timestamp must not be before start time")
        batches = []
        for sel in selectors:  # list first: an error is still a clean 400 before any byte is sent
            listed = await self.backend.list_series(pb.ListSeriesRequest(matchers=matchers_to_pb(sel)))
            found = [(s.id, labels_from_pb(s.labels)) for s in listed.series]
            batches.append((sel, read_batches(found, EXPORT_SERIES_PER_READ)))
        resp = web.StreamResponse(headers={"Content-Type": "application/stream+json"})
        await resp.prepare(request)
        done: set[int] = set()
        for sel, groups in batches:
            for ns, pods in groups:
                narrowed = [*sel, Matcher(MatchOp.EQ, "namespace", ns),
                            Matcher(MatchOp.RE, "pod", "|".join(re_escape(p) for p in pods))]
                got = await self.backend.read(pb.ReadRequest(matchers=matchers_to_pb(narrowed), start_ms=start,
                                                             end_ms=end))
                chunk = []
                for s in got.series:
                    if s.id in done:
                        continue
                    done.add(s.id)
                    chunk.append(format_line(labels_from_pb(s.labels), np.array(s.timestamps, dtype=np.int64),
                                             np.array(s.values, dtype=np.float64)))
                await resp.write(b"".join(chunk))
        await resp.write_eof()
        return resp

    # --- import -------------------------------------------------------------------------------

    async def import_(self, request: web.Request) -> web.Response:
        body = await request.read()  # aiohttp inflates a gzip body, counting the limit on what it inflates
        series: dict[int, tuple[Labels, list[np.ndarray], list[np.ndarray]]] = {}
        for n, raw in lines_of(body):
            try:
                line = parse_line(raw, n)
            except ImportError_ as e:
                raise ApiError("bad_data", str(e)) from None
            if line is None:
                continue
            labels = self._key(line, n)
            if labels is None:
                continue
            sid = series_id(labels)
            entry = series.setdefault(sid, (labels, [], []))
            entry[1].append(line.timestamps)
            entry[2].append(line.values)
        written = 0
        for req in self._requests(series):
            resp = await self.backend.write(req)
            written += resp.samples_written + resp.rejected_duplicate
        self.metrics.samples_ingested.labels(path="import").inc(written)
        return web.Response(status=204)

    def _key(self, line: Line, n: int) -> Labels | None:
        """The labels a line's series is stored under (None: a relabel rule drops it)."""
        verdict = resolve(line.labels, self.settings)
        if verdict.refusal is not None:
            raise ApiError("bad_data", f"line {n}: {verdict.refusal}")
        if verdict.labels is None:
            return None
        try:
            validate_labels(verdict.labels)
        except InvalidSeries as e:
            raise ApiError("bad_data", f"line {n}: {e}") from None
        return verdict.labels

    def _requests(self, series: dict[int, tuple[Labels, list[np.ndarray], list[np.ndarray]]]
                  ) -> Iterable[pb.WriteRequest]:
        """WriteRequests of about IMPORT_SAMPLES_PER_WRITE samples, each series' samples sorted,
        a repeated timestamp keeping its first value."""
        limits = self.settings.request_limits
        req, n = pb.WriteRequest(), 0
        for sid, (labels, stamps, values) in series.items():
            ts, vs = np.concatenate(stamps), np.concatenate(values)
            order = np.argsort(ts, kind="stable")
            ts, vs = ts[order], vs[order]
            keep = np.ones(len(ts), bool)
            keep[1:] = ts[1:] != ts[:-1]
            ts, vs = ts[keep], vs[keep]
            if n and (n + len(ts) > IMPORT_SAMPLES_PER_WRITE or len(req.ids) >= limits.max_series):
                yield req
                req, n = pb.WriteRequest(), 0
            req.ids.append(sid)
            req.counts.append(len(ts))
            req.timestamps.extend(ts.tolist())
            req.values.extend(vs.tolist())
            req.series.add(id=sid).labels.extend(labels_to_pb(labels))
            n += len(ts)
        if n:
            yield req
