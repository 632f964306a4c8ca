"""The usual remote-write body (every sample field the same size) is read in one go by
``uniform_samples`` (http/remote_write_table.py), its sample runs gathered end to end from every
series; the general walk is not needed for it, and gives the same columns when it is used."""

from __future__ import annotations

import numpy as np
import pytest

from metricsd.http import remote_write_scan
from metricsd.http.remote_write_scan import scan
from metricsd.proto import prometheus_remote_pb2 as prom

T0 = 1_700_000_000_000


def body(runs: list[int]) -> bytes:
    """Series i with ``runs[i]`` samples (labels of differing lengths), 10 s apart; no value is 0.0 (proto3
    would leave its field out, and the body would not be uniform)."""
    req = prom.WriteRequest()
    for i, n in enumerate(runs):
        ts = req.timeseries.add()
        ts.labels.extend([prom.Label(name="__name__", value="cpu"), prom.Label(name="pod", value="p" * (i + 1))])
        ts.samples.extend(prom.Sample(value=i + 1 + k / 4, timestamp=T0 + 10_000 * k) for k in range(n))
    return req.SerializeToString()


@pytest.mark.parametrize("runs", [[1, 1, 1], [3, 1, 2], [2, 0, 4]])
def test_a_uniform_body_is_read_without_the_general_walk(monkeypatch: pytest.MonkeyPatch, runs: list[int]) -> None:
    raw = body(runs)
    general = scan(raw)
    assert general is not None

    def no_walk(*args: object) -> None:
        raise AssertionError("the uniform body went the general way")

    monkeypatch.setattr(remote_write_scan, "_walk_samples", no_walk)
    got = scan(raw)
    assert got is not None
    assert got.counts.tolist() == runs
    assert got.timestamps.tolist() == [T0 + 10_000 * k for n in runs for k in range(n)]
    assert got.values.tolist() == [i + 1 + k / 4 for i, n in enumerate(runs) for k in range(n)]
    assert got.keys == general.keys
    assert np.array_equal(got.timestamps, general.timestamps)
