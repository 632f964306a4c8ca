"""Decisions in words (metricsd/consumers/wording.py): what an owner reads in the log, the status
command and the dashboard, for every reason the HPA records and both signs of a reclaimable amount."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metricsd.consumers.actuators.base import LogActuator, ScaleRequest, WorkloadRef
from metricsd.consumers.statusfmt import format_status
from metricsd.consumers.wording import (
    HPAContext,
    amount_words,
    hpa_entry_why,
    hpa_status_line,
    hpa_why,
    metric_words,
    reclaimable_words,
)

CASES = json.loads((Path(__file__).parent / "data" / "wording_cases.json").read_text())
GIB = 2**30


@pytest.mark.parametrize("case", CASES["amount"], ids=lambda c: c["words"])
def test_an_amount_reads_as_reclaimable_or_under_requested(case: dict[str, Any]) -> None:
    assert amount_words(case["value"], case["resource"]) == case["words"]


@pytest.mark.parametrize("case", CASES["status_line"], ids=lambda c: c["line"][:30])
def test_the_status_line_puts_the_counts_before_the_words(case: dict[str, Any]) -> None:
    assert hpa_status_line(case["current"], case["desired"], case["min"], case["max"], case["why"]) == case["line"]


@pytest.mark.parametrize(("cluster", "words"), [
    pytest.param({"cpu": 54.53, "memory": -48.42 * GIB},
                 "reclaimable now: 54.53 cores; memory under-requested by 48.42 GiB", id="the issue's line"),
    pytest.param({"cpu": 54.53, "memory": 2.5 * GIB}, "reclaimable now: 54.53 cores, 2.50 GiB", id="both positive"),
    pytest.param({"cpu": -1.5, "memory": 2.5 * GIB}, "reclaimable now: 2.50 GiB; CPU under-requested by 1.50 cores",
                 id="cpu negative"),
    pytest.param({"cpu": -0.4, "memory": -0.8 * GIB},
                 "nothing reclaimable now: CPU under-requested by 0.40 cores, memory under-requested by 0.80 GiB",
                 id="both negative"),
    pytest.param({"cpu": None, "memory": None}, "reclaimable now: nothing measured", id="nothing known"),
])
def test_the_advisors_line_names_an_under_request_instead_of_a_negative_amount(cluster: dict[str, Any],
                                                                               words: str) -> None:
    assert reclaimable_words(cluster) == words
    assert "-" not in words.replace("under-requested", "")


@given(st.floats(min_value=-1e15, max_value=1e15, allow_nan=False), st.sampled_from(["cpu", "memory"]))
def test_an_amount_is_under_requested_only_when_below_zero_and_never_shows_a_minus(value: float,
                                                                                   resource: str) -> None:
    words = amount_words(value, resource)
    shown = value if resource == "cpu" else value / GIB
    if words.startswith("under-requested by "):
        assert shown < 0 and float(words.split()[2]) == pytest.approx(-shown, abs=0.005 + 1e-9 * -shown)
    else:
        assert shown > -0.005 - 1e-12 and words.endswith(" reclaimable")
        assert float(words.split()[0]) == pytest.approx(max(shown, 0.0), abs=0.005 + 1e-9 * abs(shown))
    assert "-" not in words.replace("under-requested", "")


EVENING = HPAContext(36, 60, 10, 60, "evening-peak", "CPU utilisation below its 50% target")
PLAIN = HPAContext(3, 9, 3, 9, None, "CPU utilisation above its 70% target")


@pytest.mark.parametrize(("reason", "ctx", "words"), [
    pytest.param("BelowMinReplicas", EVENING, "schedule evening-peak raises the minimum from 10 to 36",
                 id="a schedule raised the minimum"),
    pytest.param("BelowMinReplicas", PLAIN, "below the minimum of 3", id="the spec's minimum"),
    pytest.param("BelowMinReplicas", HPAContext(10, 60, 10, 60, "targets-only"), "below the minimum of 10",
                 id="a schedule in force that leaves the minimum alone"),
    pytest.param("AboveMaxReplicas", HPAContext(2, 20, 2, 60, "night"),
                 "schedule night lowers the maximum from 60 to 20", id="a schedule lowered the maximum"),
    pytest.param("AboveMaxReplicas", PLAIN, "above the maximum of 9", id="the spec's maximum"),
    pytest.param("TooManyReplicas", PLAIN, "CPU utilisation above its 70% target, but the maximum is 9",
                 id="the metrics want more than the maximum"),
    pytest.param("TooFewReplicas", EVENING,
                 "CPU utilisation below its 50% target, but schedule evening-peak raises the minimum from 10 to 36",
                 id="the metrics want fewer than a scheduled minimum"),
    pytest.param("ScaleUpLimit", PLAIN, "CPU utilisation above its 70% target; adding replicas as fast as the "
                 "scale-up policy allows", id="scale-up policy"),
    pytest.param("ScaleDownLimit", HPAContext(3, 9), "the metrics ask for fewer replicas; removing replicas as fast "
                 "as the scale-down policy allows", id="scale-down policy without a driver"),
    pytest.param("ScaleDownStabilized", EVENING, "CPU utilisation below its 50% target, but the scale-down "
                 "stabilisation window keeps the highest recent recommendation", id="stabilised"),
    pytest.param("MaxStepLimit", PLAIN, "CPU utilisation above its 70% target; one action may change the count by "
                 "at most the step limit", id="step limit"),
    pytest.param("DesiredWithinRange", PLAIN, "CPU utilisation above its 70% target", id="the metrics decide"),
    pytest.param("WithinTolerance", PLAIN, "the metrics are within tolerance of their targets", id="tolerance"),
    pytest.param("InvalidMetrics", PLAIN, "the metrics cannot be read, so the count is kept", id="invalid"),
    pytest.param("PredictedLoadAhead", PLAIN, "predicted load ahead", id="a reason these words do not know yet"),
])
def test_each_hpa_reason_reads_as_a_sentence(reason: str, ctx: HPAContext, words: str) -> None:
    assert hpa_why(reason, ctx) == words


@pytest.mark.parametrize(("metric", "target", "ratio", "source", "rule", "words"), [
    ("Resource/cpu", {"type": "Utilization", "value": 50.0}, 1.1, "live", "Scaled",
     "CPU utilisation above its 50% target"),
    ("Resource/memory", {"type": "AverageValue", "value": 400 * 2**20}, 0.8, "live", "Scaled",
     "memory per pod below its 400Mi target"),
    ("Resource/cpu", {"type": "AverageValue", "value": 0.5}, 1.05, "live", "WithinTolerance",
     "CPU per pod within tolerance of its 500m target"),
    ("ContainerResource/app/cpu", {"type": "Utilization", "value": 60}, 1.3, "history", "HistoryScaled",
     "yesterday's CPU utilisation of container app above its 60% target"),
    ("Pods/requests_per_second", {"type": "AverageValue", "value": 100}, 1.0, "live", "Scaled",
     "requests_per_second per pod at its 100 target"),
    ("External/queue_depth", {"type": "Value", "value": 30}, None, "live", None, "queue_depth at its 30 target"),
])
def test_a_metric_against_its_target_needs_no_current_value(metric: str, target: dict[str, Any], ratio: float | None,
                                                            source: str, rule: str | None, words: str) -> None:
    assert metric_words(metric, target, ratio, source, rule) == words


def _entry(current: int, desired: int, usage: float, ratio: float, rule: str = "BelowMinReplicas") -> dict[str, Any]:
    """An HPA history entry in the controller's shape, as `metricsd up` records for default/feed-api at 21:00."""
    return {
        "hpa": "default/feed-api", "rule": rule, "message": "...",
        "inputs": {"currentReplicas": current, "metrics": [
            {"metric": "Resource/cpu", "target": {"type": "Utilization", "value": 50.0}, "current": usage,
             "usageRatio": ratio, "replicas": desired, "source": "live", "rule": "Scaled"}]},
        "result": {"desiredReplicas": desired, "metricReplicas": desired, "minReplicas": 36, "maxReplicas": 60,
                   "schedule": "evening-peak", "action": "dry-run"},
    }


