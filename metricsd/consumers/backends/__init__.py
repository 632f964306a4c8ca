"""Backends that carry out (or only report) the consumers' decisions: log, webhook, kubernetes.

`base` holds the interface and the dry runs, `webhook` the HTTP POST backend, `kubernetes` the
API-server backend.
"""

from __future__ import annotations

from metricsd.consumers.backends.base import (
    Actuator,
    ActuatorError,
    InMemoryScale,
    LogActuator,
    ResourceUpdate,
    ScaleRequest,
    WorkloadRef,
)
from metricsd.consumers.backends.kubernetes import KubernetesActuator, KubernetesSettings
from metricsd.consumers.backends.webhook import WebhookActuator, WebhookSettings

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
