"""The VPA updater's rule as a pure function: modes, bounds, once per target, limits kept in ratio."""

from __future__ import annotations

import pytest

from metricsd.consumers.vpa.recommender import ContainerRecommendation
from metricsd.consumers.vpa.spec import ContainerPolicy, TargetRef, VPASpec
from metricsd.consumers.vpa.updater import decide_update

TARGET = {"cpu": 0.5, "memory": 200.0}
REC = (ContainerRecommendation("app", target=TARGET, lower_bound={"cpu": 0.3, "memory": 150.0},
                               upper_bound={"cpu": 0.9, "memory": 400.0}, uncapped_target=TARGET),)


def spec(mode: str = "Auto", values: str = "RequestsAndLimits") -> VPASpec:
    return VPASpec("v", "ns", TargetRef("Deployment", "web"), update_mode=mode,  # type: ignore[arg-type]
                   container_policies=(ContainerPolicy("*", controlled_values=values),))  # type: ignore[arg-type]


def test_no_recommendation_is_no_data() -> None:
    assert decide_update(spec(), (), {}, {}, None).rule == "NoData"


@pytest.mark.parametrize("mode", ["Off", "Initial"])
def test_off_and_initial_only_recommend(mode: str) -> None:
    d = decide_update(spec(mode), REC, {"app": {"cpu": 2.0}}, {}, None)
    assert (d.rule, d.containers) == ("RecommendOnly", None) and f"updateMode {mode}" in d.reason


def test_requests_within_the_bounds_change_nothing() -> None:
    d = decide_update(spec(), REC, {"app": {"cpu": 0.4, "memory": 300.0}}, {}, None)
    assert (d.rule, d.containers) == ("WithinBounds", None)


def test_a_request_outside_the_bounds_hands_the_target_over_with_limits_in_their_old_ratio() -> None:
    d = decide_update(spec(), REC, {"app": {"cpu": 2.0, "memory": 300.0}}, {"app": {"cpu": 4.0}}, None)
    assert d.rule == "Update" and d.reason == "app cpu request 2 outside [0.3, 0.9]"
    assert d.containers == {"app": {"requests": {"cpu": 0.5, "memory": 200.0}, "limits": {"cpu": 1.0}}}
    assert d.wanted == {"app": {"cpu": 0.5, "memory": 200.0}}


def test_requests_only_leaves_limits_alone() -> None:
    d = decide_update(spec(values="RequestsOnly"), REC, {"app": {"cpu": 2.0}}, {"app": {"cpu": 4.0}}, None)
    assert d.containers == {"app": {"requests": {"cpu": 0.5, "memory": 200.0}}}


def test_the_same_target_is_handed_over_once() -> None:
    d = decide_update(spec(), REC, {"app": {"cpu": 2.0}}, {}, {"app": {"cpu": 0.5, "memory": 200.0}})
    assert d.rule == "Update" and d.containers is None and "already handed" in d.reason
