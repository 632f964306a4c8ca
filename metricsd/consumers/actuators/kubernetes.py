"""The Kubernetes backend: the API server over HTTPS with a service-account token, via plain aiohttp.

- HPA: GET and PATCH the target's `scale` subresource (a JSON merge patch of spec.replicas).
  Before a scale-down, pods of the target that run on nodes of the colocation pool (nodes matching
  `colocation_node_selector`) get a lower `controller.kubernetes.io/pod-deletion-cost`, so the
  ReplicaSet removes them first and the pool is freed for offline work.
- VPA in Auto or Recreate mode: a strategic merge patch of the pod template's container resources
  (merged by container name, so containers not named are kept); the rollout recreates the pods.
  Off and Initial change nothing here (Initial is applied at pod creation by an admission webhook).
- Colocation: a node's lending state as a label and taints, its pods annotated or evicted
  (`kubenodes`).
- Alerts and advice are logged: the API has no object for them.

The token is read from its file on every request, because projected service-account tokens rotate.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from metricsd.consumers.actuators.base import ActuatorError, NodeChange, ResourceUpdate, ScaleRequest, WorkloadRef
from metricsd.consumers.actuators.kubenodes import apply_node_change
from metricsd.consumers.quantity import format_cpu, format_memory

__all__ = ["DELETION_COST", "KubernetesActuator", "KubernetesSettings"]

log = logging.getLogger("metricsd.consumers.kubernetes")

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
_SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class KubernetesSettings:
    """api_url: e.g. https://kubernetes.default.svc; ca_file None means the system's CAs."""

    api_url: str
    token_file: Path | None = _SA_DIR / "token"
    ca_file: Path | None = _SA_DIR / "ca.crt"
    timeout_s: float = 10.0
    colocation_node_selector: str = "metricsd.io/colocation-pool=true"
    colocation_deletion_cost: int = -1000

    @classmethod
    def in_cluster(cls) -> KubernetesSettings:
        """From the environment every pod gets: KUBERNETES_SERVICE_HOST / _PORT and the mounted account."""
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise ActuatorError("not running in a cluster: KUBERNETES_SERVICE_HOST is not set; pass --kube-api")
        host = f"[{host}]" if ":" in host else host
        return cls(api_url=f"https://{host}:{port}")


def _collection(ref: WorkloadRef) -> str:
    """/apis/apps/v1/namespaces/ns/deployments for apps/v1 Deployment; /api/v1/... for the core group."""
    prefix = "/api/v1" if ref.api_version == "v1" else f"/apis/{ref.api_version}"
    return f"{prefix}/namespaces/{quote(ref.namespace)}/{ref.kind.lower()}s"


