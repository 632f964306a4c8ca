"""A parser of Prometheus' PromQL test-script format (promql/promqltest/testdata/*.test).

The format is described in ../shared/peer/promql/README.md (sections 1-9). Native-histogram
values (``{{...}}``) are tokenised and reported as histograms but never decoded: metricsd stores
floats only. ``@st`` (start-timestamp) lines are skipped.
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass, field

from metricsd.model import METRIC_NAME, Labels

__all__ = [
    "HISTOGRAM",
    "ClearCmd",
    "EvalCmd",
    "ExpectedSeries",
    "LoadCmd",
    "ScriptError",
    "expand_values",
    "parse_duration",
    "parse_script",
    "parse_series_desc",
]

STALE = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]


class _Histogram:
    def __repr__(self) -> str:
        return "HISTOGRAM"


HISTOGRAM = _Histogram()  # placeholder for a native histogram value
Value = float | None | _Histogram  # None: omitted position


class ScriptError(ValueError):
    pass


_DUR_RE = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")
_DUR_UNITS = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1000, 1)


def parse_duration(text: str) -> int:
    """Prometheus ``model.ParseDuration`` in milliseconds."""
    if text == "0":
        return 0
    m = _DUR_RE.match(text)
    if not text or not m or not any(m.groups()):
        raise ScriptError(f"bad duration {text!r}")
    return sum(int(g) * u for g, u in zip(m.groups(), _DUR_UNITS, strict=True) if g)


_NUM = r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|(?i:inf|nan))"
_UNUM = r"(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|(?i:inf|nan))"
_SERIES_ITEM = re.compile(rf"^({_NUM})(?:([+-])({_UNUM}))?x(\d+)$")
_NUM_RE = re.compile(rf"^{_NUM}$")


def _tokens(text: str) -> list[str]:
    """Split on whitespace, keeping ``{{ ... }}`` (which contains spaces) inside one token."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i].isspace():
            i += 1
            continue
        j, depth = i, 0
        while j < n and (depth > 0 or not text[j].isspace()):
            if text.startswith("{{", j):
                depth += 1
                j += 2
                continue
            if text.startswith("}}", j) and depth > 0:
                depth -= 1
                j += 2
                continue
            j += 1
        out.append(text[i:j])
        i = j
    return out


def expand_values(text: str) -> list[Value]:
    """Expand a value sequence (README section 5)."""
    out: list[Value] = []
    for tok in _tokens(text):
        if tok.startswith("{{"):
            m = re.search(r"}}x(\d+)$", tok)
            out.extend([HISTOGRAM] * (int(m.group(1)) + 1 if m else 1))
            continue
        if tok == "_":
            out.append(None)
            continue
        if tok.startswith("_x"):
            out.extend([None] * int(tok[2:]))
            continue
        if tok == "stale":
            out.append(STALE)
            continue
        m = _SERIES_ITEM.match(tok)
        if m:
            start, sign, step_s, times = m.groups()
            v = float(start)
            step = float(step_s) if step_s else 0.0
            if sign == "-":
                step = -step
            out.append(v)
            for _ in range(int(times)):
                v = v + step
                out.append(v)
            continue
        if _NUM_RE.match(tok):
            out.append(float(tok))
            continue
        raise ScriptError(f"bad value item {tok!r}")
    return out


_GO_ESCAPES = {
    "n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "a": "\a", "b": "\b", "f": "\f", "v": "\v"
}


def _read_string(text: str, i: int) -> tuple[str, int]:
    q = text[i]
    i += 1
    buf: list[str] = []
    if q == "`":
        j = text.index("`", i)
        return text[i:j], j + 1
    while text[i] != q:
        c = text[i]
        if c == "\\":
            nxt = text[i + 1]
            if nxt in _GO_ESCAPES:
                buf.append(_GO_ESCAPES[nxt])
                i += 2
            elif nxt in "xuU":
                width = {"x": 2, "u": 4, "U": 8}[nxt]
                buf.append(chr(int(text[i + 2 : i + 2 + width], 16)))
                i += 2 + width
            else:
                buf.append(chr(int(text[i + 1 : i + 4], 8)))
                i += 4
            continue
        buf.append(c)
        i += 1
    return "".join(buf), i + 1


def parse_series_desc(text: str) -> tuple[Labels, str]:
    """Parse ``name{a="b"}`` at the start of ``text``; returns the labels and the rest."""
    s = text.strip()
    m = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", s)
    labels: dict[str, str] = {}
    i = 0
    if m:
        labels[METRIC_NAME] = m.group(0)
        i = m.end()
    if i < len(s) and s[i] == "{":
        i += 1
        while True:
            while s[i] in " \t,":
                i += 1
            if s[i] == "}":
                i += 1
                break
            if s[i] in "\"'`":
                name, i = _read_string(s, i)
            else:
                nm = re.match(r"[a-zA-Z_][a-zA-Z0-9_]*", s[i:])
                if not nm:
                    raise ScriptError(f"bad label name in {text!r}")
                name = nm.group(0)
                i += nm.end()
            while s[i] in " \t":
                i += 1
            if s[i] != "=":
                raise ScriptError(f"expected = in {text!r}")
            i += 1
            while s[i] in " \t":
                i += 1
            value, i = _read_string(s, i)
            labels[name] = value
    elif not m:
        raise ScriptError(f"bad series description {text!r}")
    return tuple(sorted(labels.items())), s[i:]


@dataclass
class LoadCmd:
    line: int
    step_ms: int
    series: dict[Labels, list[Value]]  # the last line wins for a repeated label set


