"""Prometheus' relabel_config, for the series a remote-write sender posts (``--remote-write-relabel``).

The rules are the ones an operator already writes under ``write_relabel_configs`` or
``metric_relabel_configs``, with Prometheus' semantics (model/relabel/relabel.go): the actions
replace, keep, drop, keepequal, dropequal, hashmod, labelmap, labeldrop, labelkeep, lowercase and
uppercase; ``source_labels`` joined by ``separator``; a ``regex`` matched whole (RE2 syntax, run
through metricsd/http/goregex.py); ``$1`` / ``${1}`` / ``${name}`` groups in ``target_label`` and
``replacement``; setting a label to the empty string removes it. Label names follow the legacy
(pre-UTF-8) rules, which are metricsd's own. Pure: text in, rules out; labels in, labels out.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from metricsd.http.goregex import GoRegexError, compile_go
from metricsd.model import Labels

__all__ = ["ACTIONS", "RelabelConfigError", "RelabelError", "Relabelled", "Rule", "expand", "parse_rules", "relabel"]

ACTIONS = ("replace", "keep", "drop", "keepequal", "dropequal", "hashmod", "labelmap", "labeldrop", "labelkeep",
           "lowercase", "uppercase")
MAX_RULES = 1000  # a rules file is configuration, not data: past this it is a mistake

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# A target or labelmap replacement that becomes a label name once $groups are filled in
# (Prometheus' relabelTargetLegacy).
_TEMPLATE_NAME = re.compile(r"(?:(?:[a-zA-Z_]|\$(?:\{\w+\}|\w+))+\w*)+")
_FIELDS = {"source_labels", "separator", "regex", "modulus", "target_label", "replacement", "action"}


class RelabelConfigError(ValueError):
    """A rules file that cannot be used; the message names the rule (1-based) and the field."""


class RelabelError(ValueError):
    """A rule made a label name that is not valid (only labelmap can: replace checks its target)."""

    def __init__(self, rule: Rule, message: str) -> None:
        super().__init__(message)
        self.rule = rule


@dataclass(frozen=True)
class Rule:
    """One relabel_config. ``index`` is its 1-based place in the file, for messages."""

    action: str = "replace"
    source_labels: tuple[str, ...] = ()
    separator: str = ";"
    regex: str = "(.*)"
    modulus: int = 0
    target_label: str = ""
    replacement: str = "$1"
    index: int = 0
    compiled: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "compiled", compile_go(self.regex))

    def describe(self) -> str:
        """How messages name the rule: ``rule 2 (action drop, source_labels [job], regex "x.*")``."""
        parts = [f"action {self.action}"]
        if self.source_labels:
            parts.append(f"source_labels [{','.join(self.source_labels)}]")
        if self.action not in ("hashmod", "keepequal", "dropequal", "lowercase", "uppercase"):
            parts.append(f"regex {json.dumps(self.regex)}")
        if self.target_label:
            parts.append(f"target_label {self.target_label}")
        return f"rule {self.index} ({', '.join(parts)})"


@dataclass(frozen=True)
class Relabelled:
    """The labels after the rules, or None and the rule that dropped the series."""

    labels: Labels | None
    dropped_by: Rule | None = None


def parse_rules(text: str, source: str = "relabel rules") -> tuple[Rule, ...]:
    """Rules from the text of a YAML (or JSON) list of relabel_configs, validated as Prometheus
    validates them. Raises RelabelConfigError naming ``source``, the rule and the field."""
    import yaml  # only with rules: ~1 MiB less in a store that has none (perf/RESULTS.md, idle RSS)

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise RelabelConfigError(f"{source}: not YAML or JSON: {e}") from None
    if doc is None:
        return ()
    if not isinstance(doc, list):
        raise RelabelConfigError(f"{source}: expected a list of relabel_configs, got {type(doc).__name__}")
    if len(doc) > MAX_RULES:
        raise RelabelConfigError(f"{source}: {len(doc)} rules, more than the limit of {MAX_RULES}")
    return tuple(_rule(item, i + 1, source) for i, item in enumerate(doc))


def _rule(item: Any, index: int, source: str) -> Rule:
    where = f"{source}: rule {index}"
    if not isinstance(item, dict):
        raise RelabelConfigError(f"{where}: expected a mapping, got {type(item).__name__}")
    unknown = sorted(set(map(str, item)) - _FIELDS)
    if unknown:
        raise RelabelConfigError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(_FIELDS))})")

    def text(key: str, default: str) -> str:
        v = item.get(key, default)
        if not isinstance(v, str):
            raise RelabelConfigError(f"{where}: {key} must be a string, got {v!r}")
        return v

    action = text("action", "replace").lower()
    if action not in ACTIONS:
        raise RelabelConfigError(f"{where}: unknown relabel action {item['action']!r} (known: {', '.join(ACTIONS)})")
    sources = item.get("source_labels", [])
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        raise RelabelConfigError(f"{where}: source_labels must be a list of label names")
    for s in sources:
        if not _LABEL_NAME.fullmatch(s):
            raise RelabelConfigError(f"{where}: source_labels: {s!r} is not a valid label name")
    modulus = item.get("modulus", 0)
    if not isinstance(modulus, int) or isinstance(modulus, bool) or not 0 <= modulus < 2**64:
        raise RelabelConfigError(f"{where}: modulus must be an unsigned integer, got {modulus!r}")
    try:
        rule = Rule(action=action, source_labels=tuple(sources), separator=text("separator", ";"),
                    regex=text("regex", "(.*)"), modulus=modulus, target_label=text("target_label", ""),
                    replacement=text("replacement", "$1"), index=index)
    except GoRegexError as e:
        raise RelabelConfigError(f"{where}: {e}") from None
    problem = _invalid(rule, item)
    if problem:
        raise RelabelConfigError(f"{where}: {problem}")
    return rule


def _invalid(r: Rule, given: dict[str, Any]) -> str | None:
    """Prometheus' Config.Validate, with legacy label names."""
    a = r.action
    if a == "hashmod" and r.modulus == 0:
        return "relabel configuration for hashmod requires non-zero modulus"
    if a in ("replace", "hashmod", "lowercase", "uppercase", "keepequal", "dropequal") and not r.target_label:
        return f"relabel configuration for {a} action requires 'target_label' value"
    if a == "replace" and not (_TEMPLATE_NAME if "$" in r.target_label else _LABEL_NAME).fullmatch(r.target_label):
        return f"{r.target_label!r} is invalid 'target_label' for {a} action"
    if a in ("lowercase", "uppercase", "keepequal", "dropequal", "hashmod") and \
            not _LABEL_NAME.fullmatch(r.target_label):
        return f"{r.target_label!r} is invalid 'target_label' for {a} action"
    if a in ("lowercase", "uppercase", "keepequal", "dropequal") and r.replacement != "$1":
        return f"'replacement' can not be set for {a} action"
    if a == "labelmap" and not _TEMPLATE_NAME.fullmatch(r.replacement):
        return f"{r.replacement!r} is invalid 'replacement' for {a} action"
    if a in ("keepequal", "dropequal") and set(given) - {"action", "source_labels", "target_label"}:
        return f"{a} action requires only 'source_labels' and 'target_label', and no other fields"
    if a in ("labeldrop", "labelkeep") and set(given) - {"action", "regex"}:
        return f"{a} action requires only 'regex', and no other fields"
    return None


