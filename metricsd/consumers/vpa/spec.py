"""The VerticalPodAutoscaler spec (autoscaling.k8s.io/v1) as frozen data, read from YAML.

Only the fields the recommender and its updater act on: targetRef, updatePolicy.updateMode and
resourcePolicy.containerPolicies (containerName, mode, minAllowed, maxAllowed,
controlledResources, controlledValues). Every error names its field path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from metricsd.consumers.specfields import Node, SpecError, load_documents

__all__ = ["ContainerPolicy", "TargetRef", "VPASpec", "load_vpa_yaml", "parse_vpa"]

UpdateMode = Literal["Off", "Initial", "Recreate", "Auto", "InPlaceOrRecreate"]
RESOURCES = ("cpu", "memory")
_MODES = ("Off", "Initial", "Recreate", "Auto", "InPlaceOrRecreate")


@dataclass(frozen=True)
class TargetRef:
    kind: str
    name: str
    api_version: str = "apps/v1"


@dataclass(frozen=True)
class ContainerPolicy:
    """Policy for one container; container_name "*" is the default for containers not named."""

    container_name: str = "*"
    mode: Literal["Auto", "Off"] = "Auto"
    min_allowed: Mapping[str, float] = field(default_factory=dict)
    max_allowed: Mapping[str, float] = field(default_factory=dict)
    controlled_resources: tuple[str, ...] = RESOURCES
    controlled_values: Literal["RequestsAndLimits", "RequestsOnly"] = "RequestsAndLimits"


@dataclass(frozen=True)
class VPASpec:
    name: str
    namespace: str
    target_ref: TargetRef
    update_mode: UpdateMode = "Auto"
    container_policies: tuple[ContainerPolicy, ...] = ()
    min_replicas: int | None = None

    def policy_for(self, container: str) -> ContainerPolicy:
        """GetContainerResourcePolicy: the container's own policy, else the "*" one, else the default."""
        default = ContainerPolicy()
        for policy in self.container_policies:
            if policy.container_name == container:
                return policy
            if policy.container_name == "*":
                default = policy
        return default


def load_vpa_yaml(text: str) -> list[VPASpec]:
    """Every VerticalPodAutoscaler document of a (multi-document) YAML text; other kinds are skipped."""
    return load_documents(text, "VerticalPodAutoscaler", parse_vpa)



def parse_vpa(doc: dict[str, Any]) -> VPASpec:
    """Build a VPASpec from one decoded VerticalPodAutoscaler object. Raises SpecError."""
    root = Node(doc, "")
    version = root.string("apiVersion", "autoscaling.k8s.io/v1")
    if version != "autoscaling.k8s.io/v1":
        raise SpecError("apiVersion", f"must be autoscaling.k8s.io/v1, got {version!r}")
    meta = root.need("metadata")
    spec = root.need("spec")
    spec.reject_unknown(("targetRef", "updatePolicy", "resourcePolicy", "recommenders"))
    ref = spec.need("targetRef")
    target = TargetRef(ref.string("kind"), ref.string("name"), ref.string("apiVersion", "apps/v1"))
    update = spec.child("updatePolicy")
    mode = "Auto"
    min_replicas = None
    if update is not None:
        mode = update.string("updateMode", "Auto", choices=_MODES)
        min_replicas = update.optional_integer("minReplicas", minimum=1)
    policies: list[ContainerPolicy] = []
    rp = spec.child("resourcePolicy")
    if rp is not None:
        seen: set[str] = set()
        for node in rp.items("containerPolicies"):
            policy = _policy(node)
            if policy.container_name in seen:
                raise SpecError(node.at("containerName"), f"duplicate policy for {policy.container_name!r}")
            seen.add(policy.container_name)
            policies.append(policy)
    return VPASpec(meta.string("name"), meta.string("namespace", "default"), target, mode,  # type: ignore[arg-type]
                   tuple(policies), min_replicas)


def _policy(node: Node) -> ContainerPolicy:
    node.reject_unknown(("containerName", "mode", "minAllowed", "maxAllowed", "controlledResources",
                         "controlledValues"))
    lo = _resources(node.child("minAllowed"))
    hi = _resources(node.child("maxAllowed"))
    for name in RESOURCES:
        if name in lo and name in hi and hi[name] < lo[name]:
            raise SpecError(node.at(f"maxAllowed.{name}"), f"must be >= minAllowed.{name}")
    controlled = node.strings("controlledResources", choices=RESOURCES)
    return ContainerPolicy(
        container_name=node.string("containerName", "*"),
        mode=node.string("mode", "Auto", choices=("Auto", "Off")),  # type: ignore[arg-type]
        min_allowed=lo,
        max_allowed=hi,
        controlled_resources=RESOURCES if controlled is None else controlled,
        controlled_values=node.string(  # type: ignore[arg-type]
            "controlledValues", "RequestsAndLimits", choices=("RequestsAndLimits", "RequestsOnly")
        ),
    )


def _resources(node: Node | None) -> dict[str, float]:
    if node is None:
        return {}
    node.reject_unknown(RESOURCES)
    return {name: node.number(name, minimum=0.0) for name in RESOURCES if node.has(name)}
