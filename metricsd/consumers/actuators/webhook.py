"""The webhook backend: every decision is POSTed as JSON to one URL, with a timeout and retries.

A receiver (a chat bot, a deploy pipeline, a custom scaler) gets
`{"kind": "hpa.scale" | "hpa.alert" | "vpa.update" | "vpa.recommendation" | "overcommit.advice" |
"colocation.node" | "colocation.notice" | "colocation.alert", "target": {...}, "decision": {...}}`.
Connection errors, timeouts, 429 and 5xx are retried with exponential backoff; other 4xx mean the
receiver rejects the payload and are not retried.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

from metricsd.consumers.actuators.base import ActuatorError, NodeChange, ResourceUpdate, ScaleRequest, WorkloadRef
from metricsd.consumers.history import jsonable

__all__ = ["WebhookActuator", "WebhookSettings"]

log = logging.getLogger("metricsd.consumers.webhook")


@dataclass(frozen=True)
class WebhookSettings:
    url: str
    timeout_s: float = 5.0
    retries: int = 3
    backoff_s: float = 0.5
    headers: Mapping[str, str] | None = None


class WebhookActuator:
    """Not safe to share across event loops: it holds one aiohttp session."""

    name = "webhook"
    dry_run = False

    def __init__(self, settings: WebhookSettings,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        if settings.retries < 0 or settings.timeout_s <= 0:
            raise ValueError("webhook retries must be >= 0 and timeout_s > 0")
        self.settings = settings
        self._sleep = sleep
        self._session: aiohttp.ClientSession | None = None
        self.sent = 0
        self.failed = 0

    async def get_scale(self, target: WorkloadRef) -> int | None:
        return None

    async def scale(self, request: ScaleRequest) -> None:
        await self.post("hpa.scale", request.decision, request.target,
                        {"currentReplicas": request.current_replicas, "desiredReplicas": request.desired_replicas})

    async def update_resources(self, update: ResourceUpdate) -> None:
        await self.post("vpa.update", update.decision, update.target,
                        {"updateMode": update.update_mode, "containers": update.containers})

    async def set_node(self, change: NodeChange) -> None:
        await self.post("colocation.node", change.decision, action={
            "node": change.node, "pool": change.pool, "from": change.src, "to": change.dst, "reason": change.reason,
            "deadlineMs": change.deadline_ms, "evictOnline": change.evict_online,
            "evictOffline": change.evict_offline})

    async def publish(self, kind: str, payload: Mapping[str, Any]) -> None:
        await self.post(kind, payload)

    async def post(self, kind: str, decision: Mapping[str, Any], target: WorkloadRef | None = None,
                   action: Mapping[str, Any] | None = None) -> None:
        """POST one document; raises ActuatorError once the retries are spent or on a 4xx."""
        body: dict[str, Any] = {"kind": kind, "decision": decision}
        if target is not None:
            body["target"] = asdict(target)
        if action is not None:
            body["action"] = action
        data = json.dumps(jsonable(body), allow_nan=False).encode()
        headers = {"Content-Type": "application/json", **(self.settings.headers or {})}
        session = self._session_now()
        last = ""
        for attempt in range(self.settings.retries + 1):
            if attempt:
                await self._sleep(self.settings.backoff_s * 2 ** (attempt - 1))
            try:
                async with session.post(self.settings.url, data=data, headers=headers) as resp:
                    if resp.status < 300:
                        self.sent += 1
                        return
                    text = (await resp.text())[:200]
                    last = f"HTTP {resp.status}: {text}"
                    if resp.status < 500 and resp.status != 429:
                        break
            except (aiohttp.ClientError, TimeoutError) as e:
                last = f"{type(e).__name__}: {e}"
            log.debug("webhook %s attempt %d failed: %s", self.settings.url, attempt + 1, last)
        self.failed += 1
        raise ActuatorError(f"webhook POST {kind} to {self.settings.url} failed: {last}")

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.settings.timeout_s))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
