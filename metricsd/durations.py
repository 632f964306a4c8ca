"""Durations as people type them (``30s``, ``1m``, ``1h30m``, ``500ms``, ``7d``) into milliseconds."""

from __future__ import annotations

import re

_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_PART = re.compile(r"(\d+)(ms|s|m|h|d|w)")


def parse_duration_ms(text: str) -> int:
    """Raise ValueError with the offending text for anything that is not a positive duration."""
    s = text.strip()
    if s.isdigit():
        return int(s) * 1000  # a bare number means seconds, as in PromQL
    pos, total = 0, 0
    for m in _PART.finditer(s):
        if m.start() != pos:
            break
        total += int(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s) or not s:
        raise ValueError(f"bad duration {text!r}: use e.g. 30s, 1m, 1h30m, 500ms")
    return total


def format_duration_ms(ms: int) -> str:
    """The inverse of parse_duration_ms, largest units first: 600000 -> "10m", 5400000 -> "1h30m"."""
    if ms <= 0:
        return "0s"
    out = []
    for unit in ("d", "h", "m", "s", "ms"):
        n, ms = divmod(ms, _UNITS[unit])
        if n:
            out.append(f"{n}{unit}")
    return "".join(out)
