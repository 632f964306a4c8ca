"""Kubernetes resource quantities ("500m", "1.5Gi", "2e3") as plain floats.

Specs in the shape of Kubernetes objects carry quantities as strings, while the algorithms work in
cores and bytes. The suffixes follow k8s.io/apimachinery/pkg/api/resource: decimal SI ("m", "k",
"M", ...), binary SI ("Ki", "Mi", ...) and decimal exponents ("1e3").
"""

from __future__ import annotations

import math
import re

__all__ = ["QuantityError", "format_cpu", "format_memory", "parse_quantity"]

_SUFFIXES: dict[str, float] = {
    "": 1.0,
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}

_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?$")


class QuantityError(ValueError):
    """Raised for a string that is not a Kubernetes quantity."""


def parse_quantity(value: object) -> float:
    """Return the quantity as a float in base units (cores, bytes).

    Accepts ints and floats unchanged (YAML gives `2` for `cpu: 2`). O(len(text)).

    >>> parse_quantity("250m"), parse_quantity("1Gi")
    (0.25, 1073741824.0)

    Raises QuantityError for booleans, other types and malformed strings.
    """
    if isinstance(value, bool):
        raise QuantityError(f"not a quantity: {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise QuantityError(f"not a finite quantity: {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise QuantityError(f"not a quantity: {value!r}")
    m = _QUANTITY.match(value.strip())
    if m is None:
        raise QuantityError(f"not a quantity: {value!r}")
    number, exponent, suffix = m.groups()
    if exponent is not None:
        return float(number + exponent)
    return float(number) * _SUFFIXES[suffix or ""]


def format_cpu(cores: float) -> str:
    """Millicores, as Kubernetes prints CPU requests ("250m"); whole cores without a suffix."""
    milli = math.ceil(round(cores * 1000.0, 6))
    if milli % 1000 == 0:
        return str(milli // 1000)
    return f"{milli}m"


def format_memory(num_bytes: float) -> str:
    """Bytes, with a binary suffix when the amount is a whole number of Ki/Mi/Gi ("250Mi")."""
    whole = math.ceil(round(num_bytes, 6))
    for suffix, size in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if whole >= size and whole % size == 0:
            return f"{whole // size}{suffix}"
    return str(whole)
