"""Where the VPA recommender keeps its histograms between restarts, behind one small interface.

A checkpoint is one JSON document (`VPAController.checkpoint()`); a store only loads and saves
it whole. `FileCheckpointStore` writes it atomically (a temporary file renamed over the old one),
so a crash mid-write leaves the previous checkpoint. `EtcdCheckpointStore` keeps it in the
cluster's etcd (one key, written whole, so it is as atomic as a put), which is where a recommender
in a cluster keeps it: any replica of the recommender resumes the same history.
`MemoryCheckpointStore` keeps it in the process (tests, `metricsd up` without a data directory).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from metricsd.cluster.kv import KV

__all__ = ["CheckpointStore", "EtcdCheckpointStore", "FileCheckpointStore", "MemoryCheckpointStore"]


class CheckpointStore(Protocol):
    async def load(self) -> dict[str, Any] | None:
        """The last saved document, or None when there is none. Raises ValueError if it is unreadable."""
        ...

    async def save(self, doc: dict[str, Any]) -> None: ...


class MemoryCheckpointStore:
    def __init__(self) -> None:
        self.doc: str | None = None

    async def load(self) -> dict[str, Any] | None:
        return None if self.doc is None else json.loads(self.doc)

    async def save(self, doc: dict[str, Any]) -> None:
        self.doc = json.dumps(doc, allow_nan=False)


class FileCheckpointStore:
    """A JSON file. Not safe for two processes writing the same path."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def load(self) -> dict[str, Any] | None:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise ValueError(f"{self.path}: a checkpoint must be a JSON object")
        return doc

    async def save(self, doc: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump(doc, f, allow_nan=False, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


class EtcdCheckpointStore:
    """One etcd key holding the JSON document (``<root>/<cluster>/checkpoints/vpa`` by default).

    A VPA's histograms for a few thousand containers are a few hundred KiB, well under etcd's
    1.5 MiB value limit; save() raises ValueError rather than have etcd refuse a larger one.
    """

    MAX_BYTES = 1_400_000

    def __init__(self, kv: KV, key: str) -> None:
        self.kv = kv
        self.key = key

    async def load(self) -> dict[str, Any] | None:
        got = await self.kv.get(self.key)
        if got is None:
            return None
        doc = json.loads(got.value)
        if not isinstance(doc, dict):
            raise ValueError(f"etcd key {self.key}: a checkpoint must be a JSON object")
        return doc

    async def save(self, doc: dict[str, Any]) -> None:
        data = json.dumps(doc, allow_nan=False, separators=(",", ":")).encode()
        if len(data) > self.MAX_BYTES:
            raise ValueError(f"VPA checkpoint of {len(data)} bytes exceeds etcd's value limit; "
                             "use --checkpoint FILE instead")
        await self.kv.put(self.key, data)