def test_the_issues_status_line_says_which_schedule_raised_the_minimum() -> None:
    entry = _entry(34, 36, 55, 1.1)
    why = hpa_entry_why(entry, 10, 60)
    assert why == "schedule evening-peak raises the minimum from 10 to 36"
    assert hpa_status_line(34, 36, 36, 60, why) == (
        "34 -> 36 replicas (bounds 36..60): schedule evening-peak raises the minimum from 10 to 36")
    # without the spec's own bounds the words still name the schedule's minimum, not a guess
    assert hpa_entry_why(entry) == "below the minimum of 36"


def test_a_decision_that_could_not_be_made_reads_without_bounds() -> None:
    assert hpa_entry_why({"rule": "NoPods", "result": {}}) == "no pods of the target report metrics"
    assert hpa_entry_why({"rule": "SomethingNew", "result": {}}) == "something new"


@given(current=st.integers(1, 500), desired=st.integers(1, 500), usage=st.floats(51, 400), ratio=st.floats(1.01, 8),
       rule=st.sampled_from(["BelowMinReplicas", "TooManyReplicas", "ScaleUpLimit", "DesiredWithinRange",
                             "MaxStepLimit"]))
def test_the_words_do_not_change_with_the_counts_so_the_why_label_stays_bounded(
        current: int, desired: int, usage: float, ratio: float, rule: str) -> None:
    """The same rule, schedule and targets give the same words whatever the counts and readings are:
    `metricsd_hpa_decision{why}` then takes one value per (rule, schedule, driving metric)."""
    assert hpa_entry_why(_entry(current, desired, usage, ratio, rule), 10, 60) == \
        hpa_entry_why(_entry(34, 36, 55, 1.1, rule), 10, 60)


