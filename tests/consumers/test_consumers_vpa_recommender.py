"""The VPA recommender's model: memory peaks per interval, OOM bump, confidence multipliers, the pod
minimum, policy caps, and restart from a checkpoint."""

from __future__ import annotations

import json
import math
import random

import pytest

from metricsd.consumers.specfields import SpecError
from metricsd.consumers.vpa.model import ContainerAggregate
from metricsd.consumers.vpa.recommender import (
    RecommenderConfig,
    confidence_factor,
    estimate,
    recommend,
    to_status,
)
from metricsd.consumers.vpa.spec import ContainerPolicy, TargetRef, VPASpec, load_vpa_yaml

DAY = 86400.0
MIB = 2.0**20
T0 = 1_700_000_000.0
SPEC = VPASpec("web", "shop", TargetRef("Deployment", "web"))


def steady(minutes: int, cpu: float = 0.5, memory: float = 400 * MIB) -> ContainerAggregate:
    """One CPU and one memory sample a minute, for `minutes` + 1 samples."""
    agg = ContainerAggregate()
    for i in range(minutes + 1):
        agg.add_cpu_sample(cpu, 1.0, T0 + 60 * i)
        agg.add_memory_sample("pod-a", memory, T0 + 60 * i)
    return agg


@pytest.mark.parametrize(
    ("minutes", "confidence", "upper", "lower"),
    [
        pytest.param(5, 5 / 1440, 289.0, 0.6028, id="after 5 minutes the upper bound is x289 and the lower x0.60"),
        pytest.param(12 * 60, 0.5, 3.0, 0.99601, id="after 12 hours the upper bound is x3"),
        pytest.param(24 * 60, 1.0, 2.0, 0.998003, id="after a day the upper bound is x2"),
        pytest.param(7 * 24 * 60, 7.0, 1 + 1 / 7, 0.999714, id="after a week the upper bound is x1.14"),
    ],
)
def test_confidence_multipliers(minutes: int, confidence: float, upper: float, lower: float) -> None:
    agg = steady(minutes)
    # Lifespan and sample count agree at one sample a minute (the count is one higher).
    assert agg.confidence() == pytest.approx(confidence)
    assert confidence_factor(1.0, 1.0, agg.confidence()) == pytest.approx(upper, rel=1e-4)
    assert confidence_factor(0.001, -2.0, agg.confidence()) == pytest.approx(lower, rel=1e-4)
    est = estimate(agg, RecommenderConfig())
    cpu_p = agg.cpu.percentile(0.95)  # all samples sit in one bucket: every percentile is its end
    with_margin = int(int(cpu_p * 1000) * 1.15)
    assert est.upper_bound["cpu"] == int(with_margin * (1 + 1 / agg.confidence()))
    assert est.lower_bound["cpu"] == int(with_margin * (1 + 0.001 / agg.confidence()) ** -2)
    assert est.target["cpu"] == with_margin


def test_no_history_gives_an_unbounded_upper_and_the_minimum_lower() -> None:
    agg = ContainerAggregate()
    agg.add_cpu_sample(0.5, 1.0, T0)
    est = estimate(agg, RecommenderConfig())
    assert est.upper_bound["cpu"] == 10**14
    assert est.lower_bound == {"cpu": 25, "memory": 250 * 2**20}


@pytest.mark.parametrize(
    ("containers", "cpu_milli", "memory"),
    [
        pytest.param(1, 25, 250 * 2**20, id="a lone container gets at least 25 millicores and 250 MiB"),
        pytest.param(2, 12, 125 * 2**20, id="two containers share the pod minimum: 12 millicores and 125 MiB each"),
    ],
)
def test_pod_minimum(containers: int, cpu_milli: int, memory: int) -> None:
    est = estimate(steady(60, cpu=0.001, memory=20 * MIB), RecommenderConfig(), containers)
    assert (est.target["cpu"], est.target["memory"]) == (cpu_milli, memory)


def test_memory_keeps_one_peak_per_interval_and_forgets_after_eight() -> None:
    agg = ContainerAggregate()
    for value, offset in ((100e6, 0), (300e6, 3600), (200e6, 7200)):
        agg.add_memory_sample("pod-a", value, T0 + offset)
    window = agg.instances["pod-a"]
    assert window.peaks == [(T0 + DAY, 300e6)] and window.memory_peak == 300e6
    for day in range(1, 10):
        agg.add_memory_sample("pod-a", 150e6, T0 + day * DAY + 60)
    ends = [end for end, _ in agg.instances["pod-a"].peaks]
    # Ten intervals in, eight peaks are kept (the current one and seven before); day 0's 300 MB is gone.
    assert len(ends) == 8 and min(ends) == T0 + 3 * DAY
    assert agg.memory.percentile(1.0) < 300e6
    agg.memory._check()


@pytest.mark.parametrize(
    ("request_bytes", "usage", "bumped"),
    [
        pytest.param(200 * MIB, 0.0, 300 * MIB, id="an OOM kill at a 200 MiB request bumps memory by 100 MiB"),
        pytest.param(1024 * MIB, 0.0, 1.2 * 1024 * MIB, id="an OOM kill at a 1 GiB request bumps memory by 20%"),
        pytest.param(100 * MIB, 600 * MIB, 720 * MIB,
                     id="an OOM kill above the request bumps the observed peak instead"),
    ],
)
def test_oom_bump(request_bytes: float, usage: float, bumped: float) -> None:
    agg = ContainerAggregate()
    if usage:
        agg.add_memory_sample("pod-a", usage, T0)
    assert agg.record_oom("pod-a", T0 + 60, request_bytes)
    window = agg.instances["pod-a"]
    assert window.oom_peak == pytest.approx(bumped)
    assert [v for _, v in window.peaks] == [pytest.approx(bumped)]


