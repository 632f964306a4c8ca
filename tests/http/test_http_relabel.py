"""Relabel rules against Prometheus' own TestRelabel table (data/relabel_cases.json), validation
errors, and properties of the actions."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.http.relabel import RelabelConfigError, RelabelError, Rule, expand, parse_rules, relabel

CASES = json.loads((Path(__file__).parent / "data" / "relabel_cases.json").read_text())["cases"]
_LEGACY = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def _legacy_only(case: dict[str, Any]) -> bool:
    """metricsd's label names are Prometheus' legacy ones; the UTF-8 name cases do not apply."""
    names = [*case["input"], *case.get("output", {})]
    names += [r.get("target_label", "x").replace("$", "x").replace("{", "").replace("}", "") or "x"
              for r in case["relabel"]]
    names += [s for r in case["relabel"] for s in r.get("source_labels", [])]
    return all(_LEGACY.fullmatch(n) for n in names)


def _with_go_test_defaults(rule: dict[str, Any]) -> dict[str, Any]:
    """TestRelabel's loop: zero-valued fields get DefaultRelabelConfig's values."""
    out = dict(rule)
    for key, default in (("action", "replace"), ("separator", ";"), ("regex", "(.*)"), ("replacement", "$1")):
        if not out.get(key):
            out[key] = default
    if out["action"] in ("keepequal", "dropequal"):  # only source_labels and target_label may be given
        for key in ("separator", "regex", "replacement"):
            out.pop(key)
    if out["action"] in ("labeldrop", "labelkeep"):
        for key in ("separator", "replacement"):
            out.pop(key)
    return out


PORTED = [pytest.param(c, id=f"case{i}") for i, c in enumerate(CASES) if _legacy_only(c)]


def test_most_of_prometheus_table_applies() -> None:
    assert len(CASES) >= 30 and len(PORTED) >= len(CASES) - 5


@pytest.mark.parametrize("case", PORTED)
def test_prometheus_relabel_table(case: dict[str, Any]) -> None:
    rules = parse_rules(json.dumps([_with_go_test_defaults(r) for r in case["relabel"]]), "case")
    got = relabel(tuple(sorted(case["input"].items())), rules)
    if case.get("drop"):
        assert got.labels is None and got.dropped_by is not None
    else:
        assert got.labels == tuple(sorted(case["output"].items()))


def test_a_dropped_series_names_its_rule() -> None:
    rules = parse_rules("""
