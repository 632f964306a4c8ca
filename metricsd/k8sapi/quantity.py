"""Kubernetes' wire forms of numbers and times, as its Go types print them, so that a client
comparing our JSON with metrics-server's or prometheus-adapter's sees the same strings.

``resource.Quantity`` prints its canonical form: for DecimalSI the mantissa with trailing zeros
moved into an exponent that is a multiple of 3 and named by a suffix (``1500u``, ``250m``, ``2``,
``3k``); for BinarySI a power-of-1024 suffix when the value divides (``1024`` -> ``1Ki``), and values
between -1024 and 1024 in decimal form. ``metav1.Duration`` prints Go's ``time.Duration.String()``
(``1m0s``), and ``metav1.Time`` RFC 3339 to the second in UTC.
"""

from __future__ import annotations

import datetime as dt
import functools
import math

__all__ = ["binary_quantity", "decimal_quantity", "go_duration", "milli_quantity", "nano_quantity", "rfc3339"]

_DECIMAL_SUFFIX = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}
_BINARY_SUFFIX = {0: "", 1: "Ki", 2: "Mi", 3: "Gi", 4: "Ti", 5: "Pi", 6: "Ei"}


def decimal_quantity(mantissa: int, exponent: int) -> str:
    """The DecimalSI canonical form of ``mantissa * 10**exponent`` (Go's int64Amount.AsCanonicalBytes)."""
    if mantissa == 0:
        return "0"
    while mantissa % 10 == 0:
        mantissa //= 10
        exponent += 1
    if exponent % 3 == 1:  # Python's modulo: also Go's case -2
        mantissa, exponent = mantissa * 10, exponent - 1
    elif exponent % 3 == 2:  # and Go's case -1
        mantissa, exponent = mantissa * 100, exponent - 2
    suffix = _DECIMAL_SUFFIX.get(exponent)
    return f"{mantissa}{suffix}" if suffix is not None else f"{mantissa}e{exponent}"


def binary_quantity(value: int) -> str:
    """``resource.NewQuantity(value, BinarySI)`` printed: memory in bytes, as metrics-server sends it."""
    if -1024 < value < 1024:
        return decimal_quantity(value, 0)
    power = 0
    while value % 1024 == 0 and power < 6:
        value //= 1024
        power += 1
    return f"{value}{_BINARY_SUFFIX[power]}"


def nano_quantity(value: float) -> str:
    """``resource.NewScaledQuantity(int64(value * 1e9), -9)``: CPU cores as metrics-server sends them."""
    return decimal_quantity(int(value * 1e9), -9)


def milli_quantity(value: float) -> str:
    """``resource.NewMilliQuantity(int64(value * 1000), DecimalSI)``: prometheus-adapter's values."""
    return decimal_quantity(int(value * 1000.0), -3)


@functools.lru_cache(maxsize=64)  # one window for every item of an answer
def go_duration(ms: int) -> str:
    """Go's ``time.Duration.String()`` of a whole number of milliseconds."""
    if ms == 0:
        return "0s"
    sign, ms = ("-", -ms) if ms < 0 else ("", ms)
    if ms < 1000:
        return f"{sign}{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, frac = divmod(rest, 1000)
    seconds = f"{secs}.{frac:03d}".rstrip("0") + "s" if frac else f"{secs}s"
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}"
    if minutes:
        return f"{sign}{minutes}m{seconds}"
    return f"{sign}{seconds}"


@functools.lru_cache(maxsize=64)  # one time for every item of an answer
def rfc3339(ms: int) -> str:
    """``metav1.Time`` on the wire: UTC, whole seconds (the fraction is cut, as Go's marshaller does)."""
    return dt.datetime.fromtimestamp(math.floor(ms / 1000), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
