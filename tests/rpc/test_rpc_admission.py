"""rpc/admission.py: the samples a live write may not store, taken out before they reach a series."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.admission import Refusal, format_ts, refused_sentence, split_refused
from metricsd.rpc.wire import labels_to_pb

NOW = 1_750_000_000_000  # 2025-06-15T15:06:40Z
MIN = 60_000
LABELS = [make_labels("cpu", {"namespace": "ns", "pod": f"p{i}"}) for i in range(4)]
IDS = [series_id(lab) for lab in LABELS]


def _request(samples: list[list[int]]) -> pb.WriteRequest:
    req = pb.WriteRequest(ids=IDS[: len(samples)], counts=[len(s) for s in samples],
                          timestamps=[t for s in samples for t in s],
                          values=[float(t % 1000) for s in samples for t in s])
    for sid, lab in zip(IDS, LABELS[: len(samples)], strict=False):
        req.series.add(id=sid).labels.extend(labels_to_pb(lab))
    return req


def test_a_batch_with_nothing_to_refuse_comes_back_as_it_was() -> None:
    req = _request([[NOW - MIN, NOW], [NOW + 9 * MIN]])
    kept, refusal = split_refused(req, NOW, 10 * MIN, NOW - 3600_000)
    assert kept is req and refusal is None


def test_a_sample_a_day_ahead_is_taken_out_named_and_its_lone_series_never_created() -> None:
    req = _request([[NOW - MIN, NOW + 86_400_000], [NOW + 86_400_000]])
    kept, refusal = split_refused(req, NOW, 10 * MIN, None, "the store's clock")
    assert refusal is not None and (refusal.too_far_ahead, refusal.too_old) == (2, 0)
    assert refusal.message == (
        '2 too far ahead: more than 10m after the store\'s clock (2025-06-15T15:06:40Z), e.g. {__name__="cpu", '
        'namespace="ns", pod="p0"} at 2025-06-16T15:06:40Z; is the sender\'s clock right?')
    assert list(kept.ids) == [IDS[0]] and list(kept.counts) == [1] and list(kept.timestamps) == [NOW - MIN]
    assert [s.id for s in kept.series] == [IDS[0]]  # p1 had nothing left: no labels, so no series


def test_samples_older_than_the_store_keeps_are_too_old() -> None:
    req = _request([[0, NOW]])  # 1970, then now
    kept, refusal = split_refused(req, NOW, 10 * MIN, NOW - 86_400_000)
    assert refusal is not None and (refusal.too_far_ahead, refusal.too_old) == (0, 1)
    assert refusal.message.startswith("1 too old: before 2025-06-14T15:06:40Z, the oldest time the store keeps")
    assert "at 1970-01-01T00:00:00Z" in refusal.message
    assert list(kept.timestamps) == [NOW]


def test_no_limit_refuses_nothing_and_a_series_sent_without_samples_keeps_its_labels() -> None:
    req = _request([[NOW + 10**12], []])
    assert split_refused(req, NOW, None)[1] is None
    kept, refusal = split_refused(req, NOW, 0)
    assert refusal is not None and refusal.too_far_ahead == 1
    assert list(kept.ids) == [IDS[1]] and list(kept.counts) == [0] and [s.id for s in kept.series] == [IDS[1]]


def test_the_refusal_is_added_to_a_stores_answer_in_one_sentence() -> None:
    resp = pb.WriteResponse(samples_written=3, rejected_too_old=1, refused="samples refused: 1 too old for its series")
    Refusal(2, 0, "2 too far ahead: x").add_to(resp)
    assert (resp.rejected_too_far_ahead, resp.rejected_too_old) == (2, 1)
    assert resp.refused == "samples refused: 2 too far ahead: x; 1 too old for its series"
    assert refused_sentence("", "") == ""
    assert format_ts(10**20) == f"{10**20} ms"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(-5, 30).map(lambda m: NOW + m * MIN), max_size=6).map(sorted),
                min_size=1, max_size=4),
       st.integers(0, 20), st.integers(-10, 5))
def test_kept_and_refused_samples_partition_the_batch(samples: list[list[int]], ahead_min: int, old_min: int) -> None:
    req = _request(samples)
    min_ts = NOW + old_min * MIN
    kept, refusal = split_refused(req, NOW, ahead_min * MIN, min_ts)
    ts = np.array(req.timestamps, dtype=np.int64)
    want_ahead = int((ts > NOW + ahead_min * MIN).sum())
    want_old = int(((ts < min_ts) & (ts <= NOW + ahead_min * MIN)).sum())  # a sample is refused once
    got_ahead, got_old = (refusal.too_far_ahead, refusal.too_old) if refusal else (0, 0)
    assert (got_ahead, got_old) == (want_ahead, want_old)
    assert len(kept.timestamps) + want_ahead + want_old == len(ts)
    assert sum(kept.counts) == len(kept.timestamps) == len(kept.values)
    assert all(min_ts <= t <= NOW + ahead_min * MIN for t in kept.timestamps)
    expect = {sid: [t for t in s if min_ts <= t <= NOW + ahead_min * MIN] for sid, s in zip(IDS, samples, strict=False)}
    got: dict[int, list[int]] = {}
    pos = 0
    for sid, c in zip(kept.ids, kept.counts, strict=True):
        got[sid] = list(kept.timestamps[pos : pos + c])
        pos += c
    assert got == {sid: t for sid, t in expect.items() if t or not samples[IDS.index(sid)]}
    assert {s.id for s in kept.series} == set(kept.ids)


def test_a_malformed_batch_or_a_timestamp_in_the_wrong_unit_is_left_for_validation_to_refuse_whole() -> None:
    nanos = _request([[NOW * 1_000_000]])  # nanoseconds sent as milliseconds: INVALID_ARGUMENT, not a count
    assert split_refused(nanos, NOW, 10 * MIN)[0] is nanos
    bad = _request([[NOW + 86_400_000]])
    bad.counts[:] = [2]
    assert split_refused(bad, NOW, 10 * MIN) == (bad, None)
