"""The VPA updater's rule, pure: given the recommendation, the running requests and the update mode,
what (if anything) to hand to the actuator. No I/O; the controller (controller.py) only acts on it.

Upstream's updater evicts a pod when a container's request lies outside [lowerBound, upperBound];
``Off`` only records the recommendation and ``Initial`` leaves it to admission at pod creation.
``Auto`` and ``Recreate`` hand the target over once per new target (``applied`` is the last one
handed over). With ``controlledValues: RequestsAndLimits`` a container's limits follow its new
requests at the ratio they had, as the VPA admission controller keeps it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from metricsd.consumers.vpa.recommender import ContainerRecommendation
from metricsd.consumers.vpa.spec import VPASpec

__all__ = ["UpdateDecision", "decide_update"]

Resources = Mapping[str, Mapping[str, float]]  # container -> resource -> amount


@dataclass(frozen=True)
class UpdateDecision:
    """``rule`` is NoData, RecommendOnly, WithinBounds or Update; ``containers`` is what to hand to
    the actuator (container -> "requests" / "limits" -> resource -> amount), None for nothing;
    ``wanted`` the targets it carries (the next ``applied``)."""

    rule: str
    reason: str
    containers: dict[str, dict[str, dict[str, float]]] | None = None
    wanted: dict[str, dict[str, float]] | None = None


def decide_update(spec: VPASpec, recs: tuple[ContainerRecommendation, ...], requests: Resources,
                  limits: Resources, applied: Mapping[str, Mapping[str, float]] | None) -> UpdateDecision:
    mode = spec.update_mode
    if not recs:
        return UpdateDecision("NoData", "no usage of this workload's containers has been seen yet")
    if mode in ("Off", "Initial"):
        why = "recommendation only" if mode == "Off" else "applied by admission when pods are created"
        return UpdateDecision("RecommendOnly", f"updateMode {mode}: {why}")
    outside = [
        f"{r.container_name} {res} request {have:g} outside [{r.lower_bound[res]:g}, {r.upper_bound[res]:g}]"
        for r in recs for res, have in sorted(requests.get(r.container_name, {}).items())
        if res in r.target and not r.lower_bound[res] <= have <= r.upper_bound[res]
    ]
    if not outside:
        return UpdateDecision("WithinBounds", "every running container's requests lie within the recommended bounds")
    wanted = {r.container_name: dict(r.target) for r in recs}
    if wanted == applied:
        return UpdateDecision("Update", "; ".join(outside) + " (target already handed to the backend)")
    containers: dict[str, dict[str, dict[str, float]]] = {}
    for r in recs:
        entry: dict[str, dict[str, float]] = {"requests": dict(r.target)}
        old_req, old_lim = requests.get(r.container_name, {}), limits.get(r.container_name, {})
        if spec.policy_for(r.container_name).controlled_values == "RequestsAndLimits":
            entry["limits"] = {res: old_lim[res] * v / old_req[res] for res, v in r.target.items()
                               if old_req.get(res) and res in old_lim}
        containers[r.container_name] = entry
    return UpdateDecision("Update", "; ".join(outside), containers, wanted)