def _selector(match_labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


class KubernetesActuator:
    """Not safe to share across event loops: it holds one aiohttp session."""

    name = "kubernetes"
    dry_run = False

    def __init__(self, settings: KubernetesSettings) -> None:
        self.settings = settings
        self._session: aiohttp.ClientSession | None = None
        self._ssl: ssl.SSLContext | None = None
        if settings.api_url.startswith("https://"):
            cafile = str(settings.ca_file) if settings.ca_file is not None else None
            self._ssl = ssl.create_default_context(cafile=cafile)

    async def get_scale(self, target: WorkloadRef) -> int | None:
        doc = await self._call("GET", f"{_collection(target)}/{quote(target.name)}/scale")
        return int(doc.get("spec", {}).get("replicas", 0))

    async def scale(self, request: ScaleRequest) -> None:
        target = request.target
        if request.desired_replicas < request.current_replicas:
            try:
                await self.mark_colocated(target, request.current_replicas - request.desired_replicas)
            except ActuatorError as e:  # the scale-down matters more than which pods it removes
                log.warning("could not mark colocated pods of %s before scaling down: %s", target, e)
        await self._call("PATCH", f"{_collection(target)}/{quote(target.name)}/scale",
                         {"spec": {"replicas": request.desired_replicas}}, MERGE_PATCH)

    async def mark_colocated(self, target: WorkloadRef, count: int) -> list[str]:
        """Give up to `count` of the target's pods on colocation-pool nodes the lower deletion cost.

        Returns the pods annotated, by name order; none when the pool is empty or holds none of them.
        """
        nodes_doc = await self._call("GET", "/api/v1/nodes",
                                     params={"labelSelector": self.settings.colocation_node_selector})
        pool = {n["metadata"]["name"] for n in nodes_doc.get("items", [])}
        if not pool or count <= 0:
            return []
        workload = await self._call("GET", f"{_collection(target)}/{quote(target.name)}")
        match = workload.get("spec", {}).get("selector", {}).get("matchLabels") or {}
        if not match:
            raise ActuatorError(f"{target} has no spec.selector.matchLabels to find its pods by")
        pods_doc = await self._call("GET", f"/api/v1/namespaces/{quote(target.namespace)}/pods",
                                    params={"labelSelector": _selector(match)})
        on_pool = sorted(p["metadata"]["name"] for p in pods_doc.get("items", [])
                         if p.get("spec", {}).get("nodeName") in pool
                         and not p["metadata"].get("deletionTimestamp"))
        chosen = on_pool[:count]
        cost = str(self.settings.colocation_deletion_cost)
        for pod in chosen:
            await self._call("PATCH", f"/api/v1/namespaces/{quote(target.namespace)}/pods/{quote(pod)}",
                             {"metadata": {"annotations": {DELETION_COST: cost}}}, MERGE_PATCH)
        return chosen

    async def update_resources(self, update: ResourceUpdate) -> None:
        if update.update_mode not in ("Auto", "Recreate"):
            log.info("%s is in %s mode: not patching its pod template", update.target, update.update_mode)
            return
        containers = []
        for name, kinds in sorted(update.containers.items()):
            resources = {kind: {res: format_cpu(v) if res == "cpu" else format_memory(v)
                                for res, v in sorted(amounts.items())}
                         for kind, amounts in sorted(kinds.items()) if amounts}
            containers.append({"name": name, "resources": resources})
        body = {"spec": {"template": {"spec": {"containers": containers}}}}
        await self._call("PATCH", f"{_collection(update.target)}/{quote(update.target.name)}", body,
                         STRATEGIC_MERGE_PATCH)

    async def set_node(self, change: NodeChange) -> None:
        await apply_node_change(self._call, change, self.settings.colocation_deletion_cost)

    async def publish(self, kind: str, payload: Mapping[str, Any]) -> None:
        level = logging.WARNING if kind.endswith("alert") else logging.INFO
        log.log(level, "%s: %s", kind, payload.get("message", ""))

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.settings.token_file is not None:
            try:
                token = self.settings.token_file.read_text().strip()
            except OSError as e:
                raise ActuatorError(f"cannot read the service-account token: {e}") from e
            headers["Authorization"] = f"Bearer {token}"
        return headers

    async def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None,
                    content_type: str | None = None, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        headers = self._headers()
        if content_type is not None:
            headers["Content-Type"] = content_type
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.settings.timeout_s))
        url = self.settings.api_url.rstrip("/") + path
        data = None if body is None else json.dumps(body).encode()
        try:
            async with self._session.request(method, url, data=data, headers=headers, params=params,
                                             ssl=self._ssl if self._ssl is not None else True) as resp:
                text = await resp.text()
                if resp.status >= 300:
                    raise ActuatorError(f"{method} {path}: HTTP {resp.status}: {_status_message(text)}")
                doc = json.loads(text) if text else {}
                return doc if isinstance(doc, dict) else {}
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise ActuatorError(f"{method} {path}: {type(e).__name__}: {e}") from e

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _status_message(text: str) -> str:
    """The `message` of a metav1.Status error body, else the start of the text."""
    try:
        doc = json.loads(text)
    except ValueError:
        return text[:200]
    return str(doc.get("message", text[:200])) if isinstance(doc, dict) else text[:200]
