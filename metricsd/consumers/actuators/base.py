"""How a consumer acts: the small interface every backend implements, and the dry-run backends.

A controller decides; a backend carries the decision out (or only reports it). `log` is the
default dry run; `InMemoryScale` is a dry run that also remembers the replica counts it was told
to set, so a simulated cluster can apply them. Backends raise ActuatorError when an action failed;
the controller records the error in the decision and keeps running.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Actuator", "ActuatorError", "InMemoryScale", "LogActuator", "NodeChange", "ResourceUpdate",
           "ScaleRequest", "WorkloadRef"]


class ActuatorError(RuntimeError):
    """An action was not carried out; the message says which and why."""


@dataclass(frozen=True)
class WorkloadRef:
    """The object a consumer acts on (an HPA's scaleTargetRef, a VPA's targetRef) and its namespace."""

    namespace: str
    kind: str
    name: str
    api_version: str = "apps/v1"

    def __str__(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"


@dataclass(frozen=True)
class ScaleRequest:
    target: WorkloadRef
    current_replicas: int
    desired_replicas: int
    decision: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ResourceUpdate:
    """New pod-template resources: container -> {"requests"|"limits" -> {resource -> amount}}.

    Amounts are in base units (cores, bytes). `update_mode` is the VPA's updatePolicy.updateMode.
    """

    target: WorkloadRef
    update_mode: str
    containers: Mapping[str, Mapping[str, Mapping[str, float]]]
    decision: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeChange:
    """A node's move in the colocation plan, with the Kubernetes names its state is marked by.

    src / dst are the machine's phases (Online, OnlineToOffline, Offline, OfflineToOnline).
    evict_online: evict the online pods of a node being lent (drain: evict); evict_offline: evict
    the offline pods of a node whose notice ran out (ReturnTimeout).
    """

    node: str
    pool: str
    src: str
    dst: str
    reason: str
    deadline_ms: int | None
    state_label: str
    lent_taint: str
    return_taint: str
    evict_online: bool = False
    evict_offline: bool = False
    decision: Mapping[str, Any] = field(default_factory=dict)


class Actuator(Protocol):
    """What the controllers need from a backend. Methods may raise ActuatorError.

    dry_run: nothing changes when this backend scales, so the HPA does not count its actions
    against the behaviour policies' rate limits.
    """

    name: str
    dry_run: bool

    async def get_scale(self, target: WorkloadRef) -> int | None:
        """The target's replica count as its owner sees it, or None when this backend cannot tell
        (the controller then counts the pods that report metrics)."""
        ...

    async def scale(self, request: ScaleRequest) -> None: ...

    async def update_resources(self, update: ResourceUpdate) -> None: ...

    async def set_node(self, change: NodeChange) -> None:
        """Mark a node for its new colocation state (labels, taints; evictions when asked)."""
        ...

    async def publish(self, kind: str, payload: Mapping[str, Any]) -> None:
        """Report something that changes nothing: an alert, a recommendation, an advice table."""
        ...

    async def close(self) -> None: ...


class LogActuator:
    """The dry run: every action becomes one log line; nothing changes anywhere."""

    name = "log"
    dry_run = True

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.log = logger or logging.getLogger("metricsd.consumers")

    async def get_scale(self, target: WorkloadRef) -> int | None:
        return None

    async def scale(self, request: ScaleRequest) -> None:
        why = request.decision.get("why")
        self.log.info("dry run: would scale %s from %d to %d replicas%s", request.target, request.current_replicas,
                      request.desired_replicas, f": {why}" if why else "")

    async def update_resources(self, update: ResourceUpdate) -> None:
        self.log.info("dry run: would set resources of %s (%s): %s", update.target, update.update_mode,
                      dict(update.containers))

    async def set_node(self, change: NodeChange) -> None:
        self.log.info("dry run: would mark node %s %s (%s, from %s)", change.node, change.dst, change.reason,
                      change.src)

    async def publish(self, kind: str, payload: Mapping[str, Any]) -> None:
        level = logging.WARNING if kind.endswith("alert") else logging.INFO
        self.log.log(level, "%s: %s", kind, payload.get("message", ""))

    async def close(self) -> None:
        return None


class InMemoryScale(LogActuator):
    """A dry run that keeps the replica counts it set, as a Deployment's scale subresource would.

    The simulated day applies HPA decisions through it: `replicas` is what the cluster runs.
    """

    name = "memory"
    dry_run = False

    def __init__(self, initial: Mapping[WorkloadRef, int] | None = None, logger: logging.Logger | None = None) -> None:
        super().__init__(logger)
        self.replicas: dict[WorkloadRef, int] = dict(initial or {})
        self.resources: dict[WorkloadRef, ResourceUpdate] = {}
        self.published: deque[tuple[str, Mapping[str, Any]]] = deque(maxlen=1000)
        self.nodes: dict[str, NodeChange] = {}

    async def get_scale(self, target: WorkloadRef) -> int | None:
        return self.replicas.get(target)

    async def scale(self, request: ScaleRequest) -> None:
        self.replicas[request.target] = request.desired_replicas

    async def update_resources(self, update: ResourceUpdate) -> None:
        self.resources[update.target] = update

    async def set_node(self, change: NodeChange) -> None:
        self.nodes[change.node] = change

    async def publish(self, kind: str, payload: Mapping[str, Any]) -> None:
        self.published.append((kind, payload))
