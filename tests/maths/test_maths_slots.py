"""Slot hashing: pinned values, so a change of hash (which would move every pod) fails loudly."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.maths.slots import pod_hash, pod_hashes, slot_of, slot_of_labels, slots_of
from metricsd.model import make_labels


def test_the_pod_hash_is_blake2b_64_little_endian_pinned() -> None:
    assert pod_hash("default/web-0") == 12896766807520952412
    assert pod_hash("") == 13020603013274838756
    assert pod_hash("default/web-0") == int.from_bytes(
        hashlib.blake2b(b"default/web-0", digest_size=8).digest(), "little"
    )


def test_slots_of_known_pods_are_pinned() -> None:
    assert slot_of("default/web-0", 64) == 28
    assert slot_of("kube-system/coredns-1", 64) == 35
    assert slot_of("ns/é", 64) == 58


def test_a_series_lands_in_its_pods_slot_whatever_its_other_labels() -> None:
    pod = {"namespace": "default", "pod": "web-0"}
    cpu = make_labels("container_cpu_usage_seconds_total", {**pod, "container": "app"})
    req = make_labels("kube_pod_container_resource_requests", {**pod, "resource": "cpu"})
    assert slot_of_labels(cpu, 64) == slot_of_labels(req, 64) == 28
    assert slot_of_labels({"namespace": "default", "pod": "web-0"}, 64) == 28


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.text(max_size=40), max_size=50), slots=st.integers(1, 4096))
def test_the_vectorised_helpers_agree_with_the_scalar_ones(keys: list[str], slots: int) -> None:
    assert pod_hashes(keys).tolist() == [pod_hash(k) for k in keys]
    assert slots_of(keys, slots).tolist() == [slot_of(k, slots) for k in keys]
    assert slots_of(keys, slots).dtype == np.int64


def test_pods_spread_evenly_over_the_slots() -> None:
    counts = np.bincount(slots_of([f"ns-{i % 40}/pod-{i}" for i in range(64_000)], 64), minlength=64)
    assert counts.min() > 850 and counts.max() < 1150  # 1000 expected; 5 sigma is about 160


def test_zero_slots_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        slot_of("a/b", 0)
    with pytest.raises(ValueError, match="at least 1"):
        slots_of(["a/b"], 0)
