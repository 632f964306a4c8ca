"""Digests computed a slice of series at a time on the event loop.

A digest over a store's retention once decoded every chunk of the slots' series: on a store
holding tens of millions of samples that was seconds of CPU, and done in one go it stalled the
store's event loop, so writes queued behind it timed out (a 40,000-series cluster under the
side-by-side benchmark: a Write past its 120 s deadline). Digests now add cached per-chunk sums
(digest.py), but per-series digests with buckets, and the first digest after a snapshot restore,
still decode most chunks; so between slices of ``SLICE_SERIES`` series other requests run. A series written meanwhile is
read whole, before or after the write (digest.SlotSamples), and anti-entropy leaves the newest
samples alone anyway.
"""

from __future__ import annotations

import asyncio

from metricsd.proto import metricsd_pb2 as pb
from metricsd.replica.digest import digest_request, digest_response, slot_reader
from metricsd.store.engine import Store

__all__ = ["SLICE_SERIES", "store_digest_async"]

SLICE_SERIES = 200
"""Series read between two yields. By cached sums, about 8 ms of CPU (perf/bench_digest.py: 0.41 s
for 10,000 series); a slice that decodes a day of 10 s data (a bucketed or first digest: about
14,000 chunks at some 65 µs each, chunk and hashes) holds the loop for most of a second."""


async def store_digest_async(store: Store, request: pb.DigestRequest, slice_series: int = SLICE_SERIES
                             ) -> pb.DigestResponse:
    """store_digest, yielding to the event loop between slices. Raises ValueError as it does."""
    slot_count, slots = digest_request(request)
    samples = slot_reader(store, request, slot_count, slots)
    while not samples.done:
        samples.read(slice_series)
        await asyncio.sleep(0)
    return digest_response(request, slots, samples)
