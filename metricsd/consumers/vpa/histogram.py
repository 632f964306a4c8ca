"""Exponentially bucketed histograms whose samples lose half their weight every half-life.

Mirrors vertical-pod-autoscaler/pkg/recommender/util: histogram_options.go
(NewExponentialHistogramOptions, FindBucket, GetBucketStart), histogram.go (AddSample,
SubtractSample, Percentile, scale, updateMinAndMaxBucket) and decaying_histogram.go (decayFactor,
shiftReferenceTimestamp). Decay works by giving newer samples exponentially more weight relative
to a reference time, so nothing has to touch old buckets as time passes; the reference moves
forward (and every weight is rescaled) only when the exponent would grow too large.

The checkpoint differs from upstream on purpose: upstream rounds weights to integers out of
10,000, which changes recommendations after a restart; ours keeps the float weights, so a
restored histogram answers exactly as the original did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["DecayingHistogram", "Histogram", "HistogramOptions"]

# Upstream maxDecayExponent: renormalise before 2^exponent overflows the weights' precision.
_MAX_DECAY_EXPONENT = 100


@dataclass(frozen=True)
class HistogramOptions:
    """Bucket n >= 1 starts at first_bucket_size * (ratio^n - 1) / (ratio - 1); the last bucket is open.

    epsilon is the weight below which a bucket counts as empty.
    """

    max_value: float
    first_bucket_size: float
    ratio: float
    epsilon: float

    def __post_init__(self) -> None:
        if self.max_value <= 0 or self.first_bucket_size <= 0 or self.epsilon <= 0 or self.ratio <= 1:
            raise ValueError("max_value, first_bucket_size and epsilon must be > 0, ratio must be > 1")

    @property
    def num_buckets(self) -> int:
        r = self.ratio
        return math.ceil(math.log(self.max_value * (r - 1) / self.first_bucket_size + 1, r)) + 1

    def find_bucket(self, value: float) -> int:
        """The bucket holding `value` (values past the last start land in the last bucket). O(1)."""
        if value < self.first_bucket_size:
            return 0
        bucket = int(math.log(value * (self.ratio - 1) / self.first_bucket_size + 1, self.ratio))
        return min(bucket, self.num_buckets - 1)

    def bucket_start(self, bucket: int) -> float:
        if bucket == 0:
            return 0.0
        return self.first_bucket_size * (self.ratio**bucket - 1) / (self.ratio - 1)

    def to_dict(self) -> dict[str, float]:
        return {"maxValue": self.max_value, "firstBucketSize": self.first_bucket_size, "ratio": self.ratio,
                "epsilon": self.epsilon}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HistogramOptions:
        return cls(float(d["maxValue"]), float(d["firstBucketSize"]), float(d["ratio"]), float(d["epsilon"]))


class Histogram:
    """Weighted samples in buckets. Not safe to share across threads."""

    def __init__(self, options: HistogramOptions) -> None:
        self.options = options
        self._n = options.num_buckets
        self.weights = [0.0] * self._n
        self.total_weight = 0.0
        self.min_bucket = self._n - 1
        self.max_bucket = 0

    def add_sample(self, value: float, weight: float) -> None:
        """Add `weight` to the bucket of `value`. O(1). Raises ValueError for a negative weight."""
        if weight < 0:
            raise ValueError("sample weight must be non-negative")
        bucket = self.options.find_bucket(value)
        self.weights[bucket] += weight
        self.total_weight += weight
        if bucket < self.min_bucket and self.weights[bucket] >= self.options.epsilon:
            self.min_bucket = bucket
        if bucket > self.max_bucket and self.weights[bucket] >= self.options.epsilon:
            self.max_bucket = bucket

    def subtract_sample(self, value: float, weight: float) -> None:
        """Take back a sample added before (upstream SubtractSample); weights never go below zero."""
        if weight < 0:
            raise ValueError("sample weight must be non-negative")
        bucket = self.options.find_bucket(value)
        weight = min(weight, self.weights[bucket])
        self.weights[bucket] -= weight
        self.total_weight -= weight
        if self.weights[bucket] < self.options.epsilon and bucket in (self.min_bucket, self.max_bucket):
            self._update_min_max()

    def is_empty(self) -> bool:
        return self.weights[self.min_bucket] < self.options.epsilon

    def percentile(self, p: float) -> float:
        """The end of the first bucket at which the cumulative weight reaches p * total (0 if empty).

        Returns a bucket boundary, so the answer is at most one bucket (5%) above the true value. O(buckets).
        """
        if self.is_empty():
            return 0.0
        threshold = p * self.total_weight
        partial = 0.0
        bucket = self.min_bucket
        while bucket < self.max_bucket:
            partial += self.weights[bucket]
            if partial >= threshold:
                break
            bucket += 1
        if bucket < self._n - 1:
            return self.options.bucket_start(bucket + 1)
        return self.options.bucket_start(bucket)

    def scale(self, factor: float) -> None:
        if factor < 0:
            raise ValueError("scale factor must be non-negative")
        self.weights = [w * factor for w in self.weights]
        self.total_weight *= factor
        self._update_min_max()

    def _update_min_max(self) -> None:
        eps = self.options.epsilon
        last = self._n - 1
        while self.weights[self.min_bucket] < eps and self.min_bucket < last:
            self.min_bucket += 1
        while self.weights[self.max_bucket] < eps and self.max_bucket > 0:
            self.max_bucket -= 1

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able checkpoint: the options, the non-zero buckets and the bookkeeping, all exact."""
        return {
            "options": self.options.to_dict(),
            "buckets": {str(i): w for i, w in enumerate(self.weights) if w != 0.0},
            "totalWeight": self.total_weight,
            "minBucket": self.min_bucket,
            "maxBucket": self.max_bucket,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Histogram:
        h = cls(HistogramOptions.from_dict(d["options"]))
        h._load(d)
        return h

    def _load(self, d: dict[str, Any]) -> None:
        for key, weight in d["buckets"].items():
            bucket = int(key)
            if not 0 <= bucket < self._n:
                raise ValueError(f"checkpoint bucket {bucket} outside 0..{self._n - 1}")
            self.weights[bucket] = float(weight)
        self.total_weight = float(d["totalWeight"])
        self.min_bucket = int(d["minBucket"])
        self.max_bucket = int(d["maxBucket"])

    def _check(self) -> None:
        """Invariants, for tests: the total matches the buckets and min/max bracket the non-empty ones."""
        assert math.isclose(self.total_weight, sum(self.weights), rel_tol=1e-9, abs_tol=1e-9)
        heavy = [i for i, w in enumerate(self.weights) if w >= self.options.epsilon]
        if heavy:
            assert self.min_bucket <= heavy[0] and self.max_bucket >= heavy[-1]


class DecayingHistogram(Histogram):
    """A histogram in which a sample's weight halves every `half_life_seconds` relative to newer ones."""

    def __init__(self, options: HistogramOptions, half_life_seconds: float, reference_time: float = 0.0) -> None:
        super().__init__(options)
        self.half_life = half_life_seconds
        self.reference_time = reference_time

    def add_decayed(self, value: float, weight: float, timestamp: float) -> None:
        """Add a sample taken at `timestamp` (Unix seconds). O(1), or O(buckets) when renormalising."""
        self.add_sample(value, weight * self._decay_factor(timestamp))

    def subtract_decayed(self, value: float, weight: float, timestamp: float) -> None:
        self.subtract_sample(value, weight * self._decay_factor(timestamp))

    def _decay_factor(self, timestamp: float) -> float:
        if timestamp > self.reference_time + self.half_life * _MAX_DECAY_EXPONENT:
            self._shift_reference(timestamp)
        return 2.0 ** ((timestamp - self.reference_time) / self.half_life)

    def _shift_reference(self, new_reference: float) -> None:
        # The reference stays a whole number of half-lives, so the rescale is an exact power of two.
        new_reference = round(new_reference / self.half_life) * self.half_life
        exponent = round((self.reference_time - new_reference) / self.half_life)
        self.scale(math.ldexp(1.0, exponent))
        self.reference_time = new_reference

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["halfLifeSeconds"] = self.half_life
        d["referenceTime"] = self.reference_time
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DecayingHistogram:
        h = cls(HistogramOptions.from_dict(d["options"]), float(d["halfLifeSeconds"]), float(d["referenceTime"]))
        h._load(d)
        return h
