"""What the dashboard tests need of Grafana: deploy/grafana/*.json loaded, the `label_values()`
variable queries read, and the variables and interval macros substituted as Grafana does before it
sends a query (single values, no regex escaping needed: the tests pick label values that are
plain names)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

DASHBOARDS = Path(__file__).resolve().parents[1] / "deploy" / "grafana"
# Grafana with the data source's scrape interval at 15 s over a 1-hour range: the interval is the
# scrape interval, and $__rate_interval = max($__interval + scrape interval, 4 x scrape interval).
MACROS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "3600s", "${__range}": "3600s"}
STEP_S = 15
_LABEL_VALUES = re.compile(
    r"^\s*label_values\(\s*(?:(?P<selector>.+?)\s*,\s*)?(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$")


def load() -> dict[str, dict[str, Any]]:
    """file name -> dashboard model, every deploy/grafana/*.json."""
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def panels(board: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    for panel in board.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def query_variables(board: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The `query` template variables in dashboard order (each may refer to those before it)."""
    return [v for v in board["templating"]["list"] if v["type"] == "query"]


def variable_query(var: Mapping[str, Any]) -> str:
    q = var["query"]
    return str(q["query"] if isinstance(q, Mapping) else q)


def label_values(query: str) -> tuple[str | None, str]:
    """`label_values(selector, label)` -> (selector or None, label). Raises ValueError otherwise."""
    m = _LABEL_VALUES.match(query)
    if m is None:
        raise ValueError(f"not a label_values() query: {query!r}")
    return m.group("selector"), m.group("label")


def substitute(text: str, values: Mapping[str, str]) -> str:
    """Grafana's interpolation: the macros, then `$name` / `${name}` of the template variables."""
    for macro, value in MACROS.items():
        text = text.replace(macro, value)
    for name, value in sorted(values.items(), key=lambda kv: -len(kv[0])):
        text = text.replace("${" + name + "}", value).replace("$" + name, value)
    return text
