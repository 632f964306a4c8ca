"""The send path without a network: the tee queues acknowledged writes into a buffer of small
segments, a sender reads them back in rounds and builds its request bodies, and the bodies,
decoded as a receiver would (protobuf for 1.0, metricsd's own 2.0 reader), hold every queued
sample once, in order, with its labels, while series go idle and come back (the bounds of the
tee's labels and of the sender's series table) and relabelling drops one pod."""

from __future__ import annotations

from pathlib import Path

import cramjam
import pytest
from prometheus_client import CollectorRegistry

from metricsd.clock import ManualClock
from metricsd.http import remote_write_v2
from metricsd.model import Labels, make_labels, series_id
from metricsd.onward.buffer import BufferSettings
from metricsd.onward.encode import label_bytes_v1
from metricsd.onward.records import Columns
from metricsd.onward.sender import Sender
from metricsd.onward.shards import requests
from metricsd.onward.target import parse_targets
from metricsd.onward.tee import Onward
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import prometheus_remote_pb2 as prom
from metricsd.rpc.wire import labels_to_pb

SERIES = [make_labels("m", {"namespace": "ns", "pod": f"pod-{i}", "k": "v" * (i % 7 + 1)}) for i in range(24)]
IDS = [series_id(lab) for lab in SERIES]
DROPPED = "pod-7"  # write_relabel_configs drops it


def _request(onward: Onward, which: list[int], t: int) -> pb.WriteRequest:
    """One sample of each series at t, as an agent sends it: labels only when asked (the handshake)."""
    req = pb.WriteRequest(ids=[IDS[i] for i in which], counts=[1] * len(which), timestamps=[t] * len(which),
                          values=[float(i) + t / 1e6 for i in which])
    for sid in onward.unknown(req):
        req.series.add(id=sid).labels.extend(labels_to_pb(SERIES[IDS.index(sid)]))
    assert not onward.unknown(req)
    return req


def _sent(sender: Sender, version: int, head: bool) -> list[tuple[Labels, int, float]]:
    """One round of the sender, its bodies decoded as the receiver would."""
    cols, last = sender._read_round(head)
    out: list[tuple[Labels, int, float]] = []
    by_key = {label_bytes_v1(lab): lab for lab in SERIES}
    for chunk in requests(cols, sender.target.max_samples_per_send):
        raw = bytes(cramjam.snappy.decompress_raw(sender.body(chunk, version)))
        if version == 1:
            for ts in prom.WriteRequest.FromString(raw).timeseries:
                lab = tuple((x.name, x.value) for x in ts.labels)
                out += [(lab, s.timestamp, s.value) for s in ts.samples]
        else:
            got = remote_write_v2.entries(remote_write_v2.parse(raw)).scanned
            at = 0
            for key, n in zip(got.keys, got.counts.tolist(), strict=True):
                out += [(by_key[key], t, v) for t, v in zip(got.timestamps[at:at + n].tolist(),
                                                             got.values[at:at + n].tolist(), strict=True)]
                at += n
    if last is not None:
        sender.cursor = last
        sender.buffer.commit(sender.target.name, last)
    return out


@pytest.mark.parametrize(("version", "recent"), [(1, 400_000), (2, 400_000), (1, 0)])
def test_every_sample_queued_is_sent_once_while_series_go_idle_and_come_back(tmp_path: Path, version: int,
                                                                              recent: int) -> None:
    """``recent``: the samples the buffer keeps in memory for the sender (0: every round read back
    from disk)."""
    (target,) = parse_targets([], f"""
- url: http://127.0.0.1:9/api/v1/write
  name: t
  write_relabel_configs: [{{action: drop, source_labels: [pod], regex: {DROPPED}}}]
  queue_config: {{shards: 3, max_samples_per_send: 40}}
""")
    onward = Onward(tmp_path, [target], CollectorRegistry(), ManualClock(0),
                    settings=BufferSettings(max_bytes=1 << 22, segment_bytes=4096, recent_samples=recent))
    sender = onward.senders[0]
    kept, from_memory = onward.buffer.columns, []

    def counted(seq: int) -> Columns | None:  # which records the sender took from memory
        cols = kept(seq)
        if cols is not None:
            from_memory.append(seq)
        return cols
    onward.buffer.columns = counted  # type: ignore[method-assign]
    sender.version = version
    want: list[tuple[Labels, int, float]] = []
    got: list[tuple[Labels, int, float]] = []
    head = True
    phases = [(range(24), 30), (range(12), 60), (range(24), 20)]  # series 12..23 idle, then back
    t = 1_000
    for which, ticks in phases:
        for _ in range(ticks):
            t += 10_000
            req = _request(onward, list(which), t)
            assert onward.queue(req) == len(which)
            want += [(SERIES[i], t, float(i) + t / 1e6) for i in which if dict(SERIES[i])["pod"] != DROPPED]
            if t % 30_000 == 1_000:
                got += _sent(sender, version, head)
                head = False
        if which == range(12):  # after 60 idle ticks (several segments) both forgot the idle series
            assert len(onward.labels) == 12 and len(onward.watermark) == 12
            got += _sent(sender, version, head)
            assert len(sender.series) == 12
    while onward.buffer.pending("t"):
        got += _sent(sender, version, False)
    assert sorted(got) == sorted(want) and len(got) == len(want)
    for lab in SERIES:  # and in time order per series
        times = [tt for g, tt, _ in got if g == lab]
        assert times == sorted(times)
    assert onward.buffer.next_segment() > 10  # many segments were written and left
    assert onward.metrics.dropped.labels("t", "relabel")._value.get() == 110  # pod-7's
    # Decoded once each, and once more for the 12 that came back: not again at every segment.
    assert sender.series.learned == 24 + 12
    assert (len(from_memory) > 50) == bool(recent)  # most rounds from memory, or none
    onward.buffer.close()