def expand(template: str, m: re.Match[str]) -> str:
    """Go's Regexp.Expand: ``$1``, ``${1}``, ``$name``, ``${name}``; ``$$`` is a dollar. A name
    runs as far as letters, digits and ``_`` go (``$1x`` is group "1x"); a group that does not
    exist or did not take part is empty; a malformed reference is kept as text."""
    out: list[str] = []
    i, n = 0, len(template)
    names = m.re.groupindex
    while i < n:
        j = template.find("$", i)
        if j < 0:
            out.append(template[i:])
            break
        out.append(template[i:j])
        i = j + 1
        if template.startswith("$", i):
            out.append("$")
            i += 1
            continue
        brace = template.startswith("{", i)
        k = i + brace
        start = k
        while k < n and (template[k].isalnum() or template[k] == "_"):
            k += 1
        name = template[start:k]
        if not name or (brace and not template.startswith("}", k)):
            out.append("$")  # malformed: the dollar is text
            continue
        i = k + brace
        num = int(name) if name.isdigit() and name.isascii() and (name == "0" or name[0] != "0") else None
        if num is not None and num <= m.re.groups:
            out.append(m.group(num) or "")
        elif num is None and name in names:
            out.append(m.group(name) or "")
    return "".join(out)


def _set(d: dict[str, str], name: str, value: str) -> None:
    if value:
        d[name] = value
    else:
        d.pop(name, None)


def relabel(labels: Labels, rules: Sequence[Rule]) -> Relabelled:
    """Apply the rules in order (Prometheus' ProcessBuilder). A rule that drops the series ends it.
    Raises RelabelError when a labelmap rule makes an invalid label name (Prometheus would keep
    it; metricsd could not store it)."""
    d = dict(labels)
    for r in rules:
        if not _apply(r, d):
            return Relabelled(None, r)
    return Relabelled(tuple(sorted(d.items())))


def _apply(r: Rule, d: dict[str, str]) -> bool:
    val = r.separator.join(d.get(s, "") for s in r.source_labels)
    a = r.action
    if a == "drop":
        return r.compiled.fullmatch(val) is None
    if a == "keep":
        return r.compiled.fullmatch(val) is not None
    if a == "dropequal":
        return d.get(r.target_label, "") != val
    if a == "keepequal":
        return d.get(r.target_label, "") == val
    if a == "replace":
        if val == "" and r.regex == "(.*)" and "$" not in r.target_label and "$" not in r.replacement:
            _set(d, r.target_label, r.replacement)
            return True
        m = r.compiled.fullmatch(val)
        if m is None:
            return True
        target = expand(r.target_label, m)
        if _LABEL_NAME.fullmatch(target):
            _set(d, target, expand(r.replacement, m))
    elif a == "lowercase":
        _set(d, r.target_label, val.lower())
    elif a == "uppercase":
        _set(d, r.target_label, val.upper())
    elif a == "hashmod":
        digest = hashlib.md5(val.encode(), usedforsecurity=False).digest()
        _set(d, r.target_label, str(int.from_bytes(digest[8:], "big") % r.modulus))
    elif a == "labelmap":
        for name, value in sorted(d.items()):
            m = r.compiled.fullmatch(name)
            if m is not None:
                target = expand(r.replacement, m)
                if not _LABEL_NAME.fullmatch(target):
                    raise RelabelError(r, f"{r.describe()} made the label name {target!r} from {name!r}, "
                                          "which is not a valid label name")
                _set(d, target, value)
    elif a == "labeldrop":
        for name in [k for k in d if r.compiled.fullmatch(k)]:
            del d[name]
    elif a == "labelkeep":
        for name in [k for k in d if not r.compiled.fullmatch(k)]:
            del d[name]
    return True
