"""Routing a columnar write batch: series id -> pod hash -> slot -> member sub-requests.

Clients refer to a series by id after sending its labels once (proto WriteRequest), so the proxy
learns id -> (pod hash, labels) from the labels clients send and keeps it in :class:`SeriesRouter`,
a bounded map. A batch naming an id the proxy has never seen (or has forgotten) is answered with
``unknown_ids`` and nothing is stored, exactly as a store answers; the client resends with labels.

Each member is sent one sub-request holding the series of all the slots it replicates in the
batch, with labels for the series it has not acknowledged yet (:class:`KnownIds`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from metricsd.maths.slots import pod_hash
from metricsd.model import InvalidSeries, pod_key, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import BadRequest
from metricsd.rpc.wire import labels_from_pb, length_delimited

__all__ = ["Batch", "KnownIds", "SeriesRouter", "labels_field"]

_SERIES_FIELD = 5  # WriteRequest.series, proto/metricsd.proto
BATCH_CACHE_BYTES = 32 * 2**20  # SeriesRouter's batches: ~2,000 batches of 1,000 series
BATCHES_PER_MEMBER = 65_536  # KnownIds' complete batches per member (hashes, ~5 MiB)


def labels_field(s: pb.SeriesLabels) -> bytes:
    """One ``WriteRequest.series`` entry as wire bytes, so sub-requests add labels with one
    MergeFromString instead of building messages per series."""
    body = s.SerializeToString()
    return length_delimited(_SERIES_FIELD, body)


class SeriesRouter:
    """Series id -> (pod hash, encoded labels), bounded to ``capacity`` entries.

    Eviction is first-in first-out in batches of an eighth of the capacity (cheaper than LRU
    bookkeeping on the per-sample path); an evicted series costs its client one labels resend.
    About 300 bytes per entry. Not thread-safe.
    """

    def __init__(self, capacity: int, batch_cache_bytes: int = BATCH_CACHE_BYTES) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._routes: dict[int, tuple[int, bytes]] = {}
        self.evicted = 0
        # An agent sends the same ids every tick: the pod hashes of a whole batch, keyed by its
        # ids' bytes, answer it with one dict lookup instead of one per series (perf/RESULTS.md).
        self.batch_cache_bytes = batch_cache_bytes
        self._batches: dict[bytes, np.ndarray] = {}
        self._batch_bytes = 0

    def __len__(self) -> int:
        return len(self._routes)

    def learn(self, series: Iterable[pb.SeriesLabels]) -> dict[int, tuple[int, bytes]]:
        """Remember the route of each series and return this batch's entries (so a batch larger
        than the cache still routes). Raises BadRequest when an id does not match its labels (it
        would be routed by another pod's hash) or the labels are malformed."""
        local: dict[int, tuple[int, bytes]] = {}
        for s in series:
            entry = self._routes.get(s.id)
            if entry is None:
                try:
                    labels = labels_from_pb(s.labels)
                except InvalidSeries as e:
                    raise BadRequest(str(e)) from e
                if series_id(labels) != s.id:
                    raise BadRequest(f"series {dict(labels)}: id {s.id:#x} does not match its labels")
                entry = (pod_hash(pod_key(labels)), labels_field(s))
                self._add(s.id, entry)
            local[s.id] = entry
        return local

    def _add(self, sid: int, entry: tuple[int, bytes]) -> None:
        if len(self._routes) >= self.capacity:
            drop = max(1, self.capacity // 8)
            for old in list(self._routes)[:drop]:
                del self._routes[old]
            self.evicted += drop
            self._forget_batches()  # a cached batch must not route ids the routes no longer hold
        self._routes[sid] = entry

    def _forget_batches(self) -> None:
        self._batches.clear()
        self._batch_bytes = 0

    def resolve(self, ids: Sequence[int] | np.ndarray, local: dict[int, tuple[int, bytes]],
                key: bytes | None = None) -> tuple[np.ndarray, list[int]]:
        """(pod hashes of ``ids``, unknown ids): from the batch's own entries (``local``, from
        :meth:`learn`) or the cache. Hashes are empty when some ids are unknown. ``key`` (the
        ids as uint64 bytes) looks the whole batch up at once; the result is then shared: read only."""
        if not local and key is not None:
            hit = self._batches.get(key)
            if hit is not None:
                return hit, []
        if isinstance(ids, np.ndarray):
            ids = ids.tolist()
        routes = self._routes
        try:  # fast path: every id cached, no labels in the batch
            if not local:
                hashes = np.fromiter((routes[i][0] for i in ids), dtype=np.uint64, count=len(ids))
                if key is not None:
                    self._remember_batch(key, hashes)
                return hashes, []
        except KeyError:
            pass
        unknown = [i for i in ids if i not in local and i not in routes]
        if unknown:
            return np.zeros(0, dtype=np.uint64), unknown
        return np.fromiter(((local.get(i) or routes[i])[0] for i in ids), dtype=np.uint64, count=len(ids)), []

    def _remember_batch(self, key: bytes, hashes: np.ndarray) -> None:
        size = len(key) + hashes.nbytes + 100
        if self._batch_bytes + size > self.batch_cache_bytes:
            self._forget_batches()  # whole, as the route cache evicts: no bookkeeping per lookup
        if size <= self.batch_cache_bytes:
            hashes.flags.writeable = False
            self._batches[key] = hashes
            self._batch_bytes += size

    def labels_of(self, ids: Iterable[int], local: dict[int, tuple[int, bytes]]) -> bytes:
        """The ``series`` entries of the known ids among ``ids``, as wire bytes."""
        routes = self._routes
        out = []
        for i in ids:
            e = local.get(i) or routes.get(i)
            if e is not None:
                out.append(e[1])
        return b"".join(out)


class KnownIds:
    """Per member, the ids it acknowledged with labels, so labels go to a member once.

    A member that forgets (a restart) reports the ids in unknown_ids and the sender resends with
    labels; a set past ``limit`` is cleared rather than evicted piecemeal.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._known: dict[str, set[int]] = {}
        # Per member, hash(batch key) of batches all of whose ids it knows: the live path then
        # skips a set lookup per series. A colliding hash would only send a batch without some
        # labels; the member answers unknown_ids and the sender resends them (writes.py).
        self._complete: dict[str, set[int]] = {}

    def missing(self, member: str, ids: list[int], key: bytes | None = None) -> list[int]:
        complete = self._complete.get(member)
        if key is not None and complete is not None and hash(key) in complete:
            return []
        known = self._known.get(member)
        if not known:
            return list(ids)
        if known.issuperset(ids):  # a C loop, no list built
            if key is not None:
                complete = self._complete.setdefault(member, set())
                if len(complete) >= BATCHES_PER_MEMBER:
                    complete.clear()
                complete.add(hash(key))
            return []
        return [i for i in ids if i not in known]

    def add(self, member: str, ids: Iterable[int]) -> None:
        known = self._known.setdefault(member, set())
        known.update(ids)
        if len(known) > self.limit:
            known.clear()
            self._complete.pop(member, None)

    def discard(self, member: str, ids: Iterable[int]) -> None:
        known = self._known.get(member)
        if known:
            known.difference_update(ids)
        self._complete.pop(member, None)

    def forget(self, members: Iterable[str]) -> None:
        for m in members:
            self._known.pop(m, None)
            self._complete.pop(m, None)


@dataclass
class Batch:
    """A client's WriteRequest as arrays, with each series' slot under one shard map."""

    request: pb.WriteRequest
    router: SeriesRouter
    local: dict[int, tuple[int, bytes]]  # the batch's own labels, from SeriesRouter.learn
    ids: np.ndarray  # uint64, per series
    counts: np.ndarray  # int64, per series
    slots: np.ndarray  # int64, per series
    key: bytes = b""  # ids.tobytes(): the batch's identity for SeriesRouter and KnownIds
    num_slots: int = 0
    _id_list: list[int] | None = None
    _columns: tuple[np.ndarray, np.ndarray] | None = None
    _parts: dict[tuple[int, ...], tuple[bytes, list[int]]] = field(default_factory=dict)
    _slot_set: list[int] | None = None

    @classmethod
    def of(cls, request: pb.WriteRequest, router: SeriesRouter, local: dict[int, tuple[int, bytes]],
           hashes: np.ndarray, num_slots: int, ids: np.ndarray | None = None) -> Batch:
        """Raises BadRequest when the columns do not add up (the split needs them to)."""
        if ids is None:
            ids = np.array(request.ids, dtype=np.uint64)
        counts = np.array(request.counts, dtype=np.int64)
        if len(ids) != len(counts):
            raise BadRequest(f"batch has {len(ids)} series ids but {len(counts)} counts")
        if len(request.timestamps) != len(request.values):
            raise BadRequest(f"batch has {len(request.timestamps)} timestamps but {len(request.values)} values")
        if int(counts.sum()) != len(request.timestamps):
            raise BadRequest(f"counts add up to {int(counts.sum())} but the batch has {len(request.timestamps)} "
                             "samples")
        slots = (hashes % np.uint64(num_slots)).astype(np.int64)
        return cls(request, router, local, ids, counts, slots, ids.tobytes(), num_slots)

    def sub_key(self, slots: Sequence[int]) -> bytes:
        """Names the ids of ``sub_request(slots)``: the batch's ids, the slot count and the slots."""
        return self.key + np.array([self.num_slots, *slots], dtype=np.int64).tobytes()

    @property
    def id_list(self) -> list[int]:
        """``ids`` as Python ints, made once for every member's sub-request."""
        if self._id_list is None:
            self._id_list = self.ids.tolist()
        return self._id_list

    def labels_of(self, ids: Iterable[int]) -> bytes:
        """The ``series`` entries of ``ids`` as wire bytes: add them with MergeFromString."""
        return self.router.labels_of(ids, self.local)

    @property
    def samples(self) -> int:
        return len(self.request.timestamps)

    def slot_set(self) -> list[int]:
        if self._slot_set is None:
            self._slot_set = np.unique(self.slots).tolist()
        return self._slot_set

    def part_bytes(self, slots: Sequence[int]) -> tuple[bytes, list[int]]:
        """``sub_request(slots)`` serialized, and its ids: made once for every member given the same
        slots (at RF = members, every member). Append ``labels_of(ids)`` to add labels."""
        key = tuple(slots)
        got = self._parts.get(key)
        if got is None:
            if not len(self.request.series) and len(key) == len(self.slot_set()):
                got = (self.request.SerializeToString(), self.id_list)  # the whole batch: no copy
            else:
                sub, ids = self.sub_request(slots)
                got = (sub.SerializeToString(), ids)
            self._parts[key] = got
        return got

    def sub_request(self, slots: Sequence[int]) -> tuple[pb.WriteRequest, list[int]]:
        """The series of ``slots`` without labels, and their ids. Add labels with
        ``MergeFromString(batch.labels_of(ids))``."""
        mask = np.isin(self.slots, np.asarray(slots, dtype=np.int64))
        sub = pb.WriteRequest()
        if bool(mask.all()):  # fast path: the member replicates every slot of the batch
            sub.CopyFrom(self.request)  # one copy in C rather than four extends
            if len(sub.series):
                sub.ClearField("series")
            return sub, self.id_list
        ids = self.ids[mask]
        sample_mask = np.repeat(mask, self.counts)
        if self._columns is None:  # once per batch, not once per member
            self._columns = (np.array(self.request.timestamps, dtype=np.int64),
                             np.array(self.request.values, dtype=np.float64))
        timestamps, values = self._columns
        sub.ids.extend(ids.tolist())
        sub.counts.extend(self.counts[mask].tolist())
        sub.timestamps.extend(timestamps[sample_mask].tolist())
        sub.values.extend(values[sample_mask].tolist())
        return sub, ids.tolist()
