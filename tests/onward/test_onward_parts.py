"""The pure parts of sending onward, each against a plain oracle: the request encoders (decoded by
the generated protobuf classes and by metricsd's own receiver), the watermark, a round's requests,
the buffer's records, and the targets' config."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.clock import ManualClock
from metricsd.http import remote_write_v2
from metricsd.http.remote_write_scan import scan
from metricsd.onward import records
from metricsd.onward.buffer import BufferSettings, OnwardBuffer
from metricsd.onward.encode import (
    ONE_SAMPLE_TS,
    encode_v1,
    encode_v1_one,
    encode_v2_labels,
    label_bytes_v1,
    one_sample_prefix,
    tagged_varints,
    varint_digits,
)
from metricsd.onward.records import Columns
from metricsd.onward.shards import concat, merge, requests
from metricsd.onward.target import TargetError, parse_targets
from metricsd.onward.watermark import Watermark
from metricsd.proto import prometheus_remote_pb2 as prom
from metricsd.proto import prometheus_remote_v2_pb2 as v2
from metricsd.rpc.wire import varint

# deadline=None throughout: on the shared, loaded machine an example's time says nothing.


@st.composite
def columns(draw: st.DrawFn, max_series: int = 6) -> Columns:
    n = draw(st.integers(1, max_series))
    ids = draw(st.lists(st.integers(1, 2**64 - 1), min_size=n, max_size=n, unique=True))
    counts = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    ts, vals = [], []
    for c in counts:
        start = draw(st.integers(-(2**40), 2**45))
        steps = draw(st.lists(st.integers(1, 10**6), min_size=c, max_size=c))
        ts += list(np.cumsum([start, *steps])[1:]) if c else []
        vals += draw(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=c, max_size=c))
    return Columns(np.array(ids, np.uint64), np.array(counts, np.int64), np.array(ts, np.int64),
                   np.array(vals, np.float64))


def _labels(i: int) -> tuple[tuple[str, str], ...]:
    return (("__name__", f"m{i % 3}"), ("namespace", "ns"), ("pod", f"pod-{i}"), ("zz", "é" * (i % 200)))


def _same(a: float, b: float) -> bool:
    return np.float64(a).tobytes() == np.float64(b).tobytes() or (math.isnan(a) and math.isnan(b))


@settings(deadline=None)
@given(st.integers(0, 2**64 - 1), st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=40),
       st.sampled_from([0, 2**7, 2**14, 2**30, 2**64]))
def test_varints_are_protobufs_whatever_digits_the_values_share(base: int, offsets: list[int], spread: int) -> None:
    """Values a ``spread`` apart above ``base`` (a request's timestamps share their high digits;
    header lengths are one or two bytes): each row, cut to its size, is the varint of its value,
    and tagged_varints packs them behind the tag."""
    u = np.array([(base + o % spread if spread else base) % 2**64 for o in offsets], np.uint64)
    digits, size = varint_digits(u)
    assert [bytes(row[:k]) for row, k in zip(digits, size, strict=True)] == [varint(int(v)) for v in u]
    assert tagged_varints(0x0A, u).to_pylist() == [b"\x0a" + varint(int(v)) for v in u]


@settings(deadline=None)
@given(columns())
def test_a_v1_request_decodes_to_the_columns_it_was_made_from(cols: Columns) -> None:
    labels = [_labels(int(i)) for i in cols.ids]
    raw = encode_v1([label_bytes_v1(lab) for lab in labels], cols.counts, cols.timestamps, cols.values)
    req = prom.WriteRequest.FromString(raw)
    assert len(req.timeseries) == len(cols.ids)
    at = 0
    for ts, lab, n in zip(req.timeseries, labels, cols.counts.tolist(), strict=True):
        assert tuple((x.name, x.value) for x in ts.labels) == lab
        assert [s.timestamp for s in ts.samples] == cols.timestamps[at:at + n].tolist()
        assert all(_same(s.value, v) for s, v in zip(ts.samples, cols.values[at:at + n].tolist(), strict=True))
        at += n
    found = scan(raw)  # metricsd's own receiver reads the same bytes with its NumPy scanner
    if found is not None:
        assert found.counts.tolist() == cols.counts.tolist()
        assert found.timestamps.tolist() == cols.timestamps.tolist()
        assert found.values.tobytes() == cols.values.tobytes()


@settings(deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(*ONE_SAMPLE_TS),
                          st.floats(allow_nan=True, allow_infinity=True)), min_size=1, max_size=60))
def test_a_one_sample_request_from_prefixes_is_the_same_bytes(entries: list[tuple[int, int, float]]) -> None:
    labels = [label_bytes_v1(_labels(i)) for i, _, _ in entries]
    ts = np.array([t for _, t, _ in entries], np.int64)
    vals = np.array([v for _, _, v in entries], np.float64)
    got = encode_v1_one(pa.array([one_sample_prefix(lab) for lab in labels], pa.large_binary()), ts, vals)
    assert got == encode_v1(labels, np.ones(len(entries), np.int64), ts, vals)
    with pytest.raises(ValueError, match="ONE_SAMPLE_TS"):
        encode_v1_one(pa.array([one_sample_prefix(labels[0])], pa.large_binary()), np.array([1], np.int64), vals[:1])


@settings(deadline=None)
@given(columns())
def test_a_v2_request_refers_to_its_labels_through_the_symbols_table(cols: Columns) -> None:
    labels = [_labels(int(i)) for i in cols.ids]
    req = v2.Request.FromString(encode_v2_labels(labels, cols.counts, cols.timestamps, cols.values))
    assert req.symbols[0] == ""
    at = 0
    for ts, lab, n in zip(req.timeseries, labels, cols.counts.tolist(), strict=True):
        refs = list(ts.labels_refs)
        assert tuple(zip([req.symbols[r] for r in refs[::2]], [req.symbols[r] for r in refs[1::2]],
                         strict=True)) == lab
        assert [s.timestamp for s in ts.samples] == cols.timestamps[at:at + n].tolist()
        at += n


# A small request, its bytes pinned: two series (labels sorted by name, a two-byte UTF-8 value),
# the first with two samples (the second the stale marker), the second with one at a negative
# timestamp (a ten-byte varint) and value 0.0, written out although protobuf would leave it out.
_GOLDEN_LABELS = [(("__name__", "up"), ("pod", "a")), (("__name__", "cpu"), ("namespace", "é"))]
_GOLDEN_COLS = (np.array([2, 1], np.int64), np.array([1_700_000_000_000, 1_700_000_010_000, -5], np.int64),
                np.array([1.5, np.frombuffer((0x7FF0000000000002).to_bytes(8, "little"), "<f8")[0], 0.0]))
GOLDEN_V1 = (
    "0a3e"  # TimeSeries, 62 bytes
    "0a0e" "0a085f5f6e616d655f5f" "12027570"  # Label __name__="up"
    "0a08" "0a03706f64" "120161"  # Label pod="a"
    "1210" "09000000000000f83f" "1080d095ffbc31"  # Sample 1.5 @ 1700000000000
    "1210" "09020000000000f07f" "10909e96ffbc31"  # Sample stale NaN @ 1700000010000
    "0a38"  # TimeSeries, 56 bytes
    "0a0f" "0a085f5f6e616d655f5f" "1203637075"
    "0a0f" "0a096e616d657370616365" "1202c3a9"  # namespace="é"
    "1214" "090000000000000000" "10fbffffffffffffffff01")  # Sample 0.0 @ -5
GOLDEN_V2 = (
    "2200" "22085f5f6e616d655f5f" "22027570" "2203706f64" "220161" "2203637075" "22096e616d657370616365"
    "2202c3a9"  # symbols: "", __name__, up, pod, a, cpu, namespace, é
    "2a2a" "0a0401020304"  # TimeSeries, labels_refs 1 2 3 4 (packed)
    "1210" "09000000000000f83f" "1080d095ffbc31" "1210" "09020000000000f07f" "10909e96ffbc31"
    "2a1c" "0a0401050607" "1214" "090000000000000000" "10fbffffffffffffffff01")


def test_a_small_request_is_exactly_these_bytes() -> None:
    raw = encode_v1([label_bytes_v1(lab) for lab in _GOLDEN_LABELS], *_GOLDEN_COLS)
    assert raw.hex() == GOLDEN_V1
    raw2 = encode_v2_labels(_GOLDEN_LABELS, *_GOLDEN_COLS)
    assert raw2.hex() == GOLDEN_V2
    # protobuf reads them as the request they were made from (its own bytes leave the 0.0 value
    # out; without a zero field they are the same bytes: the next test).
    want = prom.WriteRequest(timeseries=[
        prom.TimeSeries(labels=[prom.Label(name=k, value=v) for k, v in lab],
                        samples=[prom.Sample(value=v, timestamp=t) for t, v in smp])
        for lab, smp in zip(_GOLDEN_LABELS, [[(1_700_000_000_000, 1.5), (1_700_000_010_000, _GOLDEN_COLS[2][1])],
                                             [(-5, 0.0)]], strict=True)])
    assert prom.WriteRequest.FromString(raw) == want
    req2 = v2.Request.FromString(raw2)
    assert [tuple((req2.symbols[a], req2.symbols[b]) for a, b in zip(ts.labels_refs[::2], ts.labels_refs[1::2],
                                                                    strict=True)) for ts in req2.timeseries] == \
        _GOLDEN_LABELS
    assert [[(x.timestamp, np.float64(x.value).tobytes()) for x in ts.samples] for ts in req2.timeseries] == \
        [[(x.timestamp, np.float64(x.value).tobytes()) for x in ts.samples] for ts in want.timeseries]


@settings(deadline=None)
@given(columns())
def test_without_zero_fields_the_bytes_are_protobufs_own(cols: Columns) -> None:
    """protobuf leaves a 0 value or timestamp out; any other sample is the same bytes."""
    values = np.where(cols.values.view(np.uint64) == 0, 1.0, cols.values)
    ts = np.where(cols.timestamps == 0, 1, cols.timestamps)
    labels = [_labels(int(i)) for i in cols.ids]
    raw = encode_v1([label_bytes_v1(lab) for lab in labels], cols.counts, ts, values)
    assert prom.WriteRequest.FromString(raw).SerializeToString() == raw
    raw2 = encode_v2_labels(labels, cols.counts, ts, values)
    assert v2.Request.FromString(raw2).SerializeToString() == raw2


@settings(deadline=None)
@given(columns())
def test_metricsd_reads_a_v2_request_as_the_v1_request_of_the_same_columns(cols: Columns) -> None:
    labels = [_labels(int(i)) for i in cols.ids]
    got = remote_write_v2.entries(remote_write_v2.parse(encode_v2_labels(labels, cols.counts, cols.timestamps,
                                                                          cols.values))).scanned
    has = cols.counts > 0  # metricsd's reader skips a series without samples
    assert got.keys == [label_bytes_v1(lab) for lab, h in zip(labels, has.tolist(), strict=True) if h]
    assert got.counts.tolist() == cols.counts[has].tolist()
    assert got.timestamps.tolist() == cols.timestamps.tolist()
    assert got.values.tobytes() == cols.values.tobytes()


def _naive_take(state: dict[int, int], cols: Columns) -> tuple[list[tuple[int, int, float]], int, int]:
    out, dup, ooo = [], 0, 0
    at = 0
    newest_after = dict(state)
    for sid, n in zip(cols.ids.tolist(), cols.counts.tolist(), strict=True):
        mark = state.get(sid)
        for t, v in zip(cols.timestamps[at:at + n].tolist(), cols.values[at:at + n].tolist(), strict=True):
            if mark is None or t > mark:
                out.append((sid, t, v))
            elif t == mark:
                dup += 1
            else:
                ooo += 1
            newest_after[sid] = max(newest_after.get(sid, t), t)
        at += n
    state.clear()
    state.update(newest_after)
    return out, dup, ooo


@settings(deadline=None, max_examples=60)
@given(st.lists(columns(max_series=4), min_size=1, max_size=5))
def test_the_watermark_lets_through_what_a_dict_of_newest_timestamps_would(batches: list[Columns]) -> None:
    wm, oracle = Watermark(), {}
    for cols in batches:
        wm.add(cols.ids)
        got = wm.take(cols)
        want, dup, ooo = _naive_take(oracle, cols)
        at = 0
        flat = []
        for sid, n in zip(got.columns.ids.tolist(), got.columns.counts.tolist(), strict=True):
            flat += [(sid, t, v) for t, v in zip(got.columns.timestamps[at:at + n].tolist(),
                                                  got.columns.values[at:at + n].tolist(), strict=True)]
            at += n
        assert [(s, t) for s, t, _ in flat] == [(s, t) for s, t, _ in want]
        assert (got.duplicate, got.out_of_order) == (dup, ooo)


def test_a_retried_live_batch_one_sample_a_series_goes_onward_once() -> None:
    wm = Watermark()
    ids = np.array([5, 9, 3], np.uint64)
    live = Columns(ids, np.ones(3, np.int64), np.array([100, 100, 100], np.int64), np.ones(3))
    wm.add(ids)
    assert wm.take(live).columns.samples == 3
    again = wm.take(live)
    assert (again.columns.samples, again.duplicate, again.out_of_order) == (0, 3, 0)
    late = Columns(ids, np.ones(3, np.int64), np.array([110, 90, 100], np.int64), np.ones(3))
    got = wm.take(late)
    assert got.columns.ids.tolist() == [5] and (got.duplicate, got.out_of_order) == (1, 1)


def test_a_batch_looked_up_in_an_older_generation_is_marked_in_use_in_its_own() -> None:
    """take() skips marking rows in use when the handshake's lookup did it in the same
    generation; looked up in an earlier one, it marks them, so the bound keeps the series."""
    wm = Watermark()
    ids = np.array([7, 8], np.uint64)
    wm.add(ids)
    cols = Columns(ids, np.ones(2, np.int64), np.array([10, 10], np.int64), np.zeros(2))
    wm.take(cols, 1, wm.rows(ids, 1))
    later = Columns(ids, np.ones(2, np.int64), np.array([20, 20], np.int64), np.zeros(2))
    wm.take(later, 3, wm.rows(ids, 2))  # a new segment between the handshake and the queue
    assert len(wm.forget(3)) == 0
    assert wm.known(ids).all()


def test_a_retried_batch_goes_onward_once() -> None:
    wm = Watermark()
    cols = Columns(np.array([7, 9], np.uint64), np.array([2, 1], np.int64), np.array([10, 20, 10], np.int64),
                   np.array([1.0, 2.0, 3.0]))
    wm.add(cols.ids)
    assert wm.take(cols).columns.samples == 3
    again = wm.take(cols)
    assert again.columns.samples == 0 and again.duplicate == 2 and again.out_of_order == 1


@st.composite
def rounds(draw: st.DrawFn) -> Columns:
    """A sender's round: several batches, a series in some of them, its samples later batch by batch.
    Ids are dense slots (as a sender's are) or big ones (the general path of ``merge``)."""
    pool = draw(st.integers(1, 8))
    base = draw(st.sampled_from([0, 1 << 40]))
    parts, clock = [], 0
    for _ in range(draw(st.integers(1, 5))):
        which = draw(st.lists(st.integers(0, pool - 1), min_size=1, max_size=pool, unique=True))
        counts = draw(st.lists(st.integers(0, 3), min_size=len(which), max_size=len(which)))
        ts = []
        for c in counts:
            ts += list(range(clock + 1, clock + 1 + c))
            clock += c
        parts.append(Columns(np.array(which, np.uint64) + np.uint64(base), np.array(counts, np.int64),
                             np.array(ts, np.int64), np.array(ts, np.float64) * 0.5))
    return concat(parts)


def _per_series(cols: Columns) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    at = 0
    for sid, n in zip(cols.ids.tolist(), cols.counts.tolist(), strict=True):
        out.setdefault(sid, []).extend(cols.timestamps[at:at + n].tolist())
        at += n
    return out


@settings(deadline=None)
@given(rounds(), st.integers(1, 7))
def test_a_round_becomes_requests_with_each_series_in_one_in_time_order(cols: Columns, limit: int) -> None:
    reqs = requests(cols, limit)
    seen: dict[int, int] = {}
    for k, r in enumerate(reqs):
        assert r.samples <= limit or len(r.ids) == 1
        assert np.array_equal(r.values, r.timestamps * 0.5)  # each value stayed with its sample
        for sid in r.ids.tolist():
            assert sid not in seen, "a series in two requests (or twice in one) of a round"
            seen[sid] = k
    got = _per_series(concat(reqs))
    want = {sid: ts for sid, ts in _per_series(cols).items() if ts}
    assert {k: v for k, v in got.items() if v} == want
    assert sum(r.samples for r in reqs) == cols.samples


def test_a_live_round_of_distinct_slots_is_sliced_not_copied() -> None:
    cols = Columns(np.arange(10, dtype=np.uint64), np.ones(10, np.int64), np.arange(10, dtype=np.int64),
                   np.ones(10))
    assert merge(cols) is cols
    reqs = requests(cols, 4)
    assert [len(r.ids) for r in reqs] == [4, 4, 2] and all(np.shares_memory(r.timestamps, cols.timestamps)
                                                            for r in reqs)


@settings(deadline=None)
@given(columns())
def test_a_samples_record_round_trips_and_damage_is_its_own_error(cols: Columns) -> None:
    payload = records.encode_samples(cols)
    back = records.decode_samples(payload)
    assert back.ids.tolist() == cols.ids.tolist() and back.values.tobytes() == cols.values.tobytes()
    for bad in (payload[:-3], payload[:1] + b"\xff" * 9, b"\x02", b"\x01" + payload[1:]):
        with pytest.raises(records.CorruptPayload):
            records.decode_samples(bad)


def _cols(sid: int, t0: int, n: int) -> Columns:
    return Columns(np.array([sid], np.uint64), np.array([n], np.int64), np.arange(t0, t0 + n, dtype=np.int64),
                   np.ones(n))


def _appender(buf: OnwardBuffer) -> Callable[[Columns], int]:
    """Appends as the tee does: each series' labels once per segment."""
    declared: dict[int, int] = {}

    def append(cols: Columns) -> int:
        seg = buf.next_segment()
        new = [i for i in dict.fromkeys(cols.ids.tolist()) if declared.get(i) != seg]
        declared.update(dict.fromkeys(new, seg))
        return buf.append(cols, [records.series_entry(i, _labels(i)) for i in new])

    return append


def test_the_buffer_is_read_back_after_a_restart_from_each_targets_cursor(tmp_path: Path) -> None:
    clock = ManualClock(1_000)
    buf = OnwardBuffer(tmp_path, BufferSettings(max_bytes=1 << 20, segment_bytes=4096), clock=clock)
    assert buf.register("a") == 0 and buf.register("b") == 0
    append = _appender(buf)
    seqs = [append(_cols(i % 3 + 1, 100 * i, 50)) for i in range(40)]
    buf.commit("a", seqs[9])
    assert buf.pending("a") == 30 * 50 and buf.pending("b") == 40 * 50
    buf.close()
    again = OnwardBuffer(tmp_path, BufferSettings(max_bytes=1 << 20, segment_bytes=4096), clock=clock)
    assert again.register("a") == seqs[9] and again.pending("a") == 30 * 50
    recs = list(again.records_from(seqs[9] + 1, head=True))
    # A reader resuming mid-segment first gets the labels that segment holds.
    assert recs[0].kind == records.SERIES and recs[0].seq < seqs[9] + 1
    got = [records.decode_samples(again.payload(r)).timestamps[0] for r in recs if r.kind == records.SAMPLES]
    assert got == [100 * i for i in range(10, 40)]
    again.close()


def test_past_its_bound_the_buffer_drops_the_oldest_segment_and_says_how_many_samples(tmp_path: Path) -> None:
    dropped: list[tuple[str, int]] = []
    buf = OnwardBuffer(tmp_path, BufferSettings(max_bytes=8192, segment_bytes=4096), clock=ManualClock(),
                       on_drop=lambda name, n: dropped.append((name, n)))
    buf.register("slow")
    append = _appender(buf)
    for i in range(200):
        append(_cols(1, 100 * i, 50))
    assert buf.disk_bytes() <= 8192 + 4096
    assert dropped and all(name == "slow" for name, _ in dropped)
    assert sum(n for _, n in dropped) + buf.pending("slow") == 200 * 50  # every sample: sent, pending or counted
    buf.close()


def test_a_segment_every_target_has_sent_is_deleted(tmp_path: Path) -> None:
    buf = OnwardBuffer(tmp_path, BufferSettings(max_bytes=1 << 20, segment_bytes=4096), clock=ManualClock())
    buf.register("a")
    append = _appender(buf)
    for i in range(100):
        append(_cols(1, 100 * i, 50))
    before = len(list(tmp_path.glob("*.spool")))
    buf.commit("a", buf.last_seq)
    assert before > 2 and len(list(tmp_path.glob("*.spool"))) == 1
    buf.close()


def test_recent_batches_are_kept_in_memory_until_every_target_passed_them_and_within_their_bound(
        tmp_path: Path) -> None:
    buf = OnwardBuffer(tmp_path, BufferSettings(recent_samples=250), clock=ManualClock(0))
    buf.register("a")
    buf.register("b")
    batches = [Columns(np.array([k], np.uint64), np.array([100], np.int64), np.arange(100, dtype=np.int64) + k,
                       np.full(100, float(k))) for k in range(4)]
    seqs = [buf.append(c) for c in batches]
    assert [buf.columns(s) is None for s in seqs] == [True, True, False, False]  # 250 samples: the newest two
    assert buf.columns(seqs[3]) is batches[3] and not batches[3].timestamps.flags.writeable
    assert records.decode_samples(buf.payload(buf._index[-1])).timestamps.tolist() == batches[3].timestamps.tolist()
    buf.commit("a", seqs[3])
    assert buf.columns(seqs[2]) is not None  # b has not sent it
    buf.commit("b", seqs[2])
    assert buf.columns(seqs[2]) is None and buf.columns(seqs[3]) is not None
    buf.close()


def test_target_config_takes_prometheus_remote_write_entries(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("s3cret\n")
    text = f"""
remote_write:
  - url: https://vm.example:8428/api/v1/write
    name: vm
    protocol: "1.0"
    bearer_token_file: {tmp_path / 'token'}
    write_relabel_configs: [{{action: drop, source_labels: [namespace], regex: kube-system}}]
    queue_config: {{shards: 2, max_samples_per_send: 500, min_backoff: 50ms, max_backoff: 2s}}
"""
    (t,) = parse_targets([], text)
    assert (t.name, t.protocol, t.shards, t.max_samples_per_send, t.min_backoff_s, t.max_backoff_s) == (
        "vm", "1.0", 2, 500, 0.05, 2.0)
    assert t.authorization() == "Bearer s3cret" and t.relabel[0].action == "drop"


@pytest.mark.parametrize(("text", "message"), [
    ("- url: ftp://x/", "not an http(s) URL"),
    ("- {url: 'http://x/', shards: 2}", "unknown field 'shards'"),
    ("- {url: 'http://x/', protocol: '3.0'}", "protocol '3.0'"),
    ("- {url: 'http://x/', bearer_token_file: /nonexistent}", "not a readable file"),
    ("- {url: 'http://x/', name: a}\n- {url: 'http://y/', name: a}", "two targets named 'a'"),
    ("- {url: 'http://x/', write_relabel_configs: [{action: nope}]}", "unknown relabel action"),
])
def test_a_bad_target_is_refused_naming_the_field(text: str, message: str) -> None:
    with pytest.raises(TargetError, match=re.escape(message)):
        parse_targets([], text)
