"""Kubernetes label selectors (``labelSelector=app=web,tier in (a,b),!canary``) as label matchers.

The syntax is ``k8s.io/apimachinery/pkg/labels.Parse``'s: requirements separated by commas, each
``key``, ``!key``, ``key=v``, ``key==v``, ``key!=v``, ``key in (v1,v2)`` or ``key notin (v1,v2)``.
``>`` and ``<`` are refused: series labels are strings. A requirement becomes a matcher on the
series label of the same name, so its key must also be a Prometheus label name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from metricsd.selector import Matcher, MatchOp

__all__ = ["MAX_SELECTOR_LENGTH", "Requirement", "SelectorError", "parse_label_selector", "promql_matchers",
           "to_matchers"]

MAX_SELECTOR_LENGTH = 4096
MAX_REQUIREMENTS = 64
_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_TOKEN = re.compile(r"\s*(!=|==|=|!|\(|\)|,|<|>|[^\s!=(),<>]+)")
_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


class SelectorError(ValueError):
    """A selector that does not parse; the message quotes the part at fault (HTTP 400)."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: tuple[str, ...] = ()


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos:].strip():
                raise SelectorError(f"cannot parse {text[pos:]!r}")
            break
        out.append(m.group(1))
        pos = m.end()
    return out


def _check_value(v: str, text: str) -> str:
    if len(v) > 63 or not _VALUE.fullmatch(v):
        raise SelectorError(f"invalid label value {v!r} in {text!r}: at most 63 of [A-Za-z0-9_.-], "
                            f"starting and ending alphanumeric")
    return v


def parse_label_selector(text: str) -> list[Requirement]:
    """Raises SelectorError naming the part that does not parse."""
    if len(text) > MAX_SELECTOR_LENGTH:
        raise SelectorError(f"selector longer than {MAX_SELECTOR_LENGTH} characters")
    toks, i, out = _tokens(text), 0, []

    def take() -> str:
        nonlocal i
        if i >= len(toks):
            raise SelectorError(f"unexpected end of {text!r}")
        i += 1
        return toks[i - 1]

    def key_of(tok: str) -> str:
        if not _KEY.fullmatch(tok):
            raise SelectorError(f"expected a label key in {text!r}, found {tok!r}")
        return tok

    while i < len(toks):
        tok = take()
        if tok == "!":
            out.append(Requirement(key_of(take()), "!exists"))
        else:
            key = key_of(tok)
            nxt = toks[i] if i < len(toks) else ","
            if nxt == ",":
                out.append(Requirement(key, "exists"))
            elif nxt in ("=", "==", "!="):
                take()
                value = "" if i >= len(toks) or toks[i] == "," else take()
                out.append(Requirement(key, "!=" if nxt == "!=" else "=", (_check_value(value, text),)))
            elif nxt in ("in", "notin"):
                take()
                if take() != "(":
                    raise SelectorError(f"expected '(' after {key} {nxt} in {text!r}")
                values: list[str] = []
                while True:
                    v = take()
                    if v == ")" and not values:
                        break
                    values.append(_check_value(v, text))
                    sep = take()
                    if sep == ")":
                        break
                    if sep != ",":
                        raise SelectorError(f"expected ',' or ')' in the values of {key} in {text!r}")
                if not values:
                    raise SelectorError(f"{key} {nxt} (): at least one value is required")
                out.append(Requirement(key, nxt, tuple(values)))
            else:
                raise SelectorError(f"unknown operator {nxt!r} after {key!r} in {text!r} (=, ==, !=, in, notin; "
                                    f"series labels are strings, so no < or >)")
        if i < len(toks):
            if take() != ",":
                raise SelectorError(f"expected ',' between requirements in {text!r}")
            if i >= len(toks):
                raise SelectorError(f"trailing ',' in {text!r}")
        if len(out) > MAX_REQUIREMENTS:
            raise SelectorError(f"more than {MAX_REQUIREMENTS} requirements")
    return out


def _regex(values: tuple[str, ...]) -> str:
    return "|".join(v.replace(".", "\\.") for v in values)


def to_matchers(reqs: list[Requirement]) -> list[Matcher]:
    """Each requirement as a matcher on the series label of its key. Raises SelectorError for a key
    that cannot be a Prometheus label name."""
    out = []
    for r in reqs:
        if not _LABEL.fullmatch(r.key):
            raise SelectorError(f"label selector key {r.key!r} is not a series label name ([a-zA-Z_][a-zA-Z0-9_]*)")
        if r.op == "=":
            out.append(Matcher(MatchOp.EQ, r.key, r.values[0]))
        elif r.op == "!=":
            out.append(Matcher(MatchOp.NEQ, r.key, r.values[0]))
        elif r.op == "in":
            out.append(Matcher(MatchOp.RE, r.key, _regex(r.values)))
        elif r.op == "notin":
            out.append(Matcher(MatchOp.NRE, r.key, _regex(r.values)))
        elif r.op == "exists":
            out.append(Matcher(MatchOp.NEQ, r.key, ""))
        else:
            out.append(Matcher(MatchOp.EQ, r.key, ""))
    return out


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def promql_matchers(matchers: list[Matcher]) -> str:
    """``a="x",b=~"y|z"``: matchers as PromQL text, for a rule's ``<<.LabelMatchers>>``."""
    return ",".join(f"{m.name}{m.op.value}{_quote(m.value)}" for m in matchers)
