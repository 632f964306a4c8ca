"""Turns the table of Prometheus' TestRelabel (model/relabel/relabel_test.go) into
relabel_cases.json, the fixture of tests/http/test_http_relabel.py.

Run by hand when porting a newer table (the source is not in this repository):
    python tests/http/data/port_relabel_cases.py relabel_test.go COMMIT > tests/http/data/relabel_cases.json
The Go literals are read by a small tokenizer: strings ("..." and `...`), identifiers, numbers and
punctuation. Fields left out of a Go Config are Go's zero values, which the test then defaults
exactly as TestRelabel does (empty separator, regex and replacement become ";", "(.*)" and "$1").
"""

from __future__ import annotations

import json
import re
import sys

_TOKEN = re.compile(r'\s+|//[^\n]*|"(?:\\.|[^"\\])*"|`[^`]*`|[A-Za-z_][\w.]*|\d+|[{}()\[\],:*]')


def tokens(src: str) -> list[str]:
    out, pos = [], 0
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if m is None:
            raise SystemExit(f"cannot read Go source at {src[pos:pos + 40]!r}")
        pos = m.end()
        t = m.group()
        if not t.isspace() and not t.startswith("//"):
            out.append(t)
    return out


def go_string(t: str) -> str:
    if t.startswith("`"):
        return t[1:-1]
    return json.loads(t)  # Go's interpreted strings use the escapes the tests need (\n)


class Reader:
    def __init__(self, toks: list[str]) -> None:
        self.t, self.i = toks, 0

    def peek(self) -> str:
        return self.t[self.i]

    def take(self, want: str | None = None) -> str:
        t = self.t[self.i]
        if want is not None and t != want:
            raise SystemExit(f"expected {want!r}, got {t!r} at token {self.i}")
        self.i += 1
        return t

    def labels(self) -> dict[str, str]:
        self.take("labels.FromMap")
        self.take("(")
        for w in ("map", "[", "string", "]", "string", "{"):
            self.take(w)
        d = {}
        while self.peek() != "}":
            k = go_string(self.take())
            self.take(":")
            d[k] = go_string(self.take())
            if self.peek() == ",":
                self.take()
        self.take("}")
        self.take(")")
        return d

    def config(self) -> dict[str, object]:
        self.take("{")
        cfg: dict[str, object] = {}
        while self.peek() != "}":
            field = self.take()
            self.take(":")
            if field == "SourceLabels":
                self.take("model.LabelNames")
                self.take("{")
                names = []
                while self.peek() != "}":
                    names.append(go_string(self.take()))
                    if self.peek() == ",":
                        self.take()
                self.take("}")
                cfg["source_labels"] = names
            elif field == "Regex":
                self.take("MustNewRegexp")
                self.take("(")
                cfg["regex"] = go_string(self.take())
                self.take(")")
            elif field == "Action":
                cfg["action"] = self.take().lower()
            elif field == "Modulus":
                cfg["modulus"] = int(self.take())
            elif field in ("TargetLabel", "Separator", "Replacement"):
                key = {"TargetLabel": "target_label", "Separator": "separator", "Replacement": "replacement"}[field]
                cfg[key] = go_string(self.take())
            else:
                raise SystemExit(f"unknown Config field {field}")
            if self.peek() == ",":
                self.take()
        self.take("}")
        return cfg

    def case(self) -> dict[str, object]:
        self.take("{")
        case: dict[str, object] = {}
        while self.peek() != "}":
            field = self.take()
            self.take(":")
            if field in ("input", "output"):
                case[field] = self.labels()
            elif field == "relabel":
                for w in ("[", "]", "*", "Config", "{"):
                    self.take(w)
                rules = []
                while self.peek() != "}":
                    rules.append(self.config())
                    if self.peek() == ",":
                        self.take()
                self.take("}")
                case["relabel"] = rules
            elif field == "drop":
                case["drop"] = self.take() == "true"
            else:
                raise SystemExit(f"unknown case field {field}")
            if self.peek() == ",":
                self.take()
        self.take("}")
        return case


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        src = f.read()
    body = src[src.index("func TestRelabel(t *testing.T)"):]
    body = body[body.index("}{") + 1:]
    r = Reader(tokens(body[: body.index("\n\tfor _, test := range tests")]))
    r.take("{")
    cases = []
    while r.peek() != "}":
        cases.append(r.case())
        if r.peek() == ",":
            r.take()
    json.dump({"source": f"prometheus/prometheus model/relabel/relabel_test.go TestRelabel at {sys.argv[2]}",
               "cases": cases}, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
