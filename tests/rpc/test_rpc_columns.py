"""WriteColumns against protobuf: the wire form of the columns is a WriteRequest protobuf reads back
to the same columns and labels, byte for byte what protobuf writes when there are no labels, with
the sender's timestamp bytes or encoded afresh; a selection keeps its entries' samples and labels."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.columns import WriteColumns, varints
from metricsd.rpc.wire import _label_column_bytes, labels_from_pb

_entries = st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=0, max_size=10)
_stamps = st.sampled_from([1_700_000_000_000, 5, -3, 2**40])  # one varint width, or several


def _columns(entries: list[tuple[int, bool]], base: int, one_width: bool) -> WriteColumns:
    labels = [make_labels("m", {"namespace": "ns", "pod": f"p{i}", "c": "x" * i}) for i in range(len(entries))]
    counts = np.array([n for n, _ in entries], dtype=np.int64)
    stamps = np.concatenate([base + np.arange(n) for n, _ in entries] or [np.zeros(0)]).astype(np.int64)
    values = np.arange(len(stamps), dtype=np.float64) / 3
    ids = np.array([series_id(lab) for lab in labels], dtype=np.uint64)
    with_labels = {series_id(lab): lab for lab, (_, has) in zip(labels, entries, strict=True) if has}
    given_stamps = varints(stamps.view(np.uint64)) if one_width and base > 0 and len(stamps) else None
    return WriteColumns(ids, counts, stamps, values, with_labels, given_stamps)


def _read(raw: bytes) -> tuple[list[int], list[int], list[int], list[float], dict[int, object]]:
    req = pb.WriteRequest.FromString(raw)
    return (list(req.ids), list(req.counts), list(req.timestamps), list(req.values),
            {s.id: labels_from_pb(s.labels) for s in req.series})


@settings(max_examples=100, deadline=None)
@given(_entries, _stamps, st.booleans(), st.data())
def test_the_wire_form_reads_back_to_the_columns_and_a_selection_to_its_entries(
        entries: list[tuple[int, bool]], base: int, one_width: bool, data: st.DataObject) -> None:
    cols = _columns(entries, base, one_width)
    ids, counts, stamps, values, labels = _read(cols.wire())
    assert ids == cols.ids.tolist() and counts == cols.counts.tolist()
    assert stamps == cols.timestamps.tolist() and values == cols.values.tolist()
    assert labels == dict(cols.labels)
    bare = pb.WriteRequest(ids=cols.ids.tolist(), counts=cols.counts.tolist(), timestamps=cols.timestamps.tolist(),
                           values=cols.values.tolist())
    assert cols.wire(labelled=()) == bare.SerializeToString()
    read_back = WriteColumns.of_request(pb.WriteRequest.FromString(cols.wire()))
    assert read_back.wire() == cols.wire()
    assert read_back.wire(labelled=()) == bare.SerializeToString()  # written back by protobuf when it can
    keep = np.array(data.draw(st.lists(st.booleans(), min_size=len(entries), max_size=len(entries))), dtype=bool)
    sub = cols.select(keep)
    ids, counts, stamps, values, labels = _read(sub.wire())
    per_sample = np.repeat(keep, cols.counts)
    assert ids == cols.ids[keep].tolist() and counts == cols.counts[keep].tolist()
    assert stamps == cols.timestamps[per_sample].tolist() and values == cols.values[per_sample].tolist()
    assert labels == {i: lab for i, lab in cols.labels.items() if i in set(ids)}


def _label_column_reference(name: str, codes: np.ndarray, values: list[str]) -> bytes:
    """The LabelColumn as protobuf writes it: the values the codes use, renumbered densely."""
    used = sorted({int(c) for c in codes.tolist() if c >= 0})
    dense = [used.index(int(c)) if c >= 0 else -1 for c in codes.tolist()]
    col = pb.LabelColumn(name=name, values=[values[u] for u in used],
                         codes=np.array(dense, dtype="<i4").tobytes())
    return pb.SeriesBatch(labels=[col]).SerializeToString()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-1, 4), min_size=1, max_size=6))
def test_a_series_batchs_label_column_is_what_protobuf_writes_for_one_series_and_for_many(codes: list[int]) -> None:
    """wire._label_column_bytes (one series takes a path of its own, without np.unique) against
    protobuf's own encoding of the same column."""
    values = ["a", "b", "c", "d", "é"]
    for cs in (np.array(codes[:1], dtype=np.int32), np.array(codes, dtype=np.int32)):  # one series, then several
        assert _label_column_bytes("pod", cs, values) == _label_column_reference("pod", cs, values)
