"""The send path's per-series tables against plain oracles: IdTable (a dict), SeriesTable (labels
encoded per request the slow way), and the bound of both."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.onward.encode import encode_v1, encode_v1_one, encode_v2, encode_v2_labels, label_bytes_v1
from metricsd.onward.idtable import IdTable
from metricsd.onward.series import BytesColumn, SeriesTable
from metricsd.proto import prometheus_remote_v2_pb2 as v2

# Ids that are not hashes too: small ones, 0, and ones that share their low and high bits.
_IDS = st.one_of(st.integers(0, 2**64 - 1), st.integers(0, 40), st.integers(0, 30).map(lambda k: k << 40),
                 st.integers(0, 30).map(lambda k: (k << 58) | 7))

# deadline=None throughout: on the shared, loaded machine an example's time says nothing.


@settings(deadline=None, max_examples=200)
@given(st.lists(st.tuples(st.sampled_from(["add", "find", "keep"]), st.lists(_IDS, max_size=40)), max_size=12))
def test_an_id_table_answers_what_a_dict_would(ops: list[tuple[str, list[int]]]) -> None:
    table, oracle = IdTable(v=-1), {}
    for op, ids in ops:
        arr = np.array(ids, np.uint64)
        if op == "add":
            rows = table.add(arr)
            assert (rows >= 0).all()
            for i, r in zip(ids, rows.tolist(), strict=True):
                oracle.setdefault(i, 0)
                table.cols["v"][r] = i % 1000  # a value that follows the id through moves
                oracle[i] = i % 1000
        elif op == "keep":  # drop the ids given
            gone = set(ids)
            rows = table.rows()
            mask = np.ones(len(table.cols["v"]), bool)
            mask[rows] = ~np.isin(table.ids, np.array(sorted(gone), np.uint64))
            dropped = table.keep(mask)
            assert sorted(dropped.tolist()) == sorted(i for i in oracle if i in gone)
            oracle = {i: v for i, v in oracle.items() if i not in gone}
        rows = table.find(arr)
        assert [r >= 0 for r in rows.tolist()] == [i in oracle for i in ids]
        assert [int(table.cols["v"][r]) for r in rows.tolist() if r >= 0] == [oracle[i] for i in ids if i in oracle]
        assert len(table) == len(oracle) and sorted(table.ids.tolist()) == sorted(oracle)


def test_an_id_table_stays_a_quarter_full_and_finds_every_id_among_many() -> None:
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 2**63, 100_000, dtype=np.uint64) * np.uint64(2)
    table = IdTable()
    for part in np.array_split(ids, 7):
        table.add(part)
    assert len(table) == len(np.unique(ids)) and 4 * len(table) <= len(table._hkeys)
    rows = table.find(ids)
    assert (table.ids[rows] == ids).all()
    assert (table.find(ids + np.uint64(1)) == -1).all()  # odd ids: none there


def test_rows_are_dense_in_the_order_ids_first_came_and_stay_as_the_hash_table_grows() -> None:
    table = IdTable(v=-1)
    first = np.array([50, 7, 50, 9], np.uint64)
    assert table.add(first).tolist() == [0, 1, 0, 2]
    more = np.arange(1000, 3000, dtype=np.uint64)[::-1].copy()
    rows = table.add(np.concatenate([more, first]))
    assert rows.tolist() == [*range(3, 2003), 0, 1, 0, 2]  # the old ones kept their rows
    assert table.rows().tolist() == list(range(2003)) and table.ids[:3].tolist() == [50, 7, 9]
    assert 4 * len(table) <= len(table._hkeys) and len(table.cols["v"]) >= len(table)


def test_a_batch_found_again_is_answered_from_memory_until_rows_move() -> None:
    table = IdTable(v=0)
    batch = np.arange(1, 301, dtype=np.uint64) * np.uint64(7919)
    table.add(batch)
    first = table.find(batch)
    assert table.find(batch) is first and not first.flags.writeable  # the same batch: remembered
    table.add(batch + np.uint64(1))  # more ids (the hash table grows; rows stay)
    again = table.find(batch)
    assert len(table) == 600 and (table.ids[again] == batch).all() and (again == first).all()
    mixed = np.concatenate([batch[:200], np.array([5], np.uint64)])  # one id not there: not remembered
    assert table.find(mixed)[-1] == -1
    table.add(np.array([5], np.uint64))
    assert table.find(mixed)[-1] >= 0
    gone = np.zeros(len(table), bool)
    gone[again[:10]] = True
    table.keep(~gone)  # rows move again, and ten ids are gone
    assert (table.find(batch)[:10] == -1).all() and (table.ids[table.find(batch)[10:]] == batch[10:]).all()


def test_a_bytes_column_grows_and_its_old_views_stay_valid() -> None:
    col = BytesColumn()
    col.extend([b"a", b"", b"xyz"])
    first = col.array()
    col.extend([bytes([i % 256]) * i for i in range(3000)])  # grows the buffer several times
    assert first.to_pylist() == [b"a", b"", b"xyz"]
    assert col.take(np.array([2, 0, 1, 3 + 2999])).to_pylist() == [b"xyz", b"a", b"", bytes([2999 % 256]) * 2999]
    assert col.take(np.array([1, 2, 3])).to_pylist() == [b"", b"xyz", b""]  # consecutive: a slice
    assert col.take(np.array([4, 5])).to_pylist() == [b"\x01", b"\x02\x02"]
    again = BytesColumn.of(col.take(np.array([5, 2])))
    assert again.array().to_pylist() == [bytes([2]) * 2, b"xyz"]


def _labels(i: int) -> tuple[tuple[str, str], ...]:
    return (("__name__", f"m{i % 3}"), ("namespace", f"ns{i % 2}"), ("pod", f"pod-{i}"))


def _learn(table: SeriesTable, ids: list[int], segment: int) -> None:
    table.learn(np.array(ids, np.uint64), lambda k: _labels(ids[k]), segment)


@settings(deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=30), st.sampled_from([1, 2]))
def test_a_series_table_gives_each_request_the_bytes_its_labels_encode_to(ids: list[int], version: int) -> None:
    table = SeriesTable(lambda lab: None if lab[2][1] == "pod-13" else lab)  # relabelling drops pod-13
    _learn(table, ids, 1)
    want = sorted(set(ids))
    slots = table.slots(np.array(want, np.uint64))
    sendable = table.sendable(slots)
    assert sendable.tolist() == [i != 13 for i in want]
    entries = [i for i in want if i != 13]
    slots = table.slots(np.array(entries, np.uint64))
    counts = np.ones(len(entries), np.int64)
    ts, vals = np.arange(len(entries), dtype=np.int64) + 1, np.ones(len(entries))
    if version == 1:
        got = encode_v1(table.v1(slots), counts, ts, vals)
        assert got == encode_v1([label_bytes_v1(_labels(i)) for i in entries], counts, ts, vals)
        live = ts + 1_790_000_000_000  # the one-sample prefixes: the same bytes
        assert encode_v1_one(table.v1_one(slots), live, vals) == encode_v1(table.v1(slots), counts, live, vals)
    else:
        symbols, refs, ref_counts = table.v2(slots)
        got = encode_v2(symbols, refs, ref_counts, counts, ts, vals)
        assert _v2_content(got) == _v2_content(encode_v2_labels([_labels(i) for i in entries], counts, ts, vals))
    assert (table.slots(np.array([999], np.uint64)) == -1).all()


def test_a_series_table_forgets_what_the_previous_segment_did_not_declare() -> None:
    table = SeriesTable(lambda lab: lab)
    _learn(table, [1, 2, 3, 4], 1)
    _learn(table, [3, 4, 5], 2)
    table.v1(table.slots(np.array([1, 2, 3, 4, 5], np.uint64)))  # encoded before the bound
    table.v1_one(table.slots(np.array([1, 2, 3, 4, 5], np.uint64)))
    table.v2(table.slots(np.array([5], np.uint64)))
    assert table.forget_before(2) == 2  # entering segment 3: 1 and 2 were last declared in segment 1
    assert table.slots(np.array([1, 2], np.uint64)).tolist() == [-1, -1] and len(table) == 3
    _learn(table, [6], 3)
    ids = [3, 4, 5, 6]
    slots = table.slots(np.array(ids, np.uint64))
    counts, ts, vals = np.ones(4, np.int64), np.arange(1, 5, dtype=np.int64), np.zeros(4)
    assert encode_v1(table.v1(slots), counts, ts, vals) == encode_v1([label_bytes_v1(_labels(i)) for i in ids],
                                                                       counts, ts, vals)
    live = ts + 1_790_000_000_000
    assert encode_v1_one(table.v1_one(slots), live, vals) == encode_v1([label_bytes_v1(_labels(i)) for i in ids],
                                                                         counts, live, vals)
    symbols, refs, ref_counts = table.v2(slots)
    assert _v2_content(encode_v2(symbols, refs, ref_counts, counts, ts, vals)) == _v2_content(
        encode_v2_labels([_labels(i) for i in ids], counts, ts, vals))


def test_a_batch_s_slots_are_kept_until_the_bound_renumbers_them() -> None:
    """slots_sendable answers a batch (of at least 256 ids) it has seen from memory; forget_before
    renumbers slots, and the next answer is the new slots, not the kept ones."""
    table = SeriesTable(lambda lab: None if lab[2][1] == "pod-13" else lab)
    first, second = list(range(0, 300)), list(range(300, 600))
    _learn(table, first, 1)
    _learn(table, second, 2)
    batch = np.array(second, np.uint64)
    slots, keep = table.slots_sendable(batch)
    assert slots.tolist() == list(range(300, 600)) and keep.all()
    assert table.slots_sendable(batch)[0] is slots  # from memory
    assert table.forget_before(2) == 300  # the first 300 go: the others move to slots 0..299
    again, keep = table.slots_sendable(batch)
    assert again.tolist() == table.slots(batch).tolist() == list(range(300))
    few = np.array([13, 14], np.uint64)
    _learn(table, [13, 14], 3)
    assert table.slots_sendable(few)[1].tolist() == [False, True]  # relabelling dropped pod-13


def _v2_content(raw: bytes) -> list[tuple[tuple[tuple[str, str], ...], list[tuple[int, bytes]]]]:
    """What a 2.0 request says, symbols resolved; its symbols table checked (``""`` first, each once)."""
    req = v2.Request.FromString(raw)
    assert (not raw or req.symbols[0] == "") and len(set(req.symbols)) == len(req.symbols)
    out = []
    for ts in req.timeseries:
        refs = list(ts.labels_refs)
        labels = tuple(zip([req.symbols[r] for r in refs[::2]], [req.symbols[r] for r in refs[1::2]], strict=True))
        out.append((labels, [(s.timestamp, np.float64(s.value).tobytes()) for s in ts.samples]))
    return out
