"""Typed reads from a YAML document, with errors that name the field path.

The HPA and VPA spec parsers share this so an operator sees `spec.metrics[1].resource.target:
exactly one of averageUtilization, averageValue is required` rather than a KeyError.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import yaml

from metricsd.consumers.quantity import QuantityError, parse_quantity

__all__ = ["Node", "SpecError", "load_documents"]

T = TypeVar("T")


class SpecError(ValueError):
    """A spec that cannot be used; `path` is the dotted field path, e.g. `spec.maxReplicas`."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


class Node:
    """A mapping inside the document plus its path; the getters raise SpecError naming the field."""

    def __init__(self, value: object, path: str) -> None:
        if not isinstance(value, Mapping):
            raise SpecError(path, f"must be a mapping, got {_kind(value)}")
        self.value: Mapping[str, Any] = value
        self.path = path

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def has(self, key: str) -> bool:
        return self.value.get(key) is not None

    def child(self, key: str, *, required: bool = False) -> Node | None:
        raw = self.value.get(key)
        if raw is None:
            if required:
                raise SpecError(self.at(key), "is required")
            return None
        return Node(raw, self.at(key))

    def need(self, key: str) -> Node:
        node = self.child(key, required=True)
        assert node is not None
        return node

    def items(self, key: str) -> list[Node]:
        raw = self.value.get(key)
        if raw is None:
            return []
        if isinstance(raw, str) or not isinstance(raw, Sequence):
            raise SpecError(self.at(key), f"must be a list, got {_kind(raw)}")
        return [Node(item, f"{self.at(key)}[{i}]") for i, item in enumerate(raw)]

    def string(self, key: str, default: str | None = None, *, choices: Sequence[str] = ()) -> str:
        raw = self.value.get(key)
        if raw is None:
            if default is None:
                raise SpecError(self.at(key), "is required")
            return default
        if not isinstance(raw, str) or not raw:
            raise SpecError(self.at(key), f"must be a non-empty string, got {_kind(raw)}")
        if choices and raw not in choices:
            raise SpecError(self.at(key), f"must be one of {', '.join(choices)}, got {raw!r}")
        return raw

    def strings(self, key: str, *, choices: Sequence[str] = ()) -> tuple[str, ...] | None:
        raw = self.value.get(key)
        if raw is None:
            return None
        if isinstance(raw, str) or not isinstance(raw, Sequence):
            raise SpecError(self.at(key), f"must be a list of strings, got {_kind(raw)}")
        out: list[str] = []
        for i, item in enumerate(raw):
            if not isinstance(item, str) or (choices and item not in choices):
                allowed = f" (one of {', '.join(choices)})" if choices else ""
                raise SpecError(f"{self.at(key)}[{i}]", f"must be a string{allowed}, got {item!r}")
            out.append(item)
        return tuple(out)

    def integer(
        self, key: str, default: int | None = None, *, minimum: int | None = None, maximum: int | None = None
    ) -> int:
        raw = self.value.get(key)
        if raw is None:
            if default is None:
                raise SpecError(self.at(key), "is required")
            return default
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise SpecError(self.at(key), f"must be an integer, got {_kind(raw)}")
        _check_range(self.at(key), raw, minimum, maximum)
        return raw

    def optional_integer(self, key: str, *, minimum: int | None = None, maximum: int | None = None) -> int | None:
        if self.value.get(key) is None:
            return None
        return self.integer(key, minimum=minimum, maximum=maximum)

    def number(
        self,
        key: str,
        default: float | None = None,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
    ) -> float:
        """A plain number or a Kubernetes quantity string ("0.05", "500m")."""
        raw = self.value.get(key)
        if raw is None:
            if default is None:
                raise SpecError(self.at(key), "is required")
            return default
        try:
            value = parse_quantity(raw)
        except QuantityError:
            raise SpecError(self.at(key), f"must be a number or quantity, got {raw!r}") from None
        _check_range(self.at(key), value, minimum, maximum)
        return value

    def optional_number(
        self, key: str, *, minimum: float | None = None, maximum: float | None = None
    ) -> float | None:
        if self.value.get(key) is None:
            return None
        return self.number(key, minimum=minimum, maximum=maximum)

    def boolean(self, key: str, default: bool) -> bool:
        raw = self.value.get(key)
        if raw is None:
            return default
        if not isinstance(raw, bool):
            raise SpecError(self.at(key), f"must be true or false, got {_kind(raw)}")
        return raw

    def reject_unknown(self, allowed: Sequence[str]) -> None:
        """Typos in an autoscaler spec silently change behaviour, so unknown keys are errors."""
        for key in self.value:
            if key not in allowed:
                raise SpecError(self.at(str(key)), f"unknown field (known: {', '.join(allowed)})")


def _check_range(path: str, value: float, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and value < minimum:
        raise SpecError(path, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise SpecError(path, f"must be <= {maximum}, got {value}")


def _kind(value: object) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"boolean {value}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, int | float):
        return f"number {value}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, Sequence):
        return "a list"
    return type(value).__name__


def load_documents(text: str, kind: str, parse: Callable[[dict[str, Any]], T]) -> list[T]:
    """Every document of ``kind`` in a (multi-document) YAML text, parsed; documents of other
    kinds are skipped, so one file can hold a spec next to the workload it scales. Raises
    SpecError naming ``documents[i]...``, or yaml.YAMLError for YAML that does not parse."""
    out: list[T] = []
    for i, doc in enumerate(yaml.safe_load_all(text)):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise SpecError(f"documents[{i}]", "must be a mapping")
        if doc.get("kind", kind) != kind:
            continue
        try:
            out.append(parse(doc))
        except SpecError as e:
            raise SpecError(f"documents[{i}].{e.path}", e.message) from None
    return out
