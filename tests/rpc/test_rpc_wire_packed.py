"""Aggregate replies built from NumPy buffers as packed fields equal the element-by-element ones."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.maths.partials import Partials
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.wire import partials_to_pb, series_partials_to_pb


@given(st.integers(0, 40), st.integers(1, 5), st.integers(0, 300), st.integers(0, 2**32))
@settings(max_examples=60, deadline=None)
def test_series_partials_as_packed_fields_equal_the_slow_way(n: int, times: int, top: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 2**64, n, dtype=np.uint64)
    group = rng.integers(0, max(1, top // 2), n).astype(np.int64)
    values = rng.normal(size=(n, times))
    values[rng.random((n, times)) < 0.2] = np.nan
    samples = rng.integers(0, top + 1, (n, times)).astype(np.uint32)  # past 127: the varint fallback
    fast = pb.SeriesPartials()
    series_partials_to_pb(ids, group, values, samples, fast)
    slow = pb.SeriesPartials(ids=ids.tolist(), group=group.tolist(), values=values.ravel().tolist(),
                             samples=samples.ravel().tolist())
    assert fast.SerializeToString() == slow.SerializeToString()
    assert np.array_equal(np.array(fast.values).view(np.uint64), values.ravel().view(np.uint64))


def test_partials_as_packed_fields_equal_the_slow_way() -> None:
    rng = np.random.default_rng(1)
    p = Partials(*(rng.normal(size=(3, 4)) for _ in range(4)))
    fast = pb.Partials()
    partials_to_pb(p, fast)
    slow = pb.Partials(sum=p.sum.ravel().tolist(), count=p.count.ravel().tolist(), min=p.min.ravel().tolist(),
                       max=p.max.ravel().tolist())
    assert fast == slow
    empty = pb.Partials()
    partials_to_pb(Partials(*(np.zeros((0, 4)) for _ in range(4))), empty)
    assert empty == pb.Partials()
