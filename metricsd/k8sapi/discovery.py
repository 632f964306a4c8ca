"""Discovery documents and error objects, in the shapes the API server's aggregator and every
client (kubectl, client-go's discovery, the HPA's REST mappers) read: ``APIGroupList`` at
``/apis``, ``APIGroup`` at ``/apis/<group>``, ``APIResourceList`` at ``/apis/<group>/<version>``,
and ``Status`` for every error."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["CUSTOM", "EXTERNAL", "GROUPS", "METRICS", "ApiGroup", "ResourceEntry", "api_group", "api_group_list",
           "resource_list", "status"]


@dataclass(frozen=True)
class ApiGroup:
    name: str
    version: str

    @property
    def group_version(self) -> str:
        return f"{self.name}/{self.version}"


METRICS = ApiGroup("metrics.k8s.io", "v1beta1")
CUSTOM = ApiGroup("custom.metrics.k8s.io", "v1beta2")
EXTERNAL = ApiGroup("external.metrics.k8s.io", "v1beta1")
GROUPS = (METRICS, CUSTOM, EXTERNAL)


@dataclass(frozen=True)
class ResourceEntry:
    """One entry of an APIResourceList (name is ``pods``, or ``pods/<metric>`` for custom metrics)."""

    name: str
    namespaced: bool
    kind: str
    verbs: tuple[str, ...]


def _version(g: ApiGroup) -> dict[str, str]:
    return {"groupVersion": g.group_version, "version": g.version}


def api_group(g: ApiGroup) -> dict[str, Any]:
    return {"kind": "APIGroup", "apiVersion": "v1", "name": g.name, "versions": [_version(g)],
            "preferredVersion": _version(g)}


def api_group_list(groups: Iterable[ApiGroup]) -> dict[str, Any]:
    return {"kind": "APIGroupList", "apiVersion": "v1",
            "groups": [{k: v for k, v in api_group(g).items() if k not in ("kind", "apiVersion")} for g in groups]}


def resource_list(g: ApiGroup, entries: Sequence[ResourceEntry]) -> dict[str, Any]:
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": g.group_version,
            "resources": [{"name": e.name, "singularName": "", "namespaced": e.namespaced, "kind": e.kind,
                           "verbs": list(e.verbs)} for e in entries]}


_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
            500: "InternalError", 503: "ServiceUnavailable"}


def status(code: int, message: str, details: dict[str, str] | None = None) -> dict[str, Any]:
    """A ``metav1.Status`` failure, as the API server relays it to kubectl."""
    out: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                           "message": message, "reason": _REASONS.get(code, "Unknown"), "code": code}
    if details:
        out["details"] = details
    return out