- {source_labels: [job], regex: node, action: keep}
- {source_labels: [__name__], regex: 'go_.*', action: drop}
""")
    assert relabel((("__name__", "go_goroutines"), ("job", "node")), rules).dropped_by == rules[1]
    assert relabel((("__name__", "up"), ("job", "prom")), rules).dropped_by == rules[0]
    assert rules[1].describe() == 'rule 2 (action drop, source_labels [__name__], regex "go_.*")'


@pytest.mark.parametrize(("text", "message"), [
    ("{a: 1}", "expected a list"),
    ("- [1]", "rule 1: expected a mapping"),
    ("- {action: explode}", "unknown relabel action 'explode'"),
    ("- {action: replace}", "requires 'target_label'"),
    ("- {action: hashmod, target_label: x}", "requires non-zero modulus"),
    ("- {action: replace, target_label: 'bad-name'}", "'bad-name' is invalid 'target_label'"),
    ("- {action: labelmap, replacement: '-$1'}", "is invalid 'replacement'"),
    ("- {action: labeldrop, regex: x, source_labels: [a]}", "requires only 'regex'"),
    ("- {action: keepequal, source_labels: [a], target_label: b, regex: x}", "requires only 'source_labels'"),
    ("- {action: lowercase, source_labels: [a], target_label: b, replacement: x}", "'replacement' can not be set"),
    ("- {action: keep, regex: '(?=x)'}", "RE2 has no look-around"),
    ("- {action: keep, regex: '(a)\\1'}", "no back-references"),
    ("- {action: keep, regex: 'a++'}", "nested repetition"),
    ("- {action: keep, regex: '\\pL'}", "Unicode classes"),
    ("- {action: keep, regex: '(?U)a*'}", "ungreedy"),
    ("- {action: keep, regex: '(a'}", "missing ')'"),
    ("- {action: keep, regexp: a}", "unknown field 'regexp'"),
    ("- {action: keep, source_labels: 'job'}", "source_labels must be a list"),
    (": : :", "not YAML or JSON"),
])
def test_invalid_rules_are_refused_naming_the_rule_and_field(text: str, message: str) -> None:
    with pytest.raises(RelabelConfigError, match=re.escape(message)):
        parse_rules(text, "rules.yaml")


def test_an_empty_file_is_no_rules() -> None:
    assert parse_rules("") == ()


def test_labelmap_to_an_invalid_name_is_an_error_naming_the_rule() -> None:
    rules = parse_rules("- {action: labelmap, regex: 'x_(.*)', replacement: '${1}'}")
    with pytest.raises(RelabelError, match=r"rule 1 \(action labelmap.*made the label name '9'"):
        relabel((("x_9", "v"),), rules)


def test_expand_follows_go() -> None:
    m = re.compile("(?P<first>a)(b)?").fullmatch("a")
    assert m is not None
    assert expand("$1-${1}-$first-${first}", m) == "a-a-a-a"
    # $1x is group "1x" (none: empty), as Go documents; a malformed reference stays text
    assert expand("$2|$9|$1x|${1}x|$$1|$|${1|$-", m) == "|||ax|$1|$|${1|$-"
    assert expand("no dollar", m) == "no dollar"


_names = st.sampled_from(["a", "b", "job", "instance", "__name__", "namespace"])
_values = st.text(alphabet="abcxyz:-_.\n", max_size=6)
_labelsets = st.dictionaries(_names, _values.filter(bool), max_size=5).map(lambda d: tuple(sorted(d.items())))
_patterns = st.sampled_from(["(.*)", "a.*", ".*b", "x|y", "[a-c]+", "(a)(b)?", "", "j.b", "(?i)A.*"])


@settings(max_examples=200, deadline=None)
@given(_labelsets, st.lists(_names, min_size=1, max_size=3), _patterns)
def test_keep_and_drop_of_the_same_rule_split_every_series(labels: Any, sources: list[str], regex: str) -> None:
    body = {"source_labels": sources, "regex": regex}
    kept = relabel(labels, parse_rules(json.dumps([{**body, "action": "keep"}])))
    dropped = relabel(labels, parse_rules(json.dumps([{**body, "action": "drop"}])))
    assert (kept.labels is None) != (dropped.labels is None)
    assert (kept.labels if kept.labels is not None else dropped.labels) == labels  # the labels never change


@settings(max_examples=200, deadline=None)
@given(_labelsets, _patterns)
def test_labeldrop_and_labelkeep_partition_the_names(labels: Any, regex: str) -> None:
    kept = relabel(labels, parse_rules(json.dumps([{"action": "labelkeep", "regex": regex}]))).labels
    dropped = relabel(labels, parse_rules(json.dumps([{"action": "labeldrop", "regex": regex}]))).labels
    assert kept is not None and dropped is not None
    assert sorted(kept + dropped) == list(labels)
    assert all(re.fullmatch(regex, k, re.S) for k, _ in kept)


@settings(max_examples=200, deadline=None)
@given(_labelsets, st.lists(_names, max_size=3), st.integers(1, 2**64 - 1))
def test_hashmod_is_md5s_last_eight_bytes_mod_modulus(labels: Any, sources: list[str], modulus: int) -> None:
    rules = parse_rules(json.dumps([{"source_labels": sources, "action": "hashmod", "target_label": "h",
                                     "modulus": modulus}]))
    got = dict(relabel(labels, rules).labels or ())
    val = ";".join(dict(labels).get(s, "") for s in sources)
    want = int.from_bytes(hashlib.md5(val.encode()).digest()[8:], "big") % modulus
    assert got["h"] == str(want)


@settings(max_examples=200, deadline=None)
@given(_labelsets, _names, _values)
def test_replace_sets_or_removes_and_output_stays_canonical(labels: Any, target: str, value: str) -> None:
    rules = (Rule(action="replace", source_labels=(), regex="(.*)", target_label=target, replacement=value, index=1),)
    got = relabel(labels, rules).labels
    assert got is not None
    assert list(got) == sorted(got) and all(v for _, v in got)  # sorted, no empty values
    assert dict(got).get(target, "") == value
    assert {k: v for k, v in got if k != target} == {k: v for k, v in labels if k != target}
