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
from dataclasses import dataclass

import numpy as np

from metricsd.maths.slots import pod_hash
from metricsd.model import InvalidSeries, pod_key, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import BadRequest
from metricsd.rpc.wire import labels_from_pb, length_delimited

__all__ = ["Batch", "KnownIds", "SeriesRouter", "labels_field"]

_SERIES_FIELD = 5  # WriteRequest.series, proto/metricsd.proto


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

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._routes: dict[int, tuple[int, bytes]] = {}
        self.evicted = 0

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
        self._routes[sid] = entry

    def resolve(self, ids: Sequence[int], local: dict[int, tuple[int, bytes]]) -> tuple[np.ndarray, list[int]]:
        """(pod hashes of ``ids``, unknown ids): from the batch's own entries (``local``, from
        :meth:`learn`) or the cache. Hashes are empty when some ids are unknown."""
        routes = self._routes
        try:  # fast path: every id cached, no labels in the batch
            if not local:
                return np.fromiter((routes[i][0] for i in ids), dtype=np.uint64, count=len(ids)), []
        except KeyError:
            pass
        unknown = [i for i in ids if i not in local and i not in routes]
        if unknown:
            return np.zeros(0, dtype=np.uint64), unknown
        return np.fromiter(((local.get(i) or routes[i])[0] for i in ids), dtype=np.uint64, count=len(ids)), []

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

    def missing(self, member: str, ids: list[int]) -> list[int]:
        known = self._known.get(member)
        if not known:
            return list(ids)
        if known.issuperset(ids):  # the live path: a C loop, no list built
            return []
        return [i for i in ids if i not in known]

    def add(self, member: str, ids: Iterable[int]) -> None:
        known = self._known.setdefault(member, set())
        known.update(ids)
        if len(known) > self.limit:
            known.clear()

    def discard(self, member: str, ids: Iterable[int]) -> None:
        known = self._known.get(member)
        if known:
            known.difference_update(ids)

    def forget(self, members: Iterable[str]) -> None:
        for m in members:
            self._known.pop(m, None)


@dataclass
class Batch:
    """A client's WriteRequest as arrays, with each series' slot under one shard map."""

    request: pb.WriteRequest
    router: SeriesRouter
    local: dict[int, tuple[int, bytes]]  # the batch's own labels, from SeriesRouter.learn
    ids: np.ndarray  # uint64, per series
    counts: np.ndarray  # int64, per series
    slots: np.ndarray  # int64, per series

    @classmethod
    def of(cls, request: pb.WriteRequest, router: SeriesRouter, local: dict[int, tuple[int, bytes]],
           hashes: np.ndarray, num_slots: int) -> Batch:
        """Raises BadRequest when the columns do not add up (the split needs them to)."""
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
        return cls(request, router, local, ids, counts, slots)

    def labels_of(self, ids: Iterable[int]) -> bytes:
        """The ``series`` entries of ``ids`` as wire bytes: add them with MergeFromString."""
        return self.router.labels_of(ids, self.local)

    @property
    def samples(self) -> int:
        return len(self.request.timestamps)

    def slot_set(self) -> list[int]:
        return np.unique(self.slots).tolist()

    def sub_request(self, slots: Sequence[int]) -> tuple[pb.WriteRequest, list[int]]:
        """The series of ``slots`` without labels, and their ids. Add labels with
        ``MergeFromString(batch.labels_of(ids))``."""
        mask = np.isin(self.slots, np.asarray(slots, dtype=np.int64))
        sub = pb.WriteRequest()
        if bool(mask.all()):  # fast path: the member replicates every slot of the batch
            r = self.request
            sub.ids.extend(r.ids)
            sub.counts.extend(r.counts)
            sub.timestamps.extend(r.timestamps)
            sub.values.extend(r.values)
            return sub, self.ids.tolist()
        ids = self.ids[mask]
        sample_mask = np.repeat(mask, self.counts)
        sub.ids.extend(ids.tolist())
        sub.counts.extend(self.counts[mask].tolist())
        sub.timestamps.extend(np.array(self.request.timestamps, dtype=np.int64)[sample_mask].tolist())
        sub.values.extend(np.array(self.request.values, dtype=np.float64)[sample_mask].tolist())
        return sub, ids.tolist()
