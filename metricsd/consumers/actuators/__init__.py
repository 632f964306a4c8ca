"""Backends that carry out (or only report) the consumers' decisions: log, webhook, kubernetes.

`base` holds the interface and the dry runs, `webhook` the HTTP POST backend, `kubernetes` the
API-server backend.
"""

from __future__ import annotations

from metricsd.consumers.actuators.base import (
    Actuator,
    ActuatorError,
    InMemoryScale,
    LogActuator,
    ResourceUpdate,
    ScaleRequest,
    WorkloadRef,
)
from metricsd.consumers.actuators.kubernetes import KubernetesActuator, KubernetesSettings
from metricsd.consumers.actuators.webhook import WebhookActuator, WebhookSettings

__all__ = [
    "Actuator",
    "ActuatorError",
    "InMemoryScale",
    "KubernetesActuator",
    "KubernetesSettings",
    "LogActuator",
    "ResourceUpdate",
    "ScaleRequest",
    "WebhookActuator",
    "WebhookSettings",
    "WorkloadRef",
]
