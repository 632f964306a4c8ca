"""The overcommit advisor's settings, read from YAML (kind OvercommitAdvisor, our own object).

    apiVersion: metricsd.io/v1alpha1
    kind: OvercommitAdvisor
    metadata: {name: cluster}
    spec:
      namespaces: [default, social, video]   # empty or absent: every namespace
      buffer: 0.15                           # recommended request = weekly peak * (1 + buffer)
      windowDays: 7
      thresholds: {cpu: 0.60, memory: 0.65}  # Koordinator's reclaim thresholds
      tidalMargin: 0.10                      # share of capacity held back in the tidal table
      utcOffset: "+08:00"                    # hours of the tidal table are local to this offset
      intervalSeconds: 300
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from metricsd.consumers.overcommit.advisor import DEFAULT_THRESHOLDS
from metricsd.consumers.specfields import Node, SpecError, load_documents

__all__ = ["OvercommitConfig", "load_overcommit_yaml", "parse_overcommit"]


@dataclass(frozen=True)
class OvercommitConfig:
    name: str = "cluster"
    namespaces: tuple[str, ...] = ()
    buffer: float = 0.15
    window_days: int = 7
    thresholds: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_THRESHOLDS))
    tidal_margin: float = 0.10
    utc_offset_minutes: int = 0
    interval_s: float = 300.0


def load_overcommit_yaml(text: str) -> list[OvercommitConfig]:
    """Every OvercommitAdvisor document of a YAML text; other kinds are skipped. Raises SpecError."""
    return load_documents(text, "OvercommitAdvisor", parse_overcommit)



def parse_overcommit(doc: dict[str, Any]) -> OvercommitConfig:
    root = Node(doc, "")
    version = root.string("apiVersion", "metricsd.io/v1alpha1")
    if version != "metricsd.io/v1alpha1":
        raise SpecError("apiVersion", f"must be metricsd.io/v1alpha1, got {version!r}")
    meta = root.child("metadata")
    spec = root.child("spec") or Node({}, "spec")
    spec.reject_unknown(("namespaces", "buffer", "windowDays", "thresholds", "tidalMargin", "utcOffset",
                         "intervalSeconds"))
    thresholds = dict(DEFAULT_THRESHOLDS)
    tnode = spec.child("thresholds")
    if tnode is not None:
        tnode.reject_unknown(("cpu", "memory"))
        for res in ("cpu", "memory"):
            thresholds[res] = tnode.number(res, thresholds[res], minimum=0.0, maximum=1.0)
    return OvercommitConfig(
        name=meta.string("name", "cluster") if meta is not None else "cluster",
        namespaces=spec.strings("namespaces") or (),
        buffer=spec.number("buffer", 0.15, minimum=0.0),
        window_days=spec.integer("windowDays", 7, minimum=1, maximum=8),
        thresholds=thresholds,
        tidal_margin=spec.number("tidalMargin", 0.10, minimum=0.0, maximum=1.0),
        utc_offset_minutes=_offset(spec),
        interval_s=spec.number("intervalSeconds", 300.0, minimum=1.0),
    )


def _offset(node: Node) -> int:
    raw = node.value.get("utcOffset")
    if raw is None or raw == "Z":
        return 0
    if isinstance(raw, int) and not isinstance(raw, bool) and abs(raw) <= 14 * 60:
        return raw  # YAML 1.1 reads an unquoted +08:00 as 480 (base 60)
    text = str(raw)
    sign = -1 if text.startswith("-") else 1
    try:
        hours, minutes = text.lstrip("+-").split(":")
        value = int(hours) * 60 + int(minutes)
    except ValueError:
        raise SpecError(node.at("utcOffset"), f"must look like +08:00, got {raw!r}") from None
    if value > 14 * 60:
        raise SpecError(node.at("utcOffset"), f"must be within 14 hours, got {raw!r}")
    return sign * value
