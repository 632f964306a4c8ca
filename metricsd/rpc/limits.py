"""Per-request write limits: pure checks on a request's size, made before anything is decoded further.

A Write runs to completion on the event loop thread (store/api.py), so one enormous request stalls
every other request of the process for as long as it takes; these bounds keep that to well under
a second (see README, "Write limits"). They count what the request carries, so they cost nothing
and are checked by whoever receives a write first: the store's API, the proxy, and the remote-write
receiver (which checks before it parses a single label).
"""

from __future__ import annotations

from dataclasses import dataclass

from metricsd.proto import metricsd_pb2 as pb

__all__ = ["DEFAULT_MAX_SAMPLES_PER_REQUEST", "DEFAULT_MAX_SERIES_PER_REQUEST", "Refusal", "RequestLimits",
           "check_counts", "check_write_request"]

DEFAULT_MAX_SERIES_PER_REQUEST = 100_000
"""An agent sends a node's pods (a few thousand series); a backfill a few thousand per request."""

DEFAULT_MAX_SAMPLES_PER_REQUEST = 2_000_000
"""About 20 MiB on the wire and a few hundred milliseconds of a store's time; well under gRPC's
64 MiB message limit, which would otherwise refuse the request with a less helpful message."""


@dataclass(frozen=True)
class RequestLimits:
    """Largest Write request accepted; 0 turns a limit off."""

    max_series: int = DEFAULT_MAX_SERIES_PER_REQUEST
    max_samples: int = DEFAULT_MAX_SAMPLES_PER_REQUEST

    def __post_init__(self) -> None:
        if self.max_series < 0 or self.max_samples < 0:
            raise ValueError("request limits must be >= 0 (0: unlimited)")


@dataclass(frozen=True)
class Refusal:
    """Why a write was refused: ``reason`` is the counter it is counted under (Stats.rejected)."""

    reason: str
    message: str


def check_counts(n_series: int, n_samples: int, limits: RequestLimits) -> Refusal | None:
    """The refusal of a request of ``n_series`` series and ``n_samples`` samples, or None."""
    if limits.max_series and n_series > limits.max_series:
        return Refusal("request_series", f"write request has {n_series} series, more than the limit of "
                                         f"{limits.max_series} series per request (max_series_per_request); "
                                         "split it")
    if limits.max_samples and n_samples > limits.max_samples:
        return Refusal("request_samples", f"write request has {n_samples} samples, more than the limit of "
                                          f"{limits.max_samples} samples per request (max_samples_per_request); "
                                          "split it")
    return None


def check_write_request(request: pb.WriteRequest, limits: RequestLimits) -> Refusal | None:
    """check_counts of a columnar WriteRequest. Labels attached for series not in ``ids`` count too,
    and so do values without timestamps: a malformed request is refused for its size first."""
    n_series = max(len(request.ids), len(request.counts), len(request.series))
    n_samples = max(len(request.timestamps), len(request.values))
    return check_counts(n_series, n_samples, limits)
