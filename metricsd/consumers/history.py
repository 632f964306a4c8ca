"""A bounded, JSON-ready record of what a consumer decided and why.

Every sync appends one entry (inputs, the rule that fired, the result); the HTTP API serves the
entries and `metricsd hpa status` prints them. Bounded so a controller that runs for weeks holds
a fixed amount of memory: the oldest entries fall off.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

__all__ = ["DecisionLog", "iso_time", "jsonable"]


def iso_time(ms: int) -> str:
    """RFC 3339 in UTC with seconds, as Kubernetes prints times."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def jsonable(value: object) -> Any:
    """A copy that json.dumps accepts in strict mode: NaN and infinities become None, tuples lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    return value


class DecisionLog:
    """The last `maxlen` decisions, oldest first. Not safe to share across threads."""

    def __init__(self, maxlen: int = 500) -> None:
        if maxlen < 1:
            raise ValueError(f"maxlen must be at least 1, got {maxlen}")
        self._entries: deque[dict[str, Any]] = deque(maxlen=maxlen)
        self.recorded = 0

    def record(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        """Append a decision (made JSON-safe) and return the stored copy."""
        clean: dict[str, Any] = jsonable(entry)
        self._entries.append(clean)
        self.recorded += 1
        return clean

    def entries(self, limit: int | None = None) -> list[dict[str, Any]]:
        items = list(self._entries)
        return items if limit is None else items[-limit:] if limit > 0 else []

    def last(self) -> dict[str, Any] | None:
        return self._entries[-1] if self._entries else None

    def __len__(self) -> int:
        return len(self._entries)
