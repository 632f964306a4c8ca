"""Where the VPA recommender keeps its histograms between restarts, behind one small interface.

A checkpoint is one JSON document (`VPAController.checkpoint()`); a store only loads and saves
it whole. `FileCheckpointStore` writes it atomically (a temporary file renamed over the old one),
so a crash mid-write leaves the previous checkpoint; an etcd-backed store can implement the same
two methods. `MemoryCheckpointStore` keeps it in the process (tests, `metricsd up` without a
data directory).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

__all__ = ["CheckpointStore", "FileCheckpointStore", "MemoryCheckpointStore"]


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
