"""All the consumers together, as `metricsd up` runs them on its simulated cluster.

`start_consumers` reads hpa.yaml, vpa.yaml, overcommit.yaml and colocation.yaml from a directory
(any may be missing; the colocation plan takes the HPAs' schedules for its replica curves) and
builds the controllers on one backend and clock; `ConsumerSet.start()` runs each on its own
period, the first sync at once, so decisions appear within seconds of start. Unless told not to,
each sync's decisions are then written back as series (publish.py), so dashboards can draw them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from metricsd.clock import Clock
from metricsd.consumers.actuators.base import Actuator, LogActuator
from metricsd.consumers.colocation.controller import ColocationController
from metricsd.consumers.colocation.spec import load_colocation_yaml
from metricsd.consumers.hpa.controller import HPAController
from metricsd.consumers.hpa.parse import load_hpa_yaml
from metricsd.consumers.loop import Periodic
from metricsd.consumers.overcommit.config import load_overcommit_yaml
from metricsd.consumers.overcommit.controller import OvercommitController
from metricsd.consumers.publish import DecisionPublisher, Publishing
from metricsd.consumers.vpa.checkpoint import CheckpointStore, FileCheckpointStore, MemoryCheckpointStore
from metricsd.consumers.vpa.controller import VPAController
from metricsd.consumers.vpa.spec import load_vpa_yaml
from metricsd.rpc.backend import MetricsBackend

__all__ = ["ConsumerSet", "start_consumers"]


@dataclass
class ConsumerSet:
    """The controllers (None when their file is absent) and the tasks that run them."""

    hpa: HPAController | None
    vpa: VPAController | None
    overcommit: OvercommitController | None
    actuator: Actuator
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    colocation: ColocationController | None = None
    publisher: DecisionPublisher | None = None
    _loops: list[Periodic] = field(default_factory=list)

    def controllers(self) -> dict[str, HPAController | VPAController | OvercommitController | ColocationController]:
        found = {"hpa": self.hpa, "vpa": self.vpa, "overcommit": self.overcommit, "colocation": self.colocation}
        return {k: v for k, v in found.items() if v is not None}

    async def start(self) -> None:
        """Start a loop per controller (the VPA loads its checkpoint on its first sync)."""
        if self._loops:
            return
        for controller in self.controllers().values():
            loop = Periodic(controller if self.publisher is None else Publishing(controller, self.publisher),
                            self.sleep)
            loop.start()
            self._loops.append(loop)

    async def stop(self) -> None:
        """Stop the loops, save the VPA checkpoint, close the backend."""
        for loop in self._loops:
            await loop.stop()
        self._loops.clear()
        if self.vpa is not None:
            await self.vpa.save()
        await self.actuator.close()

    def document(self, kind: str) -> dict[str, Any]:
        """What /api/v1/metricsd/<kind> serves: {"status": ..., "history": [...], "publishing": ...}.
        Raises KeyError."""
        controller = self.controllers()[kind]
        publishing = self.publisher.document(kind) if self.publisher is not None else {"enabled": False}
        return {"status": controller.status(), "history": controller.history(), "publishing": publishing}


def start_consumers(
    backend: MetricsBackend,
    clock: Clock,
    examples_dir: Path,
    actuator: Actuator | None = None,
    checkpoint_dir: Path | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    publish: bool = True,
    registry: CollectorRegistry | None = None,
) -> ConsumerSet:
    """Build the consumers from the specs in `examples_dir`; call `await .start()` to run them.

    The backend defaults to the dry-run log; the VPA checkpoint goes to
    `checkpoint_dir/vpa-checkpoint.json`, or stays in memory without a directory. With `publish`,
    decisions are written back to `backend` as series after each sync, counted in `registry`
    when given. Raises SpecError or yaml.YAMLError for a malformed file.
    """
    actuator = actuator or LogActuator()
    hpa = vpa = over = colo = None
    hpa_file, vpa_file, over_file, colo_file = (examples_dir / f for f in ("hpa.yaml", "vpa.yaml", "overcommit.yaml",
                                                                           "colocation.yaml"))
    hpa_specs = load_hpa_yaml(hpa_file.read_text()) if hpa_file.exists() else []
    if hpa_file.exists():
        hpa = HPAController(hpa_specs, backend, actuator, clock)
    if vpa_file.exists():
        store: CheckpointStore = (FileCheckpointStore(checkpoint_dir / "vpa-checkpoint.json")
                                  if checkpoint_dir is not None else MemoryCheckpointStore())
        vpa = VPAController(load_vpa_yaml(vpa_file.read_text()), backend, actuator, clock, store)
    if over_file.exists():
        configs = load_overcommit_yaml(over_file.read_text())
        if configs:
            over = OvercommitController(configs[0], backend, actuator, clock)
    if colo_file.exists():
        plans = load_colocation_yaml(colo_file.read_text())
        if plans:
            state = checkpoint_dir / "colocation-state.json" if checkpoint_dir is not None else None
            colo = ColocationController(plans[0], backend, actuator, clock, hpas=hpa_specs, state_file=state)
    publisher = DecisionPublisher(backend, registry) if publish else None
    return ConsumerSet(hpa, vpa, over, actuator, sleep, colo, publisher)
