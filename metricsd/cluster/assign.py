"""Slot assignment: (live members, old map) -> new map. Pure and deterministic; no etcd here.

The leader config server calls :func:`assign` whenever the set of live members changes and
writes the result if it differs from the old map. The result satisfies, in this order:

1. **Distinct replicas.** A slot's replicas are on different members.
2. **Replica count.** Every slot has ``r = min(rf, number of members)`` replicas: a cluster with
   fewer members than RF keeps every slot on every member (fewer copies than asked for, but as
   many as exist), and grows to RF copies as members join.
3. **Balance.** With ``T = slots * r`` replicas and ``n`` members, every member holds
   ``floor(T / n)`` or ``ceil(T / n)``; the extra ones go to the members already holding most, so
   that balancing does not itself move data.
4. **Few moves.** Every replica that can stay, stays (in its position: the first replica of a
   slot, the one reads prefer, stays first). A member that joins takes replicas only from members
   above their new share; a member that leaves has only its own replicas moved, to members below
   theirs. Moving a replica means a store copying a slot's data from its peers, so this is the
   measure that matters. Choosing new places is a bipartite matching (holes to members with
   room, not already in the slot), solved with augmenting paths; only when no matching exists does
   a replica swap places, at the cost of one more move.
5. **Determinism.** The same inputs give the same map, in any process: ties break on member id,
   never on set or dict order. For a fresh map, ties also rotate with the slot number, so each
   member is first replica of about ``slots / n`` slots.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence

from metricsd.cluster.shardmap import Member, ShardMap

__all__ = ["assign", "assign_slots", "moved_replicas"]

Slots = tuple[tuple[str, ...], ...]


def assign(
    members: Iterable[Member] | Mapping[str, Member], old: ShardMap | None, num_slots: int = 64, rf: int = 3
) -> ShardMap:
    """The map for ``members`` (the live ones: the caller leaves out dead and leaving members).

    Returns ``old`` itself when nothing changes, else a map with ``old.version + 1`` (1 when
    there is no old map). Raises ValueError for ``num_slots`` < 1 or ``rf`` < 1.
    """
    member_list = list(members.values()) if isinstance(members, Mapping) else list(members)
    by_id = {m.id: m for m in member_list}
    if len(by_id) != len(member_list):
        raise ValueError("a member id appears twice")
    slots = assign_slots(by_id, None if old is None else old.slots, num_slots, rf)
    if old is not None and old.slots == slots and old.rf == rf and dict(old.members) == by_id:
        return old
    version = 1 if old is None else old.version + 1
    return ShardMap(version=version, rf=rf, slots=slots, members=dict(sorted(by_id.items())))


def moved_replicas(old: Sequence[Sequence[str]], new: Sequence[Sequence[str]]) -> int:
    """How many (slot, member) replicas of ``new`` were not in ``old``: the copies to make."""
    if len(old) != len(new):
        return sum(len(r) for r in new)
    return sum(len(set(n) - set(o)) for o, n in zip(old, new, strict=True))


def assign_slots(
    member_ids: Iterable[str], old_slots: Sequence[Sequence[str]] | None, num_slots: int, rf: int
) -> Slots:
    """The slot table alone; see the module docstring for the guarantees. O(slots * rf * n)."""
    if num_slots < 1:
        raise ValueError(f"the slot count must be at least 1, got {num_slots}")
    if rf < 1:
        raise ValueError(f"rf must be at least 1, got {rf}")
    ids = sorted(set(member_ids))
    if not ids:
        return ((),) * num_slots
    fresh = old_slots is None or len(old_slots) != num_slots
    table = _Table(ids, [] if fresh or old_slots is None else old_slots, num_slots, min(rf, len(ids)))
    table.shed()
    table.fill(rotate=fresh)
    return table.result()


class _Table:
    """The working state of one assignment. Holes are ``None`` entries in a slot's list."""

    def __init__(self, ids: list[str], old: Sequence[Sequence[str]], num_slots: int, r: int) -> None:
        self.ids = ids
        self.rank = {m: i for i, m in enumerate(ids)}
        self.r = r
        live = set(ids)
        self.slots: list[list[str | None]] = []
        for i in range(num_slots):
            kept: list[str | None] = []  # a dead member leaves a hole in its position
            for member in old[i] if i < len(old) else ():
                kept.append(member if member in live and member not in kept else None)
            self.slots.append(kept)
        self.load = dict.fromkeys(ids, 0)
        for replicas in self.slots:
            for held in replicas:
                if held is not None:
                    self.load[held] += 1
        self._trim()
        self.base, self.extra = divmod(num_slots * r, len(ids))
        by_load = sorted(ids, key=lambda m: (-self.load[m], self.rank[m]))
        # Who sheds how much: the `extra` busiest members may keep base + 1.
        self.target = {m: self.base + (1 if i < self.extra else 0) for i, m in enumerate(by_load)}

    def _trim(self) -> None:
        """Drop replicas beyond r (rf was lowered), taking them from the busiest members."""
        for replicas in self.slots:
            while len(replicas) > self.r and None in replicas:
                del replicas[len(replicas) - 1 - replicas[::-1].index(None)]
            while len(replicas) > self.r:
                victim = max(
                    (m for m in replicas if m is not None), key=lambda m: (self.load[m], self.rank[m])
                )
                assert victim is not None
                replicas.remove(victim)
                self.load[victim] -= 1

    def deficit(self, m: str) -> int:
        return self.target[m] - self.load[m]

    def shed(self) -> None:
        """Members above target give up replicas, where a member below target can take them."""
        for m in self.ids:
            for _ in range(-self.deficit(m)):
                slot = min(
                    (i for i, replicas in enumerate(self.slots) if m in replicas),
                    key=lambda i: self._shed_cost(i, m),
                )
                replicas = self.slots[slot]
                replicas[replicas.index(m)] = None
                self.load[m] -= 1

    def _shed_cost(self, slot: int, m: str) -> tuple[int, int, int, int]:
        replicas = self.slots[slot]
        holes = replicas.count(None)
        takers = sum(1 for u in self.ids if self.load[u] <= self.base and u not in replicas)
        return (holes, 0 if takers > holes else 1, -replicas.index(m), slot)

    def fill(self, *, rotate: bool) -> None:
        """Fill every hole with a member that has room and is not in the slot yet.

        A max-flow problem: source -> slot (its holes) -> member (not in the slot) -> sink, where a
        member's edge to the sink carries what it must take to reach ``base`` and one more unit
        may pass through a shared node that admits only as many as there are ``base + 1`` places
        left. A greedy pass (round robin for a fresh map, neediest member first otherwise) finds
        most of the flow; breadth-first augmenting paths find the rest.
        """
        n, base = len(self.ids), self.base
        for replicas in self.slots:
            replicas.extend([None] * (self.r - len(replicas)))
        holes = [replicas.count(None) for replicas in self.slots]
        if not any(holes):
            return
        self.greedy_chosen: list[list[str]] = [[] for _ in self.slots]
        self.pairs: dict[tuple[str, str], int] = {}
        for replicas in self.slots:
            kept = [m for m in replicas if m is not None]
            for a in kept:
                for b in kept:
                    if a != b:
                        self.pairs[a, b] = self.pairs.get((a, b), 0) + 1
        graph = _Flow(3 + len(self.slots) + n)
        source, sink, extra_node = 0, 1, 2
        member_node = {m: 3 + len(self.slots) + k for k, m in enumerate(self.ids)}
        to_sink: dict[str, int] = {}
        to_extra: dict[str, int] = {}
        for m in self.ids:
            if base - self.load[m] > 0:
                to_sink[m] = graph.add(member_node[m], sink, base - self.load[m])
            if self.load[m] <= base:
                to_extra[m] = graph.add(member_node[m], extra_node, 1)
        extras_left = self.extra - sum(1 for m in self.ids if self.load[m] == base + 1)
        extra_edge = graph.add(extra_node, sink, max(0, extras_left))
        slot_edges: list[dict[str, int]] = []
        for slot, replicas in enumerate(self.slots):
            edges: dict[str, int] = {}
            if holes[slot]:
                first = graph.add(source, 3 + slot, holes[slot])
                for m in self.ids:
                    if m not in replicas:
                        edges[m] = graph.add(3 + slot, member_node[m], 1)
                for _ in range(holes[slot]):
                    self._greedy_step(graph, slot, edges, first, to_sink, to_extra, extra_edge, rotate)
            slot_edges.append(edges)
        graph.max_flow(source, sink)
        for slot, edges in enumerate(slot_edges):
            chosen = [m for m, e in edges.items() if graph.flow(e) > 0]
            chosen.sort(key=lambda m: (self.rank[m] - slot) % n if rotate else self.rank[m])
            replicas = self.slots[slot]
            for m in chosen:
                self._place(slot, replicas.index(None), m)
        for slot, replicas in enumerate(self.slots):
            while None in replicas:
                self._swap_into(slot, replicas.index(None))

    def _greedy_step(
        self,
        graph: _Flow,
        slot: int,
        edges: dict[str, int],
        first: int,
        to_sink: dict[str, int],
        to_extra: dict[str, int],
        extra_edge: int,
        rotate: bool,
    ) -> None:
        def room(m: str) -> int:
            """2: must still take some; 1: may take one more; 0: full."""
            if m in to_sink and graph.residual(to_sink[m]) > 0:
                return 2
            if m in to_extra and graph.residual(to_extra[m]) > 0 and graph.residual(extra_edge) > 0:
                return 1
            return 0

        choices = [m for m, e in edges.items() if graph.residual(e) > 0 and room(m)]
        if not choices:
            return
        n = len(self.ids)
        present = [x for x in self.slots[slot] if x is not None] + self.greedy_chosen[slot]

        def preference(m: str) -> tuple[int, int, int]:
            # Members that must take replicas first; then the member that shares fewest slots with
            # this slot's others, so that a member's slots are spread over many peers (a member
            # that leaves then has its replicas refilled by many, with no forced extra moves);
            # then round robin from the slot number, which spreads first replicas.
            together = sum(self.pairs.get((m, x), 0) for x in present)
            turn = (self.rank[m] - slot) % n if rotate else self.rank[m]
            return (-room(m), together, turn)

        best = min(choices, key=preference)
        for x in present:
            self.pairs[best, x] = self.pairs.get((best, x), 0) + 1
            self.pairs[x, best] = self.pairs.get((x, best), 0) + 1
        self.greedy_chosen[slot].append(best)
        path = [first, edges[best]]
        path += [to_sink[best]] if room(best) == 2 else [to_extra[best], extra_edge]
        graph.push(path, 1)

    def _place(self, slot: int, pos: int, m: str) -> None:
        self.slots[slot][pos] = m
        self.load[m] += 1

    def _swap_into(self, slot: int, pos: int) -> None:
        """No flow fills this hole (the shed step left it where every member with room already
        is). Move some x from a slot without u into the hole, and put u, a member with room, in
        x's place: u gains one, x keeps its count, at the cost of one more moved replica."""
        replicas = self.slots[slot]
        at_top = sum(1 for m in self.ids if self.load[m] > self.base)
        with_room = [m for m in self.ids if self.load[m] < self.base] or [
            m for m in self.ids if self.load[m] == self.base and at_top < self.extra
        ]
        for u in with_room:
            for other_replicas in self.slots:
                if u in other_replicas:
                    continue
                for other_pos, x in enumerate(other_replicas):
                    if x is not None and x not in replicas:
                        other_replicas[other_pos] = u
                        replicas[pos] = x
                        self.load[u] += 1
                        return
        raise AssertionError(f"no member can take a replica of slot {slot}")  # unreachable: n >= r

    def result(self) -> Slots:
        out = []
        for i, replicas in enumerate(self.slots):
            if None in replicas:
                raise AssertionError(f"slot {i} left with a hole")
            out.append(tuple(m for m in replicas if m is not None))
        return tuple(out)


