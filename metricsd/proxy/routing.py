"""Routing a columnar write batch: series id -> pod hash -> slot -> member sub-requests.

Clients refer to a series by id after sending its labels once (proto WriteRequest), so the proxy
learns id -> (pod hash, labels) from the labels clients send and keeps it in :class:`SeriesRouter`,
a bounded map. A batch naming an id the proxy has never seen (or has forgotten) is answered with
``unknown_ids`` and nothing is stored, exactly as a store answers; the client resends with labels.

Each member is sent one sub-request holding the series of all the slots it replicates in the
batch, with labels for the series it has not acknowledged yet (:class:`KnownIds`).
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from metricsd.maths.slots import pod_hash
from metricsd.model import Labels, pod_key, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import BadRequest
from metricsd.rpc.columns import WriteColumns, labels_entry

__all__ = ["Batch", "KnownIds", "SeriesRouter"]

BATCH_CACHE_BYTES = 32 * 2**20  # SeriesRouter's batches: ~2,000 batches of 1,000 series
BATCHES_PER_MEMBER = 65_536  # KnownIds' complete batches per member (hashes, ~5 MiB)
MAX_BIT = 1 << 62  # KnownIds' member bits: past it (members replaced 62 times) all is forgotten once
KEY_MISSES_BEFORE_SKIP = 1024  # KnownIds: batch keys looked up in vain in a row before keys are mostly skipped
KEY_RETRY_EVERY = 32  # KnownIds: while skipping, one batch in so many still gets a key


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
        # Two dicts, not one of (hash, labels) pairs: a batch the batch cache does not know (a real
        # Prometheus' never repeat) is routed by one C loop over ``_hashes`` (np.fromiter of
        # map(__getitem__)), 2.4x less CPU than a generator taking each pair's first item.
        self._hashes: dict[int, int] = {}
        self._labels: dict[int, bytes] = {}
        self.evicted = 0
        # An agent sends the same ids every tick: the pod hashes of a whole batch, keyed by its
        # ids' bytes, answer it with one dict lookup instead of one per series (perf/RESULTS.md).
        self.batch_cache_bytes = batch_cache_bytes
        self._batches: dict[bytes, np.ndarray] = {}
        self._batch_bytes = 0

    def __len__(self) -> int:
        return len(self._hashes)

    def learn(self, labels: Mapping[int, Labels]) -> dict[int, tuple[int, bytes]]:
        """Remember the route of each labelled series and return this batch's entries (so a batch
        larger than the cache still routes). Raises BadRequest when an id does not match its labels
        (it would be routed by another pod's hash)."""
        local: dict[int, tuple[int, bytes]] = {}
        for sid, lab in labels.items():
            h = self._hashes.get(sid)
            if h is None:
                if series_id(lab) != sid:
                    raise BadRequest(f"series {dict(lab)}: id {sid:#x} does not match its labels")
                entry = (pod_hash(pod_key(lab)), labels_entry(sid, lab))
                self._add(sid, entry)
            else:
                entry = (h, self._labels[sid])
            local[sid] = entry
        return local

    def _add(self, sid: int, entry: tuple[int, bytes]) -> None:
        if len(self._hashes) >= self.capacity:
            drop = max(1, self.capacity // 8)
            for old in list(self._hashes)[:drop]:
                del self._hashes[old]
                del self._labels[old]
            self.evicted += drop
            self._forget_batches()  # a cached batch must not route ids the routes no longer hold
        self._hashes[sid], self._labels[sid] = entry

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
        routes = self._hashes
        try:  # fast path: every id cached, no labels in the batch
            if not local:
                hashes = np.fromiter(map(routes.__getitem__, ids), dtype=np.uint64, count=len(ids))
                if key is not None:
                    self._remember_batch(key, hashes)
                return hashes, []
        except KeyError:
            pass
        unknown = [i for i in ids if i not in local and i not in routes]
        if unknown:
            return np.zeros(0, dtype=np.uint64), unknown
        return np.fromiter((local[i][0] if i in local else routes[i] for i in ids), dtype=np.uint64,
                           count=len(ids)), []

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
        labels = self._labels
        out = []
        for i in ids:
            e = local.get(i)
            b = e[1] if e is not None else labels.get(i)
            if b is not None:
                out.append(b)
        return b"".join(out)


class KnownIds:
    """Per member, the ids it acknowledged with labels, so labels go to a member once.

    A member that forgets (a restart) reports the ids in unknown_ids and the sender resends with
    labels; a member past ``limit`` ids forgets them all rather than piecemeal.

    One dict for every member: id -> a bit mask of the members that know it (each member a bit).
    At RF = members every member is asked about the same ids of a batch (Batch.part_bytes' ids,
    one array for all), so the ids are looked up once and the masks ANDed once; each member then
    reads its bit. A set per member looked every id up once per member, missing the CPU's caches
    on each (a real Prometheus' batches never repeat, so the complete-batch memo below never
    answers them: 9% of a proxy's CPU, perf/RESULTS.md issue 24 session 37). A member forgotten or
    past its limit gets a fresh bit; the old one stays set in masks and means nothing.

    Beside the masks, the ids every member with a bit knows (``_everyone``): once the cluster has
    been sent every series' labels, a batch's ids are all in it, and one C-level ``issuperset`` of
    the batch (~20 us for 500 ids) answers every member instead of ANDing the masks (~75 us, a
    Python call an id: 4% of a proxy under a real Prometheus, perf/RESULTS.md issue 24 session 43).
    Kept exact: an add puts in the ids it completes, a discard takes its ids out, and whenever the
    members' bits change (a member's first add, its limit, a forget) it is rebuilt from the masks.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._masks: dict[int, int] = {}
        self._bit: dict[str, int] = {}  # member -> its bit, 1 << index
        self._count: dict[str, int] = {}  # ids added under the member's bit
        self._next_bit = 1
        self._everyone: set[int] = set()  # ids whose mask holds every bit in _bit.values()
        self._last: tuple[np.ndarray, list[int], int] | None = None  # ids asked, as a list, masks ANDed
        # Per member, hash(batch key) of batches all of whose ids it knows: the live path then
        # skips the look-up of each id. A colliding hash would only send a batch without some
        # labels; the member answers unknown_ids and the sender resends them (writes.py).
        self._complete: dict[str, set[int]] = {}
        self._key_misses = 0  # batch keys looked up in a row without a hit
        self._key_skips = 0

    def wants_key(self) -> bool:
        """Whether a caller should build a batch key for :meth:`missing`: not while keys keep
        missing (a real Prometheus never sends one batch twice: a key built and hashed a member a
        batch answered nothing, ~1% of a proxy's CPU), but still every KEY_RETRY_EVERY-th batch,
        so a sender whose batches repeat (an agent) is found again and keys come back at its
        first hit. Without a key the answer is the same, from the ids."""
        if self._key_misses < KEY_MISSES_BEFORE_SKIP:
            return True
        self._key_skips += 1
        return self._key_skips % KEY_RETRY_EVERY == 0

    def _common(self, ids: Sequence[int] | np.ndarray, id_list: list[int] | None = None) -> tuple[list[int], int]:
        """``ids`` as a list (``id_list`` when given: the same ids, not to be changed) and the AND
        of their masks, reused while the same ids array is asked and nothing changed (every member
        of a batch's slots: a batch's arrays are not changed once made; a list is never reused, it
        may be)."""
        last = self._last
        if last is not None and last[0] is ids and isinstance(ids, np.ndarray):
            return last[1], last[2]
        as_list = _as_list(ids, id_list)
        if self._everyone.issuperset(as_list):  # every member with a bit knows them all
            common = -1
        else:
            get = self._masks.get
            common = functools.reduce(operator.and_, map(get, as_list, itertools.repeat(0)), -1) if as_list else -1
        self._last = (ids, as_list, common) if isinstance(ids, np.ndarray) else None
        return as_list, common

    def missing(self, member: str, ids: Sequence[int] | np.ndarray, key: bytes | None = None,
                id_list: list[int] | None = None) -> list[int]:
        """The ids among ``ids`` the member has not acknowledged with labels. ``key`` names the
        batch (its ids' bytes): a batch seen complete before answers without a look at its ids.
        ``id_list``: ``ids`` as ints when the caller has them (WriteColumns.id_list)."""
        complete = self._complete.get(member)
        if key is not None:
            if complete is not None and hash(key) in complete:
                self._key_misses = 0
                return []
            self._key_misses += 1
        bit = self._bit.get(member)
        if bit is None:
            return list(_as_list(ids, id_list))
        as_list, common = self._common(ids, id_list)
        if common & bit:
            if key is not None:
                complete = self._complete.setdefault(member, set())
                if len(complete) >= BATCHES_PER_MEMBER:
                    complete.clear()
                complete.add(hash(key))
            return []
        get = self._masks.get
        return [i for i in as_list if not get(i, 0) & bit]

    def _reset(self) -> None:
        """Forget everything: every member is sent labels once again (and gets a bit at its next add)."""
        self._masks.clear()
        self._bit.clear()
        self._count.clear()
        self._complete.clear()
        self._last = None
        self._next_bit = 1
        self._everyone.clear()

    def _fresh_bit(self, member: str) -> int:
        if self._next_bit > MAX_BIT:  # bits of members gone would make every mask a long int
            self._reset()
        bit = self._bit[member] = self._next_bit
        self._next_bit <<= 1
        self._count[member] = 0
        self._complete.pop(member, None)
        self._everyone.clear()  # no id has the new bit yet
        return bit

    def _rebuild_everyone(self) -> None:
        """_everyone afresh from the masks, after the members' bits changed (rare: O(ids))."""
        full = functools.reduce(operator.or_, self._bit.values(), 0)
        self._everyone = {i for i, m in self._masks.items() if m & full == full} if full else set()

    def add(self, member: str, ids: Iterable[int]) -> None:
        self._last = None
        bit = self._bit.get(member) or self._fresh_bit(member)
        masks = self._masks
        full = functools.reduce(operator.or_, self._bit.values(), 0)
        everyone = self._everyone
        added = 0
        for i in ids:
            m = masks.get(i, 0)
            if not m & bit:
                m = masks[i] = m | bit
                added += 1
                if m & full == full:
                    everyone.add(i)
        self._count[member] += added
        if self._count[member] > self.limit:
            self._fresh_bit(member)  # no id has its new bit: _everyone emptied
        if len(masks) > max(self.limit, 2 * max(self._count.values(), default=0)):
            self._reset()  # ids of series long gone: every member is sent labels once again

    def discard(self, member: str, ids: Iterable[int]) -> None:
        self._last = None
        self._complete.pop(member, None)
        bit = self._bit.get(member)
        if bit is None:
            return
        masks = self._masks
        for i in ids:
            m = masks.get(i, 0)
            if m & bit:
                masks[i] = m & ~bit
                self._count[member] -= 1
                self._everyone.discard(i)

    def forget(self, members: Iterable[str]) -> None:
        self._last = None
        for m in members:
            self._bit.pop(m, None)
            self._count.pop(m, None)
            self._complete.pop(m, None)
        self._rebuild_everyone()  # fewer bits to hold: more ids known by every member left


def _as_list(ids: Sequence[int] | np.ndarray, id_list: list[int] | None) -> list[int]:
    """``ids`` as ints: ``id_list`` when the caller had them (the same ids; shared, not changed)."""
    if id_list is not None:
        return id_list
    return ids.tolist() if isinstance(ids, np.ndarray) else list(ids)


@dataclass
class Batch:
    """A client's write batch in columns, with each series' slot under one shard map."""

    columns: WriteColumns
    router: SeriesRouter
    local: dict[int, tuple[int, bytes]]  # the batch's own labels, from SeriesRouter.learn
    slots: np.ndarray  # int64, per series
    key: bytes = b""  # ids.tobytes(): the batch's identity for SeriesRouter and KnownIds
    num_slots: int = 0
    _parts: dict[tuple[int, ...], tuple[bytes, np.ndarray]] = field(default_factory=dict)
    _slot_set: list[int] | None = None

    @classmethod
    def of(cls, columns: WriteColumns, router: SeriesRouter, local: dict[int, tuple[int, bytes]],
           hashes: np.ndarray, num_slots: int) -> Batch:
        """Raises BadRequest when the columns do not add up (the split needs them to)."""
        ids, counts = columns.ids, columns.counts
        if len(ids) != len(counts):
            raise BadRequest(f"batch has {len(ids)} series ids but {len(counts)} counts")
        if len(columns.timestamps) != len(columns.values):
            raise BadRequest(f"batch has {len(columns.timestamps)} timestamps but {len(columns.values)} values")
        if int(counts.sum()) != len(columns.timestamps) or bool((counts < 0).any()):
            raise BadRequest(f"counts add up to {int(counts.sum())} but the batch has {len(columns.timestamps)} "
                             "samples")
        slots = (hashes % np.uint64(num_slots)).astype(np.int64)
        return cls(columns, router, local, slots, ids.tobytes(), num_slots)

    @property
    def ids(self) -> np.ndarray:
        return self.columns.ids

    def sub_key(self, slots: Sequence[int]) -> bytes:
        """Names the ids of ``part_bytes(slots)``: the batch's ids, the slot count and the slots."""
        return self.key + np.array([self.num_slots, *slots], dtype=np.int64).tobytes()

    def labels_of(self, ids: Iterable[int] | np.ndarray) -> bytes:
        """The ``series`` entries of ``ids`` as wire bytes: appended to a part, they merge into it."""
        return self.router.labels_of(ids.tolist() if isinstance(ids, np.ndarray) else ids, self.local)

    @property
    def samples(self) -> int:
        return self.columns.samples

    def slot_set(self) -> list[int]:
        if self._slot_set is None:
            # counted, not sorted: np.unique's sort of a live batch's 2,000 slots took ~120 us
            self._slot_set = np.flatnonzero(np.bincount(self.slots, minlength=self.num_slots)).tolist()
        return self._slot_set

    def part_bytes(self, slots: Sequence[int]) -> tuple[bytes, np.ndarray]:
        """The series of ``slots`` as WriteRequest bytes without labels, and their ids: encoded from
        the columns once for every member given the same slots (at RF = members, every member;
        the whole batch then keeps the sender's timestamp bytes). Append ``labels_of(ids)`` to add
        labels."""
        key = tuple(slots)
        got = self._parts.get(key)
        if got is None:
            part = self.columns
            if len(key) != len(self.slot_set()):
                part = part.select(np.isin(self.slots, np.asarray(slots, dtype=np.int64)))
            got = self._parts[key] = (part.wire(labelled=()), part.ids)
        return got

    def sub_request(self, slots: Sequence[int]) -> tuple[pb.WriteRequest, np.ndarray]:
        """part_bytes(slots) as a message (a hint to hand off). Add labels with
        ``MergeFromString(batch.labels_of(ids))``."""
        raw, ids = self.part_bytes(slots)
        return pb.WriteRequest.FromString(raw), ids
