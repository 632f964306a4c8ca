"""Decisions as series (metricsd/consumers/recording.py): labels and values exactly, keys valid for a
store, and published series never read back by the consumers' own questions."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metricsd.consumers.recording import (
    colocation_series,
    decision_series,
    hpa_series,
    overcommit_series,
    vpa_series,
)
from metricsd.model import validate_labels

HPA_ENTRY: dict[str, Any] = {
    "time": "2024-01-02T00:00:00Z", "timeMs": 1_704_153_600_000, "consumer": "hpa", "hpa": "default/feed-api",
    "target": "Deployment/feed-api",
    "inputs": {"currentReplicas": 34, "pods": 34, "metrics": [
        {"metric": "Resource/cpu", "target": {"type": "Utilization", "value": 50.0}, "current": 31,
         "usageRatio": 0.62, "replicas": 22, "source": "live", "rule": "Scaled", "error": None,
         "podsReporting": 34, "available": True},
        {"metric": "Resource/memory", "target": {"type": "AverageValue", "value": 419430400.0}, "current": None,
         "usageRatio": None, "replicas": None, "source": "none", "rule": None, "error": "no data",
         "podsReporting": 0, "available": False}]},
    "rule": "DesiredWithinRange", "message": "...", "why": "CPU utilisation below its 50% target",
    "result": {"action": "dry-run", "errors": [], "desiredReplicas": 30, "metricReplicas": 22, "rescale": True,
               "usedHistory": False, "alert": True, "minReplicas": 10, "maxReplicas": 60, "schedule": None},
}


def _as_dict(samples: list[tuple[tuple[tuple[str, str], ...], float]]) -> dict[tuple[tuple[str, str], ...], float]:
    out = dict(samples)
    assert len(out) == len(samples), "a series appears twice in one decision"
    return out


def _key(name: str, **labels: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"__name__": name, **labels}.items()))


def test_an_hpa_decision_becomes_replica_and_target_series_keyed_by_its_workload() -> None:
    base = {"namespace": "default", "pod": "hpa:feed-api", "hpa": "feed-api", "workload": "feed-api"}
    got = _as_dict(hpa_series(HPA_ENTRY))
    assert got == {
        _key("metricsd_hpa_current_replicas", **base): 34.0,
        _key("metricsd_hpa_desired_replicas", **base): 30.0,
        _key("metricsd_hpa_min_replicas", **base): 10.0,
        _key("metricsd_hpa_max_replicas", **base): 60.0,
        # the decision with its reason in words and what was done, for the dashboard's markers
        _key("metricsd_hpa_decision", **base, reason="DesiredWithinRange", action="dry-run",
             why="CPU utilisation below its 50% target"): 30.0,
        _key("metricsd_hpa_at_max_alert", **base): 1.0,
        _key("metricsd_hpa_used_history", **base): 0.0,
        _key("metricsd_hpa_metric_current", **base, metric="Resource/cpu", target_type="Utilization"): 31.0,
        _key("metricsd_hpa_metric_target", **base, metric="Resource/cpu", target_type="Utilization"): 50.0,
        _key("metricsd_hpa_metric_replicas", **base, metric="Resource/cpu"): 22.0,
        _key("metricsd_hpa_target_utilization_ratio", **base, resource="cpu"): 0.5,
        # memory had no data: its target is known, its current value and proposal are not
        _key("metricsd_hpa_metric_target", **base, metric="Resource/memory", target_type="AverageValue"): 419430400.0,
    }


def test_the_decision_series_names_the_schedule_and_keeps_its_words_within_a_label_values_limit() -> None:
    for why in ("x" * 5000, "€" * 5000):  # cut by bytes, on a character's boundary
        entry = {**HPA_ENTRY, "rule": "BelowMinReplicas", "why": why,
                 "result": {**HPA_ENTRY["result"], "schedule": "evening-peak"}}
        (labels,) = [lab for lab, _ in hpa_series(entry) if dict(lab)["__name__"] == "metricsd_hpa_decision"]
        d = dict(labels)
        assert (d["reason"], d["schedule"], d["action"]) == ("BelowMinReplicas", "evening-peak", "dry-run")
        assert 0 < len(d["why"].encode()) <= 400 and set(d["why"]) == {why[0]}
        validate_labels(labels)


def test_an_hpa_without_pods_publishes_only_what_it_knows() -> None:
    entry = {"timeMs": 5, "hpa": "shop/web", "target": "Deployment/web", "rule": "NoPods",
             "inputs": {"currentReplicas": None, "pods": 0, "metrics": []},
             "result": {"action": "none", "errors": []}}
    assert hpa_series(entry) == []
    assert decision_series("hpa", [entry]) == []


def test_vpa_recommendations_are_parsed_quantities_per_container_and_bound() -> None:
    entry = {"timeMs": 7, "vpa": "video/video-transcode", "target": "Deployment/video-transcode",
             "inputs": {"containers": {"app": {"confidence": 0.25}}},
             "result": {"recommendation": {"containerRecommendations": [{
                 "containerName": "app", "target": {"cpu": "109m", "memory": "1939879381"},
                 "lowerBound": {"cpu": "81m", "memory": "1656307644"}, "upperBound": {"cpu": "1", "memory": "4Gi"},
                 "uncappedTarget": {"cpu": "109m", "memory": "1939879381"}}]}}}
    base = {"namespace": "video", "pod": "vpa:video-transcode", "vpa": "video-transcode",
            "workload": "video-transcode", "container": "app"}
    got = _as_dict(vpa_series(entry))
    assert got[_key("metricsd_vpa_recommendation_cores", **base, bound="target")] == pytest.approx(0.109)
    assert got[_key("metricsd_vpa_recommendation_cores", **base, bound="lower")] == pytest.approx(0.081)
    assert got[_key("metricsd_vpa_recommendation_cores", **base, bound="upper")] == 1.0
    assert got[_key("metricsd_vpa_recommendation_bytes", **base, bound="upper")] == 4 * 2**30
    assert got[_key("metricsd_vpa_recommendation_bytes", **base, bound="uncapped")] == 1939879381.0
    assert got[_key("metricsd_vpa_confidence", **base)] == 0.25
    assert len(got) == 9


def test_vpa_without_a_recommendation_publishes_nothing() -> None:
    assert vpa_series({"timeMs": 1, "vpa": "a/b", "target": "Deployment/b",
                       "result": {"recommendation": None}}) == []


def test_overcommit_advice_per_workload_node_and_hour_leaving_unknown_hours_out() -> None:
    entry = {"timeMs": 9, "advisor": "sim", "result": {
        "requests": [{"namespace": "default", "workload": "feed-api", "container": "app", "resource": "cpu",
                      "weekly_peak": 0.05, "recommended": 0.06, "reclaimable": 6.4},
                     {"namespace": "default", "workload": "feed-api", "container": "app", "resource": "memory",
                      "weekly_peak": 1e9, "recommended": 1.15e9, "reclaimable": -2e9}],
        "reclaimable": {"cluster": {"cpu": 84.0, "memory": -5e9}},
        "capacity": {"cpu": 168.0, "memory": 8e11},
        "nodes": [{"node": "n1", "borrowable": {"cpu": 14.9, "memory": 4.6e10}}],
        "tidal": [{"hour": 0, "peakUsage": {"cpu": None, "memory": None}, "lendable": {"cpu": None, "memory": None}},
                  {"hour": 7, "peakUsage": {"cpu": 20.0, "memory": 3e11}, "lendable": {"cpu": 142.2, "memory": 4e11}}],
    }}
    cluster = {"namespace": "_cluster", "pod": "overcommit:sim", "advisor": "sim"}
    work = {"namespace": "default", "pod": "overcommit:sim", "advisor": "sim", "workload": "feed-api",
            "container": "app"}
    assert _as_dict(overcommit_series(entry)) == {
        _key("metricsd_overcommit_recommended_request_cores", **work): 0.06,
        _key("metricsd_overcommit_weekly_peak_cores", **work): 0.05,
        _key("metricsd_overcommit_reclaimable_cores", **work): 6.4,
        _key("metricsd_overcommit_recommended_request_bytes", **work): 1.15e9,
        _key("metricsd_overcommit_weekly_peak_bytes", **work): 1e9,
        _key("metricsd_overcommit_reclaimable_bytes", **work): -2e9,
        _key("metricsd_overcommit_cluster_reclaimable_cores", **cluster): 84.0,
        _key("metricsd_overcommit_cluster_reclaimable_bytes", **cluster): -5e9,
        _key("metricsd_overcommit_capacity_cores", **cluster): 168.0,
        _key("metricsd_overcommit_capacity_bytes", **cluster): 8e11,
        _key("metricsd_overcommit_borrowable_cores", **cluster, node="n1"): 14.9,
        _key("metricsd_overcommit_borrowable_bytes", **cluster, node="n1"): 4.6e10,
        _key("metricsd_overcommit_lendable_cores", **cluster, hour="07"): 142.2,
        _key("metricsd_overcommit_lendable_bytes", **cluster, hour="07"): 4e11,
        _key("metricsd_overcommit_peak_usage_cores", **cluster, hour="07"): 20.0,
        _key("metricsd_overcommit_peak_usage_bytes", **cluster, hour="07"): 3e11,
    }


def test_colocation_plan_counts_phases_one_hot_per_node_and_plans_by_hour() -> None:
    entry = {"timeMs": 11, "plan": "sim", "result": {
        "pools": {"shared": {"Online": 4, "OnlineToOffline": 0, "Offline": 1, "OfflineToOnline": 0,
                             "onlineCores": 128.0, "lentCores": 32.0}},
        "nodes": [{"node": "w0", "pool": "shared", "phase": "Offline"}],
        "table": [{"pool": "shared", "hour": 3, "forecastCores": None, "nodesLendable": 2, "coresLendable": 64.0}],
        "surges": [{"rule": "feed-spike", "pool": "shared", "active": False}],
    }}
    base = {"namespace": "_cluster", "pod": "colocation:sim", "plan": "sim"}
    got = _as_dict(colocation_series(entry))
    assert got[_key("metricsd_colocation_nodes", **base, pool="shared", phase="Offline")] == 1.0
    assert got[_key("metricsd_colocation_nodes", **base, pool="shared", phase="Online")] == 4.0
    assert got[_key("metricsd_colocation_lent_cores", **base, pool="shared")] == 32.0
    phases = {dict(k)["phase"]: v for k, v in got.items() if dict(k)["__name__"] == "metricsd_colocation_node_phase"}
    assert phases == {"Online": 0.0, "OnlineToOffline": 0.0, "Offline": 1.0, "OfflineToOnline": 0.0}
    assert got[_key("metricsd_colocation_planned_lendable_cores", **base, pool="shared", hour="03")] == 64.0
    assert got[_key("metricsd_colocation_planned_lendable_nodes", **base, pool="shared", hour="03")] == 2.0
    assert _key("metricsd_colocation_forecast_cores", **base, pool="shared", hour="03") not in got
    assert got[_key("metricsd_colocation_surge_active", **base, rule="feed-spike", pool="shared")] == 0.0


def test_decision_series_takes_one_entry_or_a_list_and_skips_entries_without_a_time() -> None:
    assert [ts for ts, _ in decision_series("hpa", [HPA_ENTRY, {**HPA_ENTRY, "timeMs": None}])] == [HPA_ENTRY["timeMs"]]
    assert decision_series("hpa", HPA_ENTRY)[0][0] == HPA_ENTRY["timeMs"]
    with pytest.raises(KeyError):
        decision_series("nope", HPA_ENTRY)


_names = st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True)
_numbers = st.one_of(st.none(), st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True))


@given(ns=_names, name=_names, target=_names, current=_numbers, desired=_numbers, lo=_numbers, hi=_numbers,
       metric_value=_numbers, metric=st.sampled_from(["Resource/cpu", "Pods/qps", "External/queue"]),
       kind=st.sampled_from(["Utilization", "AverageValue", "Value"]))
def test_every_published_hpa_series_is_a_valid_finite_consumer_series(
        ns: str, name: str, target: str, current: Any, desired: Any, lo: Any, hi: Any, metric_value: Any,
        metric: str, kind: str) -> None:
    entry = {"timeMs": 1, "hpa": f"{ns}/{name}", "target": f"Deployment/{target}",
             "inputs": {"currentReplicas": current, "metrics": [
                 {"metric": metric, "target": {"type": kind, "value": metric_value}, "current": metric_value}]},
             "result": {"desiredReplicas": desired, "minReplicas": lo, "maxReplicas": hi, "alert": False}}
    for labels, value in hpa_series(entry):
        validate_labels(labels)  # namespace and pod present, names and lengths within the limits
        d = dict(labels)
        assert d["__name__"].startswith("metricsd_hpa_")
        assert d["namespace"] == ns and d["pod"] == f"hpa:{name}" and d["workload"] == target
        assert math.isfinite(value)


@given(hours=st.lists(st.tuples(st.integers(0, 23), _numbers), max_size=30),
       nodes=st.lists(st.tuples(_names, _numbers), max_size=10, unique_by=lambda t: t[0]))
def test_every_published_cluster_series_is_valid_and_keyed_under_the_cluster_namespace(
        hours: list[tuple[int, Any]], nodes: list[tuple[str, Any]]) -> None:
    entry = {"timeMs": 1, "advisor": "a", "result": {
        "tidal": [{"hour": h, "lendable": {"cpu": v}, "peakUsage": {"cpu": v}} for h, v in hours],
        "nodes": [{"node": n, "borrowable": {"cpu": v, "memory": v}} for n, v in nodes]}}
    samples = overcommit_series(entry)
    for labels, value in samples:
        validate_labels(labels)
        assert dict(labels)["namespace"] == "_cluster" and dict(labels)["pod"] == "overcommit:a"
        assert math.isfinite(value)
    finite_hours = {h for h, v in hours if v is not None and not isinstance(v, bool) and math.isfinite(v)}
    assert {dict(lab)["hour"] for lab, _ in samples if "hour" in dict(lab)} == {f"{h:02d}" for h in finite_hours}