def test_an_oom_older_than_the_interval_is_ignored() -> None:
    agg = ContainerAggregate()
    agg.add_memory_sample("pod-a", 100 * MIB, T0)
    assert not agg.record_oom("pod-a", T0 - 2 * DAY, 100 * MIB)


def test_policy_caps_controlled_resources_and_mode_off() -> None:
    spec = VPASpec("web", "shop", TargetRef("Deployment", "web"), "Auto", (
        ContainerPolicy("app", min_allowed={"cpu": 1.0}, max_allowed={"memory": 300 * MIB}),
        ContainerPolicy("sidecar", controlled_resources=("memory",)),
        ContainerPolicy("debug", mode="Off"),
    ))
    aggs = {name: steady(24 * 60, cpu=0.2, memory=400 * MIB) for name in ("app", "sidecar", "debug")}
    recs = {r.container_name: r for r in recommend(spec, aggs)}
    assert set(recs) == {"app", "sidecar"}
    app = recs["app"]
    assert app.target["cpu"] == 1.0 and app.lower_bound["cpu"] == 1.0  # raised to minAllowed
    assert app.target["memory"] == 300 * MIB and app.upper_bound["memory"] == 300 * MIB  # capped
    assert app.uncapped_target["cpu"] < 1.0 and app.uncapped_target["memory"] > 400 * MIB
    assert set(recs["sidecar"].target) == {"memory"}
    status = to_status(recommend(spec, aggs))
    first = status["recommendation"]["containerRecommendations"][0]
    assert first["containerName"] == "app" and first["target"] == {"cpu": "1", "memory": "300Mi"}


def feed(agg: ContainerAggregate, rng: random.Random, start: float, n: int) -> None:
    for i in range(n):
        t = start + 60 * i
        agg.add_cpu_sample(rng.lognormvariate(-1, 0.6), 0.5, t)
        pod = f"pod-{rng.randrange(3)}"
        agg.add_memory_sample(pod, rng.uniform(2e8, 9e8), t)
        if rng.random() < 0.001:
            agg.record_oom(pod, t, 5e8)


def test_restart_from_checkpoint_gives_identical_recommendations() -> None:
    rng_a, rng_b = random.Random(7), random.Random(7)
    original = ContainerAggregate()
    feed(original, rng_a, T0, 5000)
    restored = ContainerAggregate.from_dict(json.loads(json.dumps(original.to_dict())))
    rng_b.setstate(rng_a.getstate())
    assert recommend(SPEC, {"app": restored}) == recommend(SPEC, {"app": original})
    # The restored state keeps learning exactly as the original does.
    feed(original, rng_a, T0 + 5000 * 60, 3000)
    feed(restored, rng_b, T0 + 5000 * 60, 3000)
    assert recommend(SPEC, {"app": restored}) == recommend(SPEC, {"app": original})
    assert restored.to_dict() == original.to_dict()


def test_recommendation_tracks_p90_with_margin() -> None:
    agg = ContainerAggregate()
    for i in range(1000):
        agg.add_cpu_sample(0.1 if i % 10 else 2.0, 1.0, T0 + 60 * i)  # 10% of samples at 2 cores
    target = estimate(agg, RecommenderConfig()).target["cpu"]
    p90 = agg.cpu.percentile(0.9)
    assert p90 < 0.11 and target == int(int(p90 * 1000) * 1.15)
    assert math.isclose(agg.cpu.percentile(0.95), agg.cpu.options.bucket_start(agg.cpu.options.find_bucket(2.0) + 1))


def test_vpa_spec_reads_policies_and_names_bad_fields() -> None:
    [spec] = load_vpa_yaml("""
apiVersion: autoscaling.k8s.io/v1
kind: VerticalPodAutoscaler
metadata: {name: web, namespace: shop}
spec:
  targetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  updatePolicy: {updateMode: Initial}
  resourcePolicy:
    containerPolicies:
    - containerName: "*"
      minAllowed: {cpu: 50m, memory: 64Mi}
      maxAllowed: {cpu: 4, memory: 8Gi}
    - {containerName: istio-proxy, mode: "Off"}
""")
    assert spec.update_mode == "Initial"
    assert spec.policy_for("app").min_allowed == {"cpu": 0.05, "memory": 64 * MIB}
    assert spec.policy_for("app").max_allowed == {"cpu": 4.0, "memory": 8 * 2**30}
    assert spec.policy_for("istio-proxy").mode == "Off"
    with pytest.raises(SpecError, match=r"^documents\[0\]\.spec\.updatePolicy\.updateMode: must be one of"):
        load_vpa_yaml("kind: VerticalPodAutoscaler\nmetadata: {name: x}\nspec:\n  targetRef: {kind: D, name: x}\n"
                      "  updatePolicy: {updateMode: Sometimes}\n")
    with pytest.raises(SpecError, match=r"containerPolicies\[0\]\.maxAllowed\.cpu: must be >= minAllowed\.cpu"):
        load_vpa_yaml("kind: VerticalPodAutoscaler\nmetadata: {name: x}\nspec:\n  targetRef: {kind: D, name: x}\n"
                      "  resourcePolicy:\n    containerPolicies:\n    - {minAllowed: {cpu: 2}, maxAllowed: {cpu: 1}}\n")
