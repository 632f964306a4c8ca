"""Go (RE2) regular expressions, as Prometheus' relabel rules write them, run by Python's ``re``.

The two syntaxes agree on most of what rules use (``.*``, groups, alternation, classes, counted
repetition), but not everywhere, and a silent difference would relabel differently from
Prometheus. So a pattern is read token by token and rewritten where the meaning differs:

- ``\\d \\w \\s \\b`` and their negations are ASCII in Go, Unicode in Python: spelt out as ASCII.
- ``$`` outside multi-line mode is the end of the text in Go; Python's also matches before a
  final newline: becomes ``\\Z``. Go's ``\\z`` is Python's ``\\Z``.
- ``(?i)`` in the middle of a group applies to the rest of that group in Go; Python only accepts
  global flags at the start: becomes a scoped ``(?i:...)`` up to the group's end.
- ``(?<name>...)`` becomes ``(?P<name>...)``; ``\\Q...\\E``, ``\\x{...}``, octal ``\\123`` and
  POSIX classes ``[[:alpha:]]`` are translated.

Constructs RE2 does not have, and which Python would otherwise accept with a meaning Prometheus
never gives them, are refused with :class:`GoRegexError`: back-references, look-around, atomic
groups, possessive quantifiers, conditionals, comments, Python-only flags; likewise what Python
cannot express: Unicode classes ``\\p{...}``, the ungreedy flag ``U``, ``\\C``.

A pattern is matched whole (Prometheus anchors it as ``^(?s:...)$``): use ``fullmatch``.
"""

from __future__ import annotations

import re

__all__ = ["GoRegexError", "compile_go"]

MAX_REPEAT = 1000  # RE2 refuses counted repetition past this

_WORD = "0-9A-Za-z_"
_SPACE = "\\t\\n\\f\\r "
_PERL = {"d": "0-9", "w": _WORD, "s": _SPACE}
_POSIX = {
    "alnum": "0-9A-Za-z", "alpha": "A-Za-z", "ascii": "\\x00-\\x7f", "blank": "\\t ", "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9", "graph": "!-~", "lower": "a-z", "print": " -~", "punct": "!-/:-@\\[-`{-~",
    "space": "\\t\\n\\v\\f\\r ", "upper": "A-Z", "word": _WORD, "xdigit": "0-9A-Fa-f",
}
_SIMPLE_ESCAPES = {"a": "\\a", "f": "\\f", "t": "\\t", "n": "\\n", "r": "\\r", "v": "\\v"}
_BOUNDARY = f"(?:(?<=[{_WORD}])(?![{_WORD}])|(?<![{_WORD}])(?=[{_WORD}]))"
_NOT_BOUNDARY = f"(?:(?<=[{_WORD}])(?=[{_WORD}])|(?<![{_WORD}])(?![{_WORD}]))"
_REPEAT = re.compile(r"\{(\d+)(,(\d*))?\}")
_NAME = re.compile(r"[A-Za-z0-9_]+")


class GoRegexError(ValueError):
    """A pattern that is not valid RE2, or uses what this translation cannot give Go's meaning."""


class _Frame:
    """An open group: whether ``$`` is multi-line in it, and scoped-flag groups to close with it."""

    def __init__(self, multiline: bool) -> None:
        self.multiline = multiline
        self.pending = 0


def compile_go(pattern: str) -> re.Pattern[str]:
    """Python's compiled equivalent of the Go pattern, to be used with ``fullmatch``.
    Raises GoRegexError naming the construct."""
    try:
        return re.compile("(?s:" + _translate(pattern) + ")")
    except re.error as e:
        raise GoRegexError(f"invalid regex {pattern!r}: {e}") from None


def _fail(pattern: str, what: str) -> GoRegexError:
    return GoRegexError(f"regex {pattern!r}: {what}")