def test_the_hpa_status_table_has_the_words() -> None:
    entry = {**_entry(34, 36, 55, 1.1), "time": "2026-11-26T21:48:03Z"}
    doc = {"status": {"targets": [{"hpa": "default/feed-api", "minReplicas": 10, "maxReplicas": 60}]},
           "history": [entry]}
    lines = format_status("hpa", doc).splitlines()
    assert lines[0].split()[-1] == "WHY"
    assert lines[1].endswith("schedule evening-peak raises the minimum from 10 to 36")
    # an entry that carries its words (the controller records them) prints them as they are
    doc["history"] = [{**entry, "why": "as recorded"}]
    assert format_status("hpa", doc).splitlines()[1].endswith("as recorded")


def test_the_overcommit_status_table_says_under_requested() -> None:
    entry = {"time": "2026-11-26T21:47:49Z", "advisor": "sim", "rule": "Advised", "inputs": {"hoursOfHistory": 2},
             "result": {"reclaimable": {"cluster": {"cpu": 37.35, "memory": -49.66 * GIB}}}}
    lines = format_status("overcommit", [entry]).splitlines()
    assert lines[0].split() == ["TIME", "ADVISOR", "RULE", "CPU", "MEMORY", "HOURS", "SEEN"]
    assert "37.35 cores reclaimable" in lines[1] and "under-requested by 49.66 GiB" in lines[1]
    assert "-49" not in lines[1]


async def test_the_dry_run_log_line_says_why(caplog: pytest.LogCaptureFixture) -> None:
    ref = WorkloadRef("default", "Deployment", "feed-api")
    with caplog.at_level(logging.INFO, logger="metricsd.consumers"):
        await LogActuator().scale(ScaleRequest(ref, 34, 36, {"why": "schedule evening-peak raises the minimum from 10 "
                                                                    "to 36"}))
        await LogActuator().scale(ScaleRequest(ref, 34, 36))
    assert caplog.messages == [
        "dry run: would scale Deployment/default/feed-api from 34 to 36 replicas: schedule evening-peak raises the "
        "minimum from 10 to 36",
        "dry run: would scale Deployment/default/feed-api from 34 to 36 replicas",
    ]