class _Flow:
    """A small max-flow graph (Edmonds-Karp) over integer node ids; edges are returned as ids."""

    def __init__(self, nodes: int) -> None:
        self.adj: list[list[int]] = [[] for _ in range(nodes)]
        self.to: list[int] = []
        self.cap: list[int] = []

    def add(self, a: int, b: int, cap: int) -> int:
        """An edge a -> b with capacity ``cap``; its reverse is the id + 1."""
        edge = len(self.to)
        self.to += [b, a]
        self.cap += [cap, 0]
        self.adj[a].append(edge)
        self.adj[b].append(edge + 1)
        return edge

    def residual(self, edge: int) -> int:
        return self.cap[edge] if edge >= 0 else 0

    def flow(self, edge: int) -> int:
        return self.cap[edge ^ 1]

    def push(self, path: list[int], amount: int) -> None:
        for edge in path:
            self.cap[edge] -= amount
            self.cap[edge ^ 1] += amount

    def max_flow(self, source: int, sink: int) -> None:
        while True:
            via: dict[int, int] = {source: -1}
            queue = deque([source])
            while queue and sink not in via:
                node = queue.popleft()
                for edge in self.adj[node]:
                    nxt = self.to[edge]
                    if self.cap[edge] > 0 and nxt not in via:
                        via[nxt] = edge
                        queue.append(nxt)
            if sink not in via:
                return
            path: list[int] = []
            node = sink
            while via[node] >= 0:
                path.append(via[node])
                node = self.to[via[node] ^ 1]
            self.push(path, min(self.cap[e] for e in path))
