"""Copying samples from a peer replica: resumable CatchUp streams, and digest-guided repair.

:func:`catch_up` streams a slot set's samples in a time range from a peer and applies each page
through the local write path (:func:`local_apply`: only samples the store lacks, logged in the WAL
as CATCH_UP records and applied without the out-of-order window). A broken stream is resumed from
the last page's token, so nothing is copied twice and nothing is skipped.

:func:`sync_slots` is anti-entropy against one peer: compare slot digests, then per-series bucket
digests of the slots that differ, then copy only the buckets that differ. A slot the store holds
nothing of is copied whole without the per-series step.

Both run on the store's event loop between its other handlers: each page is applied in one
synchronous step, so the engine needs no lock and writes keep being served between pages.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
import numpy as np

from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.replica.catchup import missing_only
from metricsd.replica.digest import SeriesDigests, bucket_count, repair_ranges
from metricsd.replica.digestloop import store_digest_async
from metricsd.rpc.wire import labels_from_pb
from metricsd.store.engine import Store, WriteResult
from metricsd.store.recovery import CATCH_UP_WINDOW_MS, request_arrays

if TYPE_CHECKING:
    from metricsd.store.durable import Durability

__all__ = ["Apply", "CatchUpError", "CatchUpStats", "catch_up", "local_apply", "sync_slots"]

log = logging.getLogger("metricsd.replica.catchup")

Apply = Callable[[pb.WriteRequest], int]
"""Applies one page locally; returns the samples written."""


class CatchUpError(RuntimeError):
    """The peer refused the request, or the stream broke more often than allowed."""


@dataclass
class CatchUpStats:
    pages: int = 0
    samples_received: int = 0
    samples_written: int = 0
    resumes: int = 0
    slots_compared: int = 0
    slots_differing: int = 0
    ranges_copied: int = 0

    def add(self, other: CatchUpStats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


def local_apply(store: Store, durability: Durability | None = None) -> Apply:
    """Apply a page to ``store``: the samples it lacks, through the WAL when there is one.
    Raises WalError (the WAL cannot take writes) or CatchUpError (a page without needed labels)."""

    def apply(batch: pb.WriteRequest) -> int:
        req = missing_only(store, batch)
        if not req.ids:
            return 0
        if durability is not None:
            res = durability.write(req, catch_up=True)
        else:
            new = {s.id: labels_from_pb(s.labels) for s in req.series}
            valid = store.validate(*request_arrays(req), new, ooo_window_ms=CATCH_UP_WINDOW_MS)
            res = valid if isinstance(valid, WriteResult) else store.apply(valid)
        if res.unknown_ids:
            raise CatchUpError(f"a catch-up page lacks the labels of {len(res.unknown_ids)} series")
        return res.written

    return apply


async def catch_up(stub: pb_grpc.MetricsStub, slots: pb.SlotFilter, start_ms: int, end_ms: int, apply: Apply, *,
                   page_samples: int = 0, max_resumes: int = 5, backoff_s: float = 0.5, timeout_s: float = 300.0,
                   stats: CatchUpStats | None = None) -> CatchUpStats:
    """Stream [start_ms, end_ms] of ``slots`` from the peer behind ``stub`` into ``apply``.

    Resumes from the last token after a broken stream, up to ``max_resumes`` times (backing off);
    raises CatchUpError after that or when the peer rejects the request (INVALID_ARGUMENT).
    """
    stats = stats if stats is not None else CatchUpStats()
    token = b""
    failures = 0
    while True:
        req = pb.CatchUpRequest(slots=slots, start_ms=start_ms, end_ms=end_ms, resume_token=token,
                                max_samples_per_page=page_samples)
        try:
            async for page in stub.CatchUp(req, timeout=timeout_s):
                stats.pages += 1
                stats.samples_received += len(page.batch.timestamps)
                stats.samples_written += apply(page.batch)
                token = page.resume_token
                if not token:
                    return stats
            why = "the stream ended before its last page"
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise CatchUpError(f"peer refused catch-up: {e.details()}") from e
            why = f"{e.code().name}: {e.details()}"
        failures += 1
        if failures > max_resumes:
            raise CatchUpError(f"catch-up stream broke {failures} times; last: {why}")
        stats.resumes += 1
        log.info("catch-up stream broke (%s); resuming after %d pages", why, stats.pages)
        await asyncio.sleep(backoff_s * 2 ** (failures - 1))


def series_digests(resp: pb.DigestResponse, n_buckets: int) -> SeriesDigests:
    """The per-series part of a DigestResponse as arrays."""
    n = len(resp.series)
    buckets = np.zeros((n, n_buckets), dtype=np.uint64)
    for i, s in enumerate(resp.series):
        if len(s.bucket_hashes) != n_buckets:
            raise CatchUpError(f"digest of series {s.id:#x} has {len(s.bucket_hashes)} buckets, want {n_buckets}")
        buckets[i] = s.bucket_hashes
    return SeriesDigests(np.array([s.id for s in resp.series], dtype=np.uint64),
                         np.array([s.samples for s in resp.series], dtype=np.int64),
                         np.array([s.hash for s in resp.series], dtype=np.uint64), buckets)


async def sync_slots(stub: pb_grpc.MetricsStub, store: Store, apply: Apply, slot_count: int, slots: list[int],
                     start_ms: int, end_ms: int, bucket_ms: int, *, slots_per_digest: int = 16,
                     page_samples: int = 0, timeout_s: float = 60.0,
                     on_differ: Callable[[], Awaitable[None]] | None = None) -> CatchUpStats:
    """Copy from the peer what it holds of ``slots`` in [start_ms, end_ms] and this store does not.

    ``on_differ`` is awaited once, before the first copy, when some slot differs (a store
    announces that it is catching up only when it is).

    Raises CatchUpError, or grpc.aio.AioRpcError when a Digest call fails (the caller picks
    another peer or retries later).
    """
    stats = CatchUpStats()
    n_buckets = bucket_count(start_ms, end_ms, bucket_ms)
    for g in range(0, len(slots), slots_per_digest):
        group = sorted(slots[g : g + slots_per_digest])
        req = pb.DigestRequest(slots=pb.SlotFilter(slot_count=slot_count, slots=group), start_ms=start_ms,
                               end_ms=end_ms, bucket_ms=bucket_ms)
        remote = await stub.Digest(req, timeout=timeout_s)
        local = await store_digest_async(store, req)
        mine = {d.slot: (d.series, d.samples, d.hash) for d in local.slots}
        stats.slots_compared += len(group)
        empty: list[int] = []
        partial: list[int] = []
        for d in remote.slots:
            have = mine.get(d.slot, (0, 0, 0))
            if d.samples == 0 or have == (d.series, d.samples, d.hash):
                continue
            stats.slots_differing += 1
            (empty if have[1] == 0 else partial).append(d.slot)
        if (empty or partial) and on_differ is not None:
            await on_differ()
            on_differ = None
        if empty:  # nothing here yet: copy those slots whole, in one stream
            stats.ranges_copied += 1
            await catch_up(stub, pb.SlotFilter(slot_count=slot_count, slots=empty), start_ms, end_ms, apply,
                           page_samples=page_samples, stats=stats)
        for slot in partial:
            sreq = pb.DigestRequest(slots=pb.SlotFilter(slot_count=slot_count, slots=[slot]), start_ms=start_ms,
                                    end_ms=end_ms, bucket_ms=bucket_ms, per_series=True)
            theirs = series_digests(await stub.Digest(sreq, timeout=timeout_s), n_buckets)
            ours = series_digests(await store_digest_async(store, sreq), n_buckets)
            for lo, hi in repair_ranges(ours, theirs, start_ms, end_ms, bucket_ms):
                stats.ranges_copied += 1
                await catch_up(stub, pb.SlotFilter(slot_count=slot_count, slots=[slot]), lo, hi, apply,
                               page_samples=page_samples, stats=stats)
    return stats
