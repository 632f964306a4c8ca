"""Slot digests of a range by whole chunks: what a proxy asks every replica of a slot before it
reads a closed hour from one of them (metricsd/proxy/hourread.py; DigestRequest.cover_chunks).

A digest of exactly [start, end] (digest.py) decodes every chunk that straddles a bound; with
chunks of 720 samples (2 h at 10 s) every chunk of an hour straddles one, so that digest costs
what reading the hour costs. This one covers, per series, every sample of each chunk (closed or
open) that overlaps the range, by the hash sum the chunk keeps, plus the samples of its ring not
yet sealed into a chunk that lie in the range (hashed here, no decoding). So: no chunk decoded.

Why equal digests are enough: a replica's samples in the range are each either in a chunk that
overlaps the range or unsealed in the range, so they are the covered set restricted to the range.
Two replicas whose covered sets are equal (equal digests: a sum of 64-bit mixes; a difference
cancels with probability about 2^-64) hold the same samples in the range. Replicas that cut their
chunks elsewhere (one caught up from a peer, say) cover different sets and usually differ: the
caller then reads the slot from R replicas and merges, as any read does. Wrong answers never
come from it, only a slower read.

The per-series and per-slot combination is digest.py's (``combine_slots``), so the slot hash has
the same form; only the set of samples hashed differs. No I/O.
"""

from __future__ import annotations

import asyncio

import numpy as np

from metricsd.maths.samplehash import sample_hashes
from metricsd.maths.slots import SlotFilter
from metricsd.proto import metricsd_pb2 as pb
from metricsd.replica.digest import SeriesDigests, combine_slots, digest_request
from metricsd.store.chunks import STRIDE
from metricsd.store.engine import Store

__all__ = ["SLICE_SERIES", "cover_digest", "cover_digest_async", "cover_series"]

SLICE_SERIES = 4_000
"""Series between two yields of cover_digest_async: a Python step per series (its chunk index),
about 2 µs each, so some 10 ms a slice."""


def cover_series(store: Store, rows: np.ndarray, start_ms: int, end_ms: int) -> tuple[np.ndarray, SeriesDigests]:
    """(the rows with anything covered; per such row: id, samples covered, their hash sum): see the
    module's doc."""
    rows = np.asarray(rows, dtype=np.int64)
    n = len(rows)
    samples = np.zeros(n, np.int64)
    hashes = np.zeros(n, np.uint64)
    if n:
        chunks = store.chunks
        entries = [chunks.entries(r) for r in rows.tolist()]
        lens = np.fromiter((len(e) for e in entries), np.int64, n)
        if int(lens.sum()):
            ix = np.concatenate(entries).reshape(-1, STRIDE)
            series = np.repeat(np.arange(n, dtype=np.int64), lens)
            hit = (ix[:, 1] >= start_ms) & (ix[:, 0] <= end_ms)
            np.add.at(samples, series[hit], ix[hit, 3])
            np.add.at(hashes, series[hit], ix[hit, 4].view(np.uint64))
        # the ring's samples in no chunk yet: its newest ``unsealed`` (digest.SlotSamples reads them alike)
        head = store.head
        u = head.unsealed[rows].astype(np.int64)
        width = max(1, int(u.max()))
        ht, hv, cnt = head.newest(rows, width)
        cols = np.arange(width)[None, :]
        mine = (cols >= (cnt - u)[:, None]) & (cols < cnt[:, None]) & (ht >= start_ms) & (ht <= end_ms)
        which = np.nonzero(mine)[0]
        if len(which):
            np.add.at(samples, which, 1)
            np.add.at(hashes, which, sample_hashes(ht[mine], hv[mine]))
    keep = samples > 0
    return rows[keep], SeriesDigests(store.index.id_column[rows[keep]].astype(np.uint64), samples[keep], hashes[keep],
                                     None)


def _check(request: pb.DigestRequest) -> tuple[int, list[int]]:
    slot_count, slots = digest_request(request)
    if request.per_series or request.bucket_ms:
        raise ValueError("cover_chunks digests whole slots: no per_series, no bucket_ms")
    return slot_count, slots


def _response(slots: list[int], parts: list[tuple[np.ndarray, SeriesDigests]]) -> pb.DigestResponse:
    series_slots = np.concatenate([s for s, _ in parts]) if parts else np.zeros(0, np.int64)
    ids, samples, hashes = (np.concatenate([getattr(p, f) for _, p in parts]) if parts else np.zeros(0, np.uint64)
                            for f in ("ids", "samples", "hashes"))
    d = SeriesDigests(ids, samples, hashes, None)
    per_slot = combine_slots(np.array(slots, np.int64), series_slots, d)
    resp = pb.DigestResponse()
    for i, slot in enumerate(per_slot.slots.tolist()):
        resp.slots.add(slot=slot, series=int(per_slot.series[i]), samples=int(per_slot.samples[i]),
                       hash=int(per_slot.hashes[i]))
    return resp


def _part(store: Store, slot_count: int, rows: np.ndarray, start_ms: int, end_ms: int
          ) -> tuple[np.ndarray, SeriesDigests]:
    """(the slot of each series digested, the digests) of some rows."""
    kept, d = cover_series(store, rows, start_ms, end_ms)
    slots = ((store.index.pod_hash[kept] % np.uint64(slot_count)).astype(np.int64) if slot_count
             else np.zeros(len(kept), np.int64))
    return slots, d


def _rows(store: Store, slot_count: int, slots: list[int]) -> np.ndarray:
    return np.asarray(store.select([], SlotFilter(slot_count, tuple(slots)) if slot_count else None), np.int64)


def cover_digest(store: Store, request: pb.DigestRequest) -> pb.DigestResponse:
    """Answer a DigestRequest with cover_chunks at once. Raises ValueError for a bad request."""
    slot_count, slots = _check(request)
    rows = _rows(store, slot_count, slots)
    return _response(slots, [_part(store, slot_count, rows, request.start_ms, request.end_ms)])


async def cover_digest_async(store: Store, request: pb.DigestRequest, slice_series: int = SLICE_SERIES
                             ) -> pb.DigestResponse:
    """cover_digest, yielding to the event loop between slices of series. A series written
    meanwhile is covered before or after the write; the proxy asks for a closed hour, which only a
    late sample changes, and a difference only sends it the slow way."""
    slot_count, slots = _check(request)
    rows = _rows(store, slot_count, slots)
    parts = []
    for i in range(0, len(rows), slice_series):
        parts.append(_part(store, slot_count, rows[i : i + slice_series], request.start_ms, request.end_ms))
        await asyncio.sleep(0)
    return _response(slots, parts)
