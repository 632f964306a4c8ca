"""Prometheus remote write 1.0 receiver: ``POST /api/v1/write``.

The body is a snappy *block* (``cramjam.snappy.decompress_raw``; the framed format of plain
``compress``/``decompress`` is a different thing) holding a ``prometheus.WriteRequest``. It is
turned into metricsd's columnar WriteRequest (labels sent with every series, ids from
``series_id``) and written through the backend, all or nothing: bad snappy, bad protobuf, a
body over the limits or a series the store refuses answer 4xx and store nothing.

metricsd keys every series by ``namespace/pod``. Series without them are refused with a 400
naming them, unless HttpSettings fills them in (``default_namespace``, and ``pod`` from the
``pod_label`` label, e.g. ``instance`` for scraped targets).
"""

from __future__ import annotations

from collections.abc import Sequence

import cramjam
import numpy as np
from aiohttp import web
from google.protobuf.message import DecodeError

from metricsd.backend import BadRequest, MetricsBackend
from metricsd.http.params import ApiError
from metricsd.http.selfmetrics import SelfMetrics
from metricsd.http.settings import HttpSettings
from metricsd.model import Labels, describe, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import prometheus_remote_pb2 as prom

__all__ = ["RemoteWriteReceiver", "decode_body", "to_columnar"]

_MAX_NAMED = 5  # series named in one error message


def _declared_length(body: bytes) -> int:
    """The uncompressed length a snappy block declares up front (a little-endian base-128 varint)."""
    n = shift = 0
    for i, b in enumerate(body[:5]):
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n
        shift += 7
        if i == 4:
            break
    raise ApiError("bad_data", "snappy: corrupt input (bad length header)")


def decode_body(body: bytes, max_decompressed_bytes: int) -> prom.WriteRequest:
    """Snappy block, then protobuf. Raises ApiError (400, or 413 when it would decompress too big)."""
    if not body:
        raise ApiError("bad_data", "empty body: expected a snappy-compressed prometheus.WriteRequest")
    size = _declared_length(body)
    if size > max_decompressed_bytes:
        raise ApiError("too_large", f"body decompresses to {size} bytes, more than the limit of "
                                    f"{max_decompressed_bytes}", 413)
    try:
        raw = bytes(cramjam.snappy.decompress_raw(body))
    except Exception as e:  # cramjam raises its own DecompressionError
        raise ApiError("bad_data", f"snappy: {e}") from None
    try:
        return prom.WriteRequest.FromString(raw)
    except DecodeError as e:
        raise ApiError("bad_data", f"protobuf: cannot decode prometheus.WriteRequest: {e}") from None


def _labels_of(ts: prom.TimeSeries, settings: HttpSettings) -> Labels:
    d: dict[str, str] = {}
    for lab in ts.labels:
        if lab.name in d:
            raise ApiError("bad_data", f"series {ts.labels}: duplicate label name {lab.name!r}")
        if lab.value:  # an empty value is the same as no label, as in Prometheus
            d[lab.name] = lab.value
    if "namespace" not in d and settings.default_namespace:
        d["namespace"] = settings.default_namespace
    if "pod" not in d and settings.pod_label and d.get(settings.pod_label):
        d["pod"] = d[settings.pod_label]
    return tuple(sorted(d.items()))