def _translate(p: str) -> str:
    out: list[str] = []
    frames = [_Frame(False)]
    i, n = 0, len(p)
    state = 0  # 0 after an atom, 1 after a repetition operator, 2 after its lazy '?'
    while i < n:
        c = p[i]
        m = _REPEAT.match(p, i) if c == "{" else None
        if c in "*+?" or m is not None:
            op = m.group() if m is not None else c
            if state == 1 and op == "?":
                state = 2
            elif state:
                raise _fail(p, f"invalid nested repetition operator at {op!r} (RE2 has no possessive "
                               "quantifiers)")
            else:
                if m is not None:
                    lo, hi = int(m.group(1)), m.group(3)
                    if lo > MAX_REPEAT or (hi and int(hi) > MAX_REPEAT):
                        raise _fail(p, f"invalid repeat count {op!r} (RE2's limit is {MAX_REPEAT})")
                    if hi and int(hi) < lo:
                        raise _fail(p, f"invalid repeat count {op!r}")
                state = 1
            out.append(op)
            i += len(op)
            continue
        state = 0
        if c == "\\":
            text, i = _escape(p, i)
            out.append(text)
        elif c == "[":
            text, i = _char_class(p, i)
            out.append(text)
        elif c == "(":
            i = _open_group(p, i, out, frames)
        elif c == ")":
            frame = frames.pop() if len(frames) > 1 else None
            if frame is None:
                raise _fail(p, "unmatched ')'")
            out.append(")" * (frame.pending + 1))
            i += 1
        elif c == "$":
            out.append("$" if frames[-1].multiline else "\\Z")
            i += 1
        else:
            out.append(re.escape(c) if c in "{}#&~ \t\n\r\f\v" else c)
            i += 1
    if len(frames) > 1:
        raise _fail(p, "missing ')'")
    out.append(")" * frames[0].pending)
    return "".join(out)


def _open_group(p: str, i: int, out: list[str], frames: list[_Frame]) -> int:
    """Translate the group opening at p[i] == '('; returns where the pattern continues."""
    multiline = frames[-1].multiline
    if not p.startswith("(?", i):
        out.append("(")
        frames.append(_Frame(multiline))
        return i + 1
    for prefix in ("(?P<", "(?<"):
        if p.startswith(prefix, i) and not p.startswith("(?<=", i) and not p.startswith("(?<!", i):
            m = _NAME.match(p, i + len(prefix))
            if m is None or not p.startswith(">", m.end()):
                raise _fail(p, "invalid named capture")
            out.append(f"(?P<{m.group()}>")
            frames.append(_Frame(multiline))
            return m.end() + 1
    m = re.compile(r"\(\?([a-zA-Z]*)(?:-([a-zA-Z]*))?([:)])").match(p, i)
    if m is None:
        what = p[i:i + 4]
        raise _fail(p, f"{what!r}...: RE2 has no look-around, back-references, atomic or conditional groups "
                       "or comments")
    on, off, end = m.group(1), m.group(2) or "", m.group(3)
    for f in on + off:
        if f == "U":
            raise _fail(p, "the ungreedy flag U is not supported")
        if f not in "ims":
            raise _fail(p, f"invalid flag {f!r} (RE2 knows i, m, s and U)")
    if not on and not off:
        if end == ")":
            raise _fail(p, "empty flag group '(?)'")
        out.append("(?:")
        frames.append(_Frame(multiline))
        return m.end()
    if "m" in on:
        multiline = True
    if "m" in off:
        multiline = False
    flags = on + ("-" + off if off else "")
    out.append(f"(?{flags}:")
    if end == ":":
        frames.append(_Frame(multiline))
    else:  # (?flags): to the end of the enclosing group
        frames[-1].pending += 1
        frames[-1].multiline = multiline
    return m.end()


def _escape(p: str, i: int) -> tuple[str, int]:
    """An escape outside a class, at p[i] == '\\'."""
    if i + 1 >= len(p):
        raise _fail(p, "trailing backslash")
    c = p[i + 1]
    if c in _PERL:
        return f"[{_PERL[c]}]", i + 2
    if c.lower() in _PERL:
        return f"[^{_PERL[c.lower()]}]", i + 2
    if c == "b":
        return _BOUNDARY, i + 2
    if c == "B":
        return _NOT_BOUNDARY, i + 2
    if c == "A":
        return "\\A", i + 2
    if c == "z":
        return "\\Z", i + 2
    if c == "Q":
        end = p.find("\\E", i + 2)
        literal = p[i + 2:] if end < 0 else p[i + 2:end]
        return re.escape(literal), (len(p) if end < 0 else end + 2)
    if c == "E":
        return "", i + 2
    char, j = _char_escape(p, i)
    return re.escape(char), j


