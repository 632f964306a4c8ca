"""Predictive scale-up in the HPA: the `predictive:` spec block, the decision taking the larger of
the reactive recommendation and the forecast's for scale-up only, and the loop reading the hourly
demand from a real store, recording and publishing the forecast.

The demand history used here rises through every day: 0.5 + 0.25 cores per hour of the day, so at
10:05 it is 3.02 cores and two hours later 3.52 (hourly means joined at mid-hour are exact for a
line). The HPA's CPU target is 50% of a 1-core request, so one replica carries 0.5 cores.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
import yaml
from consumers_data import DAY0, HOUR, MIN, local_store, pod_labels, write
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.clock import ManualClock
from metricsd.consumers.actuators.base import InMemoryScale, WorkloadRef
from metricsd.consumers.hpa.algorithm import Decision, HPAInput, HPAState, decide
from metricsd.consumers.hpa.controller import HPAController
from metricsd.consumers.hpa.parse import parse_hpa
from metricsd.consumers.hpa.replicas import MetricObservation, PodInfo, PodSample
from metricsd.consumers.hpa.spec import HPASpec, Predictive
from metricsd.consumers.recording import hpa_series
from metricsd.consumers.specfields import SpecError
from metricsd.consumers.statusfmt import format_status
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import Unavailable
from metricsd.store.api import StoreAPI

DAY = 24 * HOUR
TODAY = DAY0 + 2 * DAY
NOW_MS = TODAY + 10 * HOUR + 5 * MIN
CPU = "Resource/cpu"
REF = WorkloadRef("shop", "Deployment", "web")


def demand_at(t_ms: int) -> float:
    return 0.5 + 0.25 * (t_ms % DAY) / HOUR


def history(until_ms: int = NOW_MS, days: int = 2, f: Any = demand_at) -> dict[int, float]:
    start = until_ms // DAY * DAY - days * DAY
    return {h: sum(f(h + k * MIN) for k in range(60)) / 60 for h in range(start, until_ms // HOUR * HOUR, HOUR)}


def make_spec(predictive: Any = None, max_replicas: int = 200, **spec: Any) -> HPASpec:
    body: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
        "minReplicas": 1, "maxReplicas": max_replicas,
        "metrics": [{"type": "Resource",
                     "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}],
    }
    if predictive is not None:
        body["metricsd"] = {"predictive": predictive}
    body.update(spec)
    return parse_hpa({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                      "metadata": {"name": "web", "namespace": "shop"}, "spec": body})


PREDICTIVE = make_spec({"horizon": "2h"})
REACTIVE = make_spec()


def observe(current: int, total_cores: float) -> HPAInput:
    """`current` ready pods sharing `total_cores` of CPU, 1-core requests, and the demand history."""
    pods = [PodInfo(f"web-{i}", start_time=NOW_MS / 1000 - 3600, ready_transition=NOW_MS / 1000 - 3500)
            for i in range(current)]
    obs = MetricObservation(samples={p.name: PodSample(total_cores / current) for p in pods},
                            requests={p.name: 1.0 for p in pods})
    return HPAInput(NOW_MS / 1000, current, pods, {CPU: obs}, demand={CPU: history()})


# --- the spec -----------------------------------------------------------------------------------


def test_the_predictive_block_is_read_with_its_defaults() -> None:
    assert make_spec({}).metricsd.predictive == Predictive(1800.0, "sameHour", 1.0, 7, 0.25)
    full = make_spec({"horizon": "45m", "method": "holtWinters", "weight": 1.2, "days": 5, "maxError": 0.3})
    assert full.metricsd.predictive == Predictive(2700.0, "holtWinters", 1.2, 5, 0.3)
    assert make_spec({"horizon": 600}).metricsd.predictive == Predictive(horizon_seconds=600.0)
    assert make_spec({"enabled": False}).metricsd.predictive is None
    assert REACTIVE.metricsd.predictive is None


@pytest.mark.parametrize(
    ("block", "message"),
    [
        pytest.param("{horizon: soon}", "predictive.horizon: must be a duration like 30m or 1h, got 'soon'",
                     id="names a horizon that is no duration"),
        pytest.param("{horizon: 10s}", "predictive.horizon: must be between 1m and 6h, got '10s'",
                     id="rejects a horizon shorter than a minute"),
        pytest.param("{horizon: 7h}", "predictive.horizon: must be between 1m and 6h, got '7h'",
                     id="rejects a horizon the hourly history cannot serve"),
        pytest.param("{method: prophet}", "predictive.method: must be one of sameHour, holtWinters, got 'prophet'",
                     id="names the methods"),
        pytest.param("{weight: 0}", "predictive.weight: must be > 0, got 0.0", id="rejects a zero weight"),
        pytest.param("{weight: 3}", "predictive.weight: must be <= 2.0, got 3.0", id="bounds the weight"),
        pytest.param("{days: 8}", "predictive.days: must be <= 7, got 8", id="reads no further back than the rollups"),
        pytest.param("{days: 0}", "predictive.days: must be >= 1, got 0", id="needs a day"),
        pytest.param("{method: holtWinters, days: 1}",
                     "predictive.days: holtWinters needs at least 2 (the first day seeds the season), got 1",
                     id="holt-winters needs a day to seed its season"),
        pytest.param("{maxError: 0}", "predictive.maxError: must be > 0, got 0.0", id="rejects a zero error limit"),
        pytest.param("{horizon: 30m, window: 2h}", "predictive.window: unknown field", id="rejects a misspelt field"),
        pytest.param("true", "predictive: must be a mapping, got", id="requires a mapping"),
    ],
)
def test_a_bad_predictive_block_is_refused_naming_its_field(block: str, message: str) -> None:
    with pytest.raises(SpecError) as err:
        make_spec(yaml.safe_load(block))
    assert str(err.value).startswith(f"spec.metricsd.{message}"), str(err.value)


def test_an_hpa_on_external_metrics_only_cannot_be_predictive() -> None:
    external = {"type": "External", "external": {"metric": {"name": "queue"}, "target": {"type": "Value",
                                                                                       "value": "30"}}}
    with pytest.raises(SpecError) as err:
        make_spec({}, metrics=[external])
    assert str(err.value) == ("spec.metricsd.predictive: needs a Resource, ContainerResource or Pods metric: "
                              "External metrics are not forecast")


# --- the decision -------------------------------------------------------------------------------


def test_a_predictive_hpa_scales_up_before_the_metrics_ask() -> None:
    # 3.02 cores on 6 pods is 50%: the metrics are content. Within two hours 3.52 cores need 8.
    inputs = observe(6, demand_at(NOW_MS))
    reactive = decide(REACTIVE, inputs, HPAState())
    assert (reactive.desired_replicas, reactive.reason) == (6, "WithinTolerance")
    d = decide(PREDICTIVE, inputs, HPAState())
    assert (d.desired_replicas, d.reason, d.metric_replicas) == (8, "PredictedScaleUp", 6)
    assert d.message == "the forecast needs more replicas within 120 min: 6 -> 8 replicas, metrics wanted 6 " \
                        "(bounds 1..200)"
    assert d.prediction is not None and d.prediction.raised and d.prediction.replicas == 8
    [m] = d.prediction.metrics
    assert m.forecast.usable and m.forecast.days == (1, 2)
    assert m.forecast.peak == pytest.approx(demand_at(NOW_MS + 2 * HOUR), rel=1e-3)
    assert m.forecast.error == pytest.approx(0.0, abs=1e-9)
    assert m.capacity == pytest.approx(0.5)
    assert m.value == pytest.approx(100 * demand_at(NOW_MS + 2 * HOUR) / 6, rel=1e-3)  # % of the request, 6 pods


def test_the_prediction_never_exceeds_max_replicas() -> None:
    d = decide(make_spec({"horizon": "2h"}, max_replicas=7), observe(6, demand_at(NOW_MS)), HPAState())
    assert d.prediction is not None and d.prediction.replicas == 7
    assert d.desired_replicas == 7


def test_a_forecast_that_fits_the_replicas_holds_them_against_a_scale_down() -> None:
    # Usage fell to 1 core just now (the metrics want 2), but within the horizon the demand needs the 8 there are.
    d = decide(PREDICTIVE, observe(8, 1.0), HPAState())
    assert d.metric_replicas == 2
    assert (d.desired_replicas, d.reason) == (8, "PredictionHolds")
    # Below what the forecast needs, the reactive rule scales down as far as the forecast lets it.
    d = decide(PREDICTIVE, observe(12, 1.0), HPAState())
    assert d.desired_replicas == 8


def test_without_history_the_reactive_rule_decides_alone_and_says_why() -> None:
    inputs = replace(observe(6, 4.0), demand={})
    d, reactive = decide(PREDICTIVE, inputs, HPAState()), decide(REACTIVE, inputs, HPAState())
    assert (d.desired_replicas, d.reason, d.message) == (reactive.desired_replicas, reactive.reason, reactive.message)
    assert d.prediction is not None and d.prediction.replicas is None
    assert d.prediction.metrics[0].forecast.reason == "NoHistory"


def test_a_forecast_with_a_large_recent_error_is_not_used() -> None:
    # Today's last hours run twice the days before, then half: the days fit, but not the recent hours.
    def erratic(t: int) -> float:
        hour = (t - TODAY) // HOUR
        return demand_at(t) * (1.0 if t < TODAY or hour < 4 else (2.0 if hour % 2 else 0.5))

    inputs = replace(observe(6, demand_at(NOW_MS)), demand={CPU: history(f=erratic)})
    d = decide(PREDICTIVE, inputs, HPAState())
    assert d.prediction is not None and d.prediction.replicas is None
    fc = d.prediction.metrics[0].forecast
    assert fc.reason == "LargeError" and fc.error is not None and fc.error > 0.25
    assert d.desired_replicas == decide(REACTIVE, inputs, HPAState()).desired_replicas


def test_the_weight_scales_the_forecast_before_it_becomes_replicas() -> None:
    heavy = decide(make_spec({"horizon": "2h", "weight": 1.5}), observe(6, demand_at(NOW_MS)), HPAState())
    assert heavy.desired_replicas == 11  # 1.5 * 3.52 cores / 0.5
    light = decide(make_spec({"horizon": "2h", "weight": 0.5}), observe(6, demand_at(NOW_MS)), HPAState())
    assert light.desired_replicas == 6 and light.prediction is not None and light.prediction.replicas == 4


def test_a_pods_metric_is_forecast_against_its_average_value() -> None:
    rps = {"type": "Pods", "pods": {"metric": {"name": "rps"}, "target": {"type": "AverageValue",
                                                                          "averageValue": "0.4"}}}
    spec = make_spec({"horizon": "2h"}, metrics=[rps])
    pods = [PodInfo(f"web-{i}") for i in range(6)]
    obs = MetricObservation(samples={p.name: PodSample(0.4) for p in pods})
    d = decide(spec, HPAInput(NOW_MS / 1000, 6, pods, {"Pods/rps": obs}, demand={"Pods/rps": history()}), HPAState())
    assert d.prediction is not None and d.prediction.metrics[0].capacity == 0.4
    assert d.desired_replicas == 9  # 3.52 / 0.4


def test_without_requests_a_utilisation_forecast_cannot_size_replicas() -> None:
    inputs = observe(6, 3.0)
    inputs = replace(inputs, metrics={CPU: replace(inputs.metrics[CPU], requests={})})
    d = decide(PREDICTIVE, inputs, HPAState())
    assert d.prediction is not None and d.prediction.metrics[0].forecast.reason == "NoRequests"


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 150), st.floats(0.0, 100.0), st.floats(0.05, 20.0), st.integers(1, 200),
       st.sampled_from(["30m", "2h"]))
def test_the_prediction_only_raises_the_reactive_decision_and_never_beyond_max(
        current: int, total_cores: float, level: float, max_replicas: int, horizon: str) -> None:
    scaled = {h: level * v for h, v in history().items()}
    inputs = replace(observe(current, total_cores), demand={CPU: scaled})
    predictive = make_spec({"horizon": horizon}, max_replicas=max_replicas)
    reactive = make_spec(max_replicas=max_replicas)
    d, r = decide(predictive, inputs, HPAState()), decide(reactive, inputs, HPAState())
    assert d.desired_replicas >= r.desired_replicas  # a scale-down happens only when the reactive rule wants it
    if d.desired_replicas > r.desired_replicas:
        assert d.desired_replicas <= max(max_replicas, current)
        assert d.prediction is not None and d.prediction.replicas is not None
        assert d.desired_replicas <= max(d.prediction.replicas, current)
    assert d.prediction is not None
    if d.prediction.replicas is None:
        assert (d.desired_replicas, d.reason) == (r.desired_replicas, r.reason)


def _prediction(d: Decision) -> Any:
    assert d.prediction is not None
    return replace(d.prediction, raised=False)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 60), st.floats(1.0, 50.0))
def test_a_flash_crowd_history_never_saw_changes_only_the_reactive_part(current: int, crowd: float) -> None:
    calm = observe(current, demand_at(NOW_MS))
    flash = observe(current, demand_at(NOW_MS) * crowd)
    d_calm, d_flash = decide(PREDICTIVE, calm, HPAState()), decide(PREDICTIVE, flash, HPAState())
    assert _prediction(d_flash) == _prediction(d_calm)
    reactive = decide(REACTIVE, flash, HPAState())
    assert d_flash.desired_replicas == max(reactive.desired_replicas, d_calm.desired_replicas) or \
        d_flash.desired_replicas == reactive.desired_replicas


# --- the loop, on a real store ------------------------------------------------------------------


def feed_demand(api: StoreAPI, pods: int, start: int, end: int) -> None:
    """`pods` pods of shop/web sharing demand_at(t) cores: every 5 min up to 10 min before `end`, then
    every 10 s (the live rate needs two samples a minute); 1-core requests."""
    ts = [*range(start, end - 10 * MIN, 5 * MIN), *range(end - 10 * MIN, end + 1, 10_000)]
    counter, counters = 0.0, []
    for prev, t in zip([start, *ts], ts, strict=False):
        counter += demand_at(prev) / pods * (t - prev) / 1000
        counters.append(counter)
    for i in range(pods):
        labels = pod_labels("shop", "web", f"web-{i}")
        write(api, "container_cpu_usage_seconds_total", labels, ts, counters)
        write(api, "kube_pod_container_resource_requests", {**labels, "resource": "cpu", "unit": "core"}, ts,
              [1.0] * len(ts))


async def test_the_loop_forecasts_from_the_rollups_and_records_and_publishes_the_forecast() -> None:
    api, backend = local_store()
    feed_demand(api, 6, DAY0, NOW_MS)
    cluster = InMemoryScale({REF: 6})
    # 100 minutes ahead: 3.44 cores, 6.9 replicas' worth (the rollups' rates lag the line a little).
    ctl = HPAController([make_spec({"horizon": "100m"})], backend, cluster, ManualClock(NOW_MS))
    entry = (await ctl.sync_once())[0]
    assert (entry["rule"], entry["result"]["desiredReplicas"], cluster.replicas[REF]) == ("PredictedScaleUp", 7, 7)
    prediction = entry["result"]["prediction"]
    assert prediction == {"method": "sameHour", "horizonSeconds": 6000.0, "weight": 1.0, "active": True,
                          "replicas": 7, "raised": True, "reason": "Forecast", "message": prediction["message"],
                          "error": prediction["error"]}
    assert prediction["error"] < 0.02
    row = entry["inputs"]["metrics"][0]["prediction"]
    assert row["demandPeak"] == pytest.approx(demand_at(NOW_MS + 100 * MIN), rel=0.02)
    assert row["peakAt"] == "2024-01-04T11:45:00Z" and row["days"] == [1, 2] and row["replicas"] == 7
    doc = json.loads(json.dumps({"status": ctl.status(), "history": ctl.history()}, allow_nan=False))
    assert doc["status"]["targets"][0]["prediction"]["replicas"] == 7
    series = {dict(labels)["__name__"]: (dict(labels), v) for labels, v in hpa_series(entry)}
    assert series["metricsd_hpa_predicted_replicas"][1] == 7
    assert series["metricsd_hpa_prediction_active"][1] == 1.0
    assert series["metricsd_hpa_predicted_utilization_ratio"][0]["resource"] == "cpu"
    assert series["metricsd_hpa_predicted_utilization_ratio"][1] == pytest.approx(row["value"] / 100)
    assert series["metricsd_hpa_metric_predicted_replicas"][1] == 7
    assert series["metricsd_hpa_forecast_error_ratio"][1] == pytest.approx(prediction["error"])
    # The hours already read are not asked for again within the hour.
    reads = []
    original = backend.rollups

    async def counting(request: pb.ReadRequest) -> pb.RollupsResponse:
        reads.append(request)
        return await original(request)

    backend.rollups = counting  # type: ignore[method-assign]
    await ctl.sync_once()
    assert reads == []


class NoRollups:
    """A backend whose hourly rollups are unreachable while live queries answer."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def rollups(self, request: pb.ReadRequest) -> pb.RollupsResponse:
        raise Unavailable("no quorum for the rollups")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_without_the_rollups_the_loop_falls_back_and_reports_it() -> None:
    api, backend = local_store()
    feed_demand(api, 6, NOW_MS - HOUR, NOW_MS)
    ctl = HPAController([PREDICTIVE], NoRollups(backend), InMemoryScale({REF: 6}), ManualClock(NOW_MS))
    entry = (await ctl.sync_once())[0]
    assert entry["result"]["prediction"]["active"] is False
    assert entry["result"]["prediction"]["reason"] == "NoHistory"
    assert entry["result"]["desiredReplicas"] == 6
    assert any("reading the hourly demand of Resource/cpu: no quorum" in e for e in entry["result"]["errors"])
    assert "metricsd_hpa_predicted_replicas" not in {dict(lab)["__name__"] for lab, _ in hpa_series(entry)}


def test_the_status_table_gains_a_forecast_column_only_for_predictive_hpas() -> None:
    def entry(prediction: dict[str, Any] | None) -> dict[str, Any]:
        result: dict[str, Any] = {"desiredReplicas": 8, "minReplicas": 1, "maxReplicas": 200, "action": "scaled"}
        if prediction is not None:
            result["prediction"] = prediction
        return {"time": "2024-01-04T10:05:00Z", "hpa": "shop/web", "rule": "PredictedScaleUp",
                "inputs": {"currentReplicas": 6, "metrics": []}, "result": result}

    plain = format_status("hpa", {"history": [entry(None)]}).splitlines()
    assert "FORECAST" not in plain[0]
    lines = format_status("hpa", {"history": [
        entry({"active": True, "replicas": 8, "error": 0.012, "reason": "Forecast"}),
        entry({"active": False, "replicas": None, "error": 0.41, "reason": "LargeError"}),
        entry(None),
    ]}).splitlines()
    assert lines[0].split()[-1] == "FORECAST"
    assert lines[1].endswith("8 replicas (error 1%)")
    assert lines[2].endswith("off: LargeError (error 41%)")
    assert lines[3].endswith("-")