def to_columnar(req: prom.WriteRequest, settings: HttpSettings) -> pb.WriteRequest:
    """metricsd's WriteRequest for a remote-write request; samples of a series repeated across
    entries are merged, sorted, and a repeated timestamp keeps its first value."""
    merged: dict[Labels, tuple[list[int], list[float]]] = {}
    missing: list[str] = []
    for ts in req.timeseries:
        labels = _labels_of(ts, settings)
        names = {k for k, _ in labels}
        if "namespace" not in names or "pod" not in names:
            missing.append(describe(labels))
            continue
        t, v = merged.setdefault(labels, ([], []))
        t.extend(s.timestamp for s in ts.samples)
        v.extend(s.value for s in ts.samples)
    if missing:
        shown = ", ".join(missing[:_MAX_NAMED]) + (f" and {len(missing) - _MAX_NAMED} more" if len(missing) >
                                                   _MAX_NAMED else "")
        raise ApiError("bad_data", f"{len(missing)} series lack the namespace/pod labels metricsd requires: {shown} "
                                   "(or configure a default namespace and a pod label)")
    out = pb.WriteRequest()
    all_t: list[np.ndarray] = []
    all_v: list[np.ndarray] = []
    for labels, (t_list, v_list) in merged.items():
        t_arr = np.array(t_list, dtype=np.int64)
        v_arr = np.array(v_list, dtype=np.float64)
        if t_arr.size > 1 and not bool(np.all(np.diff(t_arr) > 0)):
            order = np.argsort(t_arr, kind="stable")
            t_arr, v_arr = t_arr[order], v_arr[order]
            keep = np.ones(t_arr.size, dtype=bool)
            keep[1:] = t_arr[1:] != t_arr[:-1]
            t_arr, v_arr = t_arr[keep], v_arr[keep]
        sid = series_id(labels)
        out.ids.append(sid)
        out.counts.append(int(t_arr.size))
        all_t.append(t_arr)
        all_v.append(v_arr)
        entry = out.series.add(id=sid)
        for name, value in labels:
            entry.labels.add(name=name, value=value)
    if all_t:
        out.timestamps.extend(np.concatenate(all_t).tolist())
        out.values.extend(np.concatenate(all_v).tolist())
    return out


def _sample_count(req: prom.WriteRequest) -> int:
    return sum(len(ts.samples) for ts in req.timeseries)


class RemoteWriteReceiver:
    def __init__(self, backend: MetricsBackend, settings: HttpSettings, metrics: SelfMetrics) -> None:
        self.backend = backend
        self.settings = settings
        self.metrics = metrics

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/api/v1/write", self.write)

    def _check_headers(self, request: web.Request) -> None:
        enc = request.headers.get("Content-Encoding", "snappy").strip().lower()
        if enc != "snappy":
            raise ApiError("bad_data", f"unsupported Content-Encoding {enc!r}: remote write bodies are snappy")
        ctype = request.headers.get("Content-Type", "application/x-protobuf")
        params = _content_type_params(ctype.split(";")[1:])
        if params.get("proto", "prometheus.WriteRequest") != "prometheus.WriteRequest":
            raise ApiError("bad_data", f"unsupported remote write message {params['proto']!r}: metricsd receives "
                                       "remote write 1.0 (prometheus.WriteRequest)", 415)

    async def write(self, request: web.Request) -> web.Response:
        self._check_headers(request)
        body = await request.read()
        req = decode_body(body, self.settings.max_decompressed_bytes)
        n = _sample_count(req)
        try:
            columnar = to_columnar(req, self.settings)
            if not columnar.ids:
                return web.Response(status=204)
            resp = await self.backend.write(columnar)
        except (ApiError, BadRequest):
            self.metrics.samples_rejected.labels(reason="invalid").inc(n)
            raise
        if resp.unknown_ids:
            raise ApiError("internal", f"backend reported {len(resp.unknown_ids)} unknown series although their "
                                       "labels were sent")
        self.metrics.samples_ingested.labels(path="remote_write").inc(resp.samples_written)
        if resp.rejected_too_old:
            self.metrics.samples_rejected.labels(reason="too_old").inc(resp.rejected_too_old)
        if resp.rejected_duplicate:
            self.metrics.samples_rejected.labels(reason="duplicate").inc(resp.rejected_duplicate)
        return web.Response(status=204)


def _content_type_params(parts: Sequence[str]) -> dict[str, str]:
    out = {}
    for p in parts:
        k, _, v = p.strip().partition("=")
        out[k.strip().lower()] = v.strip().strip('"')
    return out