@dataclass
class ClearCmd:
    line: int


@dataclass
class ExpectedSeries:
    labels: Labels
    values: list[Value]


@dataclass
class EvalCmd:
    line: int
    expr: str
    range: bool
    time_ms: int = 0
    start_ms: int = 0
    end_ms: int = 0
    step_ms: int = 0
    fail: bool = False
    fail_msg: str | None = None
    fail_regex: str | None = None
    ordered: bool = False
    annotations: list[tuple[str, str | None, str | None]] = field(default_factory=list)
    scalar: float | None = None
    series: list[ExpectedSeries] = field(default_factory=list)
    range_vector: tuple[int, int, int] | None = None
    string: str | None = None


Command = LoadCmd | ClearCmd | EvalCmd

_INSTANT_RE = re.compile(r"^eval(?:_(fail|warn|ordered|info))?\s+instant\s+(?:at\s+(\S+))?\s+(.+)$")
_RANGE_RE = re.compile(r"^eval(?:_(fail|warn|info))?\s+range\s+from\s+(.+)\s+to\s+(.+)\s+step\s+(.+?)\s+(.+)$")
_EXPECT_RE = re.compile(r"^expect\s+(ordered|fail|warn|no_warn|info|no_info)(?:\s+(regex|msg):(.+))?$")
_RANGE_VEC_RE = re.compile(r"^expect\s+range\s+vector\s+from\s+(\S+)\s+to\s+(\S+)\s+step\s+(\S+)$")
_STRING_RE = re.compile(r"^expect\s+string\s+(.+)$")


def _is_number(text: str) -> float | None:
    try:
        if re.fullmatch(r"[-+]?0[xX][0-9a-fA-F]+", text):
            return float(int(text, 16))
        return float(text) if re.fullmatch(rf"{_NUM}", text) else None
    except ValueError:
        return None


def _parse_eval(lineno: int, header: str, body: list[tuple[int, str]]) -> tuple[EvalCmd, int]:
    m = _INSTANT_RE.match(header)
    if m:
        legacy, at, expr = m.groups()
        cmd = EvalCmd(lineno, expr.strip(), False, time_ms=parse_duration(at or "0"))
    else:
        r = _RANGE_RE.match(header)
        if not r:
            raise ScriptError(f"line {lineno}: bad eval command {header!r}")
        legacy, start, end, step, expr = r.groups()
        cmd = EvalCmd(lineno, expr.strip(), True, start_ms=parse_duration(start.strip()),
                      end_ms=parse_duration(end.strip()), step_ms=parse_duration(step.strip()))
    if legacy == "fail":
        cmd.fail = True
    elif legacy == "ordered":
        cmd.ordered = True
    elif legacy in ("warn", "info"):
        cmd.annotations.append((legacy, None, None))
    used = 0
    for _, text in body:
        used += 1
        rv = _RANGE_VEC_RE.match(text)
        if rv:
            cmd.range_vector = (parse_duration(rv.group(1)), parse_duration(rv.group(2)), parse_duration(rv.group(3)))
            continue
        st = _STRING_RE.match(text)
        if st:
            raw = st.group(1).strip()
            cmd.string, _ = _read_string(raw, 0)
            continue
        if text.split()[0] == "expect":
            e = _EXPECT_RE.match(text)
            if not e:
                raise ScriptError(f"bad expect line {text!r}")
            kind, how, what = e.groups()
            what = what.strip() if what else None
            if kind == "fail":
                cmd.fail = True
                cmd.fail_msg = what if how == "msg" else None
                cmd.fail_regex = what if how == "regex" else None
            elif kind == "ordered":
                cmd.ordered = True
            else:
                cmd.annotations.append((kind, how, what))
            continue
        num = _is_number(text)
        if num is not None:
            cmd.scalar = num
            break
        labels, rest = parse_series_desc(text)
        values = expand_values(rest)
        cmd.series = [s for s in cmd.series if s.labels != labels]
        cmd.series.append(ExpectedSeries(labels, values))
    return cmd, used


def parse_script(text: str) -> list[Command]:
    lines = [ln.strip() for ln in text.split("\n")]
    lines = ["" if ln.startswith("#") else ln for ln in lines]
    cmds: list[Command] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line:
            i += 1
            continue
        word = line.split()[0].lower()
        block: list[tuple[int, str]] = []
        j = i + 1
        if word != "clear":
            while j < len(lines) and lines[j]:
                block.append((j + 1, lines[j]))
                j += 1
        if word == "clear":
            cmds.append(ClearCmd(i + 1))
            i += 1
        elif word.startswith("load"):
            m = re.match(r"^load(?:_(with_nhcb))?\s+(.+?)$", line)
            if not m:
                raise ScriptError(f"line {i + 1}: bad load command")
            load = LoadCmd(i + 1, parse_duration(m.group(2)), {})
            for _, text in block:
                first = text.split()[0]
                if first.endswith("@st"):
                    continue
                labels, rest = parse_series_desc(text)
                load.series[labels] = expand_values(rest)
            cmds.append(load)
            i = j
        elif word.startswith("eval"):
            cmd, used = _parse_eval(i + 1, line, block)
            cmds.append(cmd)
            i = i + 1 + used
        else:
            raise ScriptError(f"line {i + 1}: unknown command {line!r}")
    return cmds


def is_stale_value(v: Value) -> bool:
    return isinstance(v, float) and math.isnan(v) and struct.pack("<d", v) == struct.pack("<d", STALE)
