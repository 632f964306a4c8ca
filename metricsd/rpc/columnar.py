"""Asking a backend for many series as columns (metricsd/columns.py), whatever it is.

A store in this process (LocalBackend) hands its columns over as they are, no message at all.
Any other backend (a store or proxy over gRPC, a proxy's fan-out) is asked with the columnar
flag and answers one SeriesBatch message (rpc/FORMAT.md); a server that predates the flag answers
a message per series, which is read too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from metricsd.columns import SeriesColumns
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import MetricsBackend
from metricsd.rpc.wire import columns_from_list, columns_from_read

__all__ = ["list_columns", "read_columns"]


async def _columns(backend: MetricsBackend, direct_name: str, method: str, request: Any,
                   decode: Callable[[Any], SeriesColumns]) -> SeriesColumns:
    direct = getattr(backend, direct_name, None)
    if callable(direct):
        got: SeriesColumns = await direct(request)
        return got
    req = type(request)()
    req.CopyFrom(request)
    req.columnar = True
    return decode(await getattr(backend, method)(req))


async def read_columns(backend: MetricsBackend, request: pb.ReadRequest) -> SeriesColumns:
    """A Read as columns. Raises what the backend raises."""
    return await _columns(backend, "read_columns", "read", request, columns_from_read)


async def list_columns(backend: MetricsBackend, request: pb.ListSeriesRequest) -> SeriesColumns:
    """A ListSeries as columns (ids and labels, no samples). Raises what the backend raises."""
    return await _columns(backend, "list_columns", "list_series", request, columns_from_list)