def _char_escape(p: str, i: int) -> tuple[str, int]:
    """An escape that stands for one character, at p[i] == '\\' (shared by classes)."""
    c = p[i + 1] if i + 1 < len(p) else ""
    if c in _SIMPLE_ESCAPES:
        return {"a": "\a", "f": "\f", "t": "\t", "n": "\n", "r": "\r", "v": "\v"}[c], i + 2
    if c == "x":
        if p.startswith("{", i + 2):
            end = p.find("}", i + 3)
            digits = p[i + 3:end] if end > 0 else ""
            if not digits or not re.fullmatch(r"[0-9A-Fa-f]+", digits) or int(digits, 16) > 0x10FFFF:
                raise _fail(p, "invalid \\x{...} escape")
            return chr(int(digits, 16)), end + 1
        digits = p[i + 2:i + 4]
        if not re.fullmatch(r"[0-9A-Fa-f]{2}", digits):
            raise _fail(p, "invalid \\x escape")
        return chr(int(digits, 16)), i + 4
    if c.isdigit():
        if c in "89" or (c != "0" and not (i + 2 < len(p) and p[i + 2] in "01234567")):
            raise _fail(p, f"invalid escape \\{c}: RE2 has no back-references")
        m = re.compile(r"[0-7]{1,3}").match(p, i + 1)
        assert m is not None
        return chr(int(m.group(), 8)), m.end()
    if c in ("p", "P"):
        raise _fail(p, "Unicode classes (\\p, \\P) are not supported")
    if c == "C":
        raise _fail(p, "\\C is not supported")
    if c and not c.isalnum() and ord(c) < 128:
        return c, i + 2
    raise _fail(p, f"invalid escape \\{c}")


def _class_char(ch: str) -> str:
    return "\\" + ch if ch in "\\]^-[&~|" else ch


def _char_class(p: str, i: int) -> tuple[str, int]:
    """A bracket class at p[i] == '[', with Go's rules (a leading ']' is literal)."""
    j = i + 1
    negate = p.startswith("^", j)
    if negate:
        j += 1
    parts: list[str] = []
    first = True
    while True:
        if j >= len(p):
            raise _fail(p, "missing closing ]")
        c = p[j]
        if c == "]" and not first:
            break
        first = False
        if p.startswith("[:", j):
            end = p.find(":]", j + 2)
            name = p[j + 2:end] if end > 0 else ""
            neg = name.startswith("^")
            if name.lstrip("^") not in _POSIX:
                raise _fail(p, f"invalid character class range {p[j:end + 2]!r}")
            if neg:
                raise _fail(p, f"negated POSIX class {p[j:end + 2]!r} inside brackets is not supported")
            parts.append(_POSIX[name])
            j = end + 2
            continue
        if c == "\\" and j + 1 < len(p) and p[j + 1].lower() in _PERL:
            if p[j + 1].isupper():
                raise _fail(p, f"negated class \\{p[j + 1]} inside brackets is not supported")
            parts.append(_PERL[p[j + 1]])
            j += 2
            continue
        lo, j = _char_escape(p, j) if c == "\\" else (c, j + 1)
        if p.startswith("-", j) and j + 1 < len(p) and p[j + 1] != "]":
            k = j + 1
            hi, j = _char_escape(p, k) if p[k] == "\\" else (p[k], k + 1)
            if hi < lo:
                raise _fail(p, f"invalid character class range {lo}-{hi}")
            parts.append(_class_char(lo) + "-" + _class_char(hi))
        else:
            parts.append(_class_char(lo))
    return "[" + ("^" if negate else "") + "".join(parts) + "]", j + 1
