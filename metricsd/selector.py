"""Label matchers (=, !=, =~, !~), shared by the store's index, the proxy and the PromQL engine.

Semantics follow Prometheus: regular expressions are fully anchored and ``.`` matches a newline;
a missing label has the empty value, so ``{foo=""}`` matches series without ``foo`` and
``{foo!=""}`` matches series that have it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from metricsd.model import METRIC_NAME, Labels

__all__ = ["InvalidSelector", "MatchOp", "Matcher", "matches_all", "parse_selector"]


class InvalidSelector(ValueError):
    """A selector that cannot be parsed or compiled; the message says where."""


class MatchOp(Enum):
    EQ = "="
    NEQ = "!="
    RE = "=~"
    NRE = "!~"


@dataclass(frozen=True)
class Matcher:
    op: MatchOp
    name: str
    value: str
    _regex: re.Pattern[str] | None = field(default=None, compare=False, repr=False, hash=False)

    def __post_init__(self) -> None:
        if self.op in (MatchOp.RE, MatchOp.NRE):
            try:
                object.__setattr__(self, "_regex", re.compile(f"(?s:{self.value})"))
            except re.error as e:
                raise InvalidSelector(f"bad regular expression {self.value!r} for label {self.name}: {e}") from e

    @classmethod
    def eq(cls, name: str, value: str) -> Matcher:
        return cls(MatchOp.EQ, name, value)

    def matches(self, value: str) -> bool:
        """Whether a label value (``""`` when the label is absent) satisfies this matcher."""
        if self.op is MatchOp.EQ:
            return value == self.value
        if self.op is MatchOp.NEQ:
            return value != self.value
        assert self._regex is not None
        hit = self._regex.fullmatch(value) is not None
        return hit if self.op is MatchOp.RE else not hit

    def matches_empty(self) -> bool:
        """True when series lacking the label match too (so postings alone cannot answer)."""
        return self.matches("")

    def __str__(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"')
        return f'{self.name}{self.op.value}"{escaped}"'


def matches_all(matchers: Iterable[Matcher], labels: Labels) -> bool:
    d = dict(labels)
    return all(m.matches(d.get(m.name, "")) for m in matchers)


_SEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def parse_selector(text: str, metric: str | None = None) -> list[Matcher]:
    """Parse ``a="x",b=~"y.*"`` (braces optional) into matchers; ``metric`` adds a name matcher.

    The CLI and the native HTTP API take selectors in this small form; full PromQL goes through
    the PromQL engine's parser instead.
    """
    body = text.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    out: list[Matcher] = []
    if metric:
        out.append(Matcher(MatchOp.EQ, METRIC_NAME, metric))
    pos = 0
    while pos < len(body):
        if not body[pos:].strip():
            break
        m = _SEL_RE.match(body, pos)
        if not m:
            raise InvalidSelector(f"cannot parse selector {text!r} at position {pos}: expected name op \"value\"")
        name, op, raw = m.groups()
        value = bytes(raw, "utf-8").decode("unicode_escape") if "\\" in raw else raw
        out.append(Matcher(MatchOp(op), name, value))
        pos = m.end()
    return out


def selector_string(matchers: Sequence[Matcher]) -> str:
    return "{" + ",".join(str(m) for m in matchers) + "}"
