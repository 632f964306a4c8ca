"""Decaying histograms: percentiles against a brute-force weighted percentile, decay, renormalisation,
and an exact checkpoint."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.consumers.vpa.histogram import DecayingHistogram, Histogram, HistogramOptions
from metricsd.consumers.vpa.model import AggregationConfig

DAY = 86400.0
CPU = AggregationConfig().cpu_options()
MEMORY = AggregationConfig().memory_options()


@pytest.mark.parametrize(
    ("options", "buckets", "first_starts"),
    [
        pytest.param(CPU, 223, [0.0, 0.001, 0.00205],
                     id="CPU buckets start at 1 millicore and grow 5% up to 1000 cores"),
        pytest.param(MEMORY, 176, [0.0, 1e7, 2.05e7],
                     id="memory buckets start at 10 MB and grow 5% up to 1 TB"),
    ],
)
def test_bucket_layout(options: HistogramOptions, buckets: int, first_starts: list[float]) -> None:
    assert options.num_buckets == buckets
    assert [options.bucket_start(i) for i in range(3)] == pytest.approx(first_starts)
    assert options.bucket_start(buckets - 1) >= options.max_value > options.bucket_start(buckets - 2)
    for i in range(1, buckets):
        # A value just above a bucket's start falls in that bucket.
        assert options.find_bucket(options.bucket_start(i) * (1 + 1e-9)) == i


def brute_force_percentile(samples: list[tuple[float, float]], p: float) -> float:
    """The first sample, in value order, at which the cumulative weight reaches p of the total."""
    total = sum(w for _, w in samples)
    acc = 0.0
    ordered = sorted(samples)
    for value, weight in ordered:
        acc += weight
        if acc >= p * total:
            return value
    return ordered[-1][0]


@settings(max_examples=200, deadline=None)
@given(
    samples=st.lists(
        st.tuples(st.floats(0.0, 1500.0), st.integers(1, 20).map(float)), min_size=1, max_size=60
    ),
    p=st.sampled_from([0.0, 0.5, 0.9, 0.95, 1.0]),
)
def test_percentile_matches_brute_force(samples: list[tuple[float, float]], p: float) -> None:
    h = Histogram(CPU)
    for value, weight in samples:
        h.add_sample(value, weight)
    h._check()
    got = h.percentile(p)
    true = brute_force_percentile(samples, p)
    bucket = CPU.find_bucket(true)
    assert got == CPU.bucket_start(min(bucket + 1, CPU.num_buckets - 1))
    if bucket < CPU.num_buckets - 1:
        # The answer is the end of the sample's bucket: at most 5% plus one first bucket above it.
        assert true <= got <= true * 1.05 + CPU.first_bucket_size


def test_empty_histogram_answers_zero() -> None:
    assert Histogram(CPU).percentile(0.9) == 0.0


def test_a_sample_one_half_life_newer_weighs_twice_as_much() -> None:
    h = DecayingHistogram(CPU, DAY)
    t0 = 1_700_000_000.0
    h.add_decayed(1.0, 1.0, t0)
    h.add_decayed(2.0, 1.0, t0 + DAY)
    old, new = h.weights[CPU.find_bucket(1.0)], h.weights[CPU.find_bucket(2.0)]
    assert new == pytest.approx(2 * old)
    # The median now lies in the newer sample's bucket (1 of 3 weight units is below it).
    assert h.percentile(0.5) == CPU.bucket_start(CPU.find_bucket(2.0) + 1)


def test_renormalising_the_reference_keeps_relative_weights() -> None:
    h = DecayingHistogram(CPU, DAY, reference_time=0.0)
    h.add_decayed(1.0, 1.0, 150 * DAY)  # past 100 half-lives: the reference moves
    h.add_decayed(2.0, 1.0, 151 * DAY)
    assert h.reference_time == 150 * DAY
    assert h.weights[CPU.find_bucket(2.0)] == pytest.approx(2 * h.weights[CPU.find_bucket(1.0)])
    h._check()


def test_subtracting_a_sample_takes_back_its_decayed_weight() -> None:
    h = DecayingHistogram(MEMORY, DAY)
    h.add_decayed(5e8, 1.0, 3 * DAY)
    h.add_decayed(9e8, 1.0, 4 * DAY)
    h.subtract_decayed(9e8, 1.0, 4 * DAY)
    assert h.total_weight == pytest.approx(8.0)
    assert h.percentile(1.0) == MEMORY.bucket_start(MEMORY.find_bucket(5e8) + 1)
    h._check()


def test_checkpoint_round_trip_is_exact() -> None:
    h = DecayingHistogram(CPU, DAY, reference_time=0.0)
    for i in range(500):
        h.add_decayed((i * 37 % 101) / 10.0, 0.1 + (i % 7) / 3.0, i * 977.0)
    restored = DecayingHistogram.from_dict(json.loads(json.dumps(h.to_dict())))
    assert restored.weights == h.weights and restored.total_weight == h.total_weight
    assert [restored.percentile(p) for p in (0.5, 0.9, 0.95)] == [h.percentile(p) for p in (0.5, 0.9, 0.95)]
