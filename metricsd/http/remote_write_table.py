"""The usual remote-write body's samples read as one table: every sample field of every series
the same ``e`` bytes (remote_write_scan.py finds where each series' samples begin; this reads them).

A real Prometheus sends each sample as a series entry of its own, one field, and most fields have
a value and a timestamp of one varint width: the fields, laid end to end, are an (n, e) table whose
fixed bytes, continuation bits and digits a few whole-array steps check and decode. A field whose
value is 0 (proto3 leaves it out, VALUE_LEFT_OUT bytes shorter) is rewritten as the full field of
value 0 first, so such a sample (an unmoved counter) does not send the request field by field.
"""

from __future__ import annotations

import numpy as np

__all__ = ["VALUE_LEFT_OUT", "uniform_samples"]

VALUE_LEFT_OUT = 9
"""Bytes a sample field is shorter without its value (a tag and a double): proto3 leaves a 0 out."""


def uniform_samples(buf: np.ndarray, label_end: np.ndarray, ends: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The usual body in one go: every sample field of every series is ``e`` bytes,
    0x12 (e-2) 0x09 <double> 0x10 <varint of w = e-12 bytes, w <= 8>. The series' sample runs,
    cut out and laid end to end, are then an (n, e) table read through strided views: one check of
    every field's fixed bytes and continuation bits, the w digits gathered into 56 bits by three
    shift-and-mask steps. Counts, timestamps, values and the digits (the timestamps' varints as a
    (n, w) view); None when the body is in any other shape. When every series has one field, some
    may be VALUE_LEFT_OUT bytes short (a value of 0: _with_values_left_out)."""
    size = ends - label_end
    has = size > 0
    if not bool(has.any()):
        return None
    first = label_end[has]
    e = 2 + int(buf[first[0] + 1]) + (VALUE_LEFT_OUT if int(buf[first[0] + 2]) == 0x10 else 0)
    w = e - 12
    if not 1 <= w <= 8:
        return None
    short = size == e - VALUE_LEFT_OUT
    if bool(short.any()):
        return _with_values_left_out(buf, label_end, short, e) if bool((short | (size == e)).all()) else None
    if bool((size % e).any()) or bool((buf[first] != 0x12).any()):
        return None
    # The sample fields end to end, series after series: one gather of e-byte rows from a view of
    # the body as overlapping rows (a row a byte); a real Prometheus sends a series' every sample
    # as an entry of its own, so each run is one field and the rows are where the runs begin.
    per_series = size // e
    if bool((per_series == 1).all()):
        at = label_end
    else:
        n = int(per_series.sum())
        at = np.repeat(label_end, per_series) + (np.arange(n) - np.repeat(np.cumsum(per_series) - per_series,
                                                                          per_series)) * e
    return _table_samples(np.ndarray((len(buf) - e + 1, e), np.uint8, buf, 0, (1, 1))[at], per_series)


def _with_values_left_out(buf: np.ndarray, label_end: np.ndarray, short: np.ndarray, e: int
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """uniform_samples of a request whose every series has one sample field, of ``e`` bytes or,
    where ``short``, without its value (a 0, which proto3 leaves out: 0x12 (e-11) 0x10 <varint>):
    those rows are rewritten as the full field of value 0 before the table is read, so the
    table's checks cover them too."""
    if int(label_end.max()) + e > len(buf):  # a short field last in an unpadded body: its row would overrun
        return None
    table = np.ndarray((len(buf) - e + 1, e), np.uint8, buf, 0, (1, 1))[label_end]
    s = np.flatnonzero(short)
    rows = table[s]
    if bool((rows[:, :3] != np.array([0x12, e - 11, 0x10], dtype=np.uint8)).any()):
        return None
    w = e - 12
    fixed = np.zeros_like(rows)
    fixed[:, :3] = (0x12, e - 2, 0x09)
    fixed[:, 11] = 0x10
    fixed[:, 12:] = rows[:, 3 : 3 + w]
    table[s] = fixed
    return _table_samples(table, np.ones(len(label_end), dtype=np.int64))


def _table_samples(rows: np.ndarray, per_series: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """uniform_samples' reading of its (n, e) table of sample fields (``per_series`` fields a series)."""
    n, e = rows.shape
    w = e - 12
    table = rows.reshape(-1)
    head = np.ndarray((n,), "<u4", table, 0, (e,)) & np.uint32(0xFFFFFF)
    if bool((head != np.uint32(0x09 << 16 | (e - 2) << 8 | 0x12)).any()):
        return None
    if bool((np.ndarray((n,), "u1", table, 11, (e,)) != 0x10).any()):
        return None
    # The varint's w bytes, the record's last, as the top of a little-endian word.
    x = np.ndarray((n,), "<u8", table, e - 8, (e,)) >> np.uint64(64 - 8 * w)
    if bool(((x & np.uint64(int.from_bytes(b"\x80" * w, "little")))
             != np.uint64(int.from_bytes(b"\x80" * (w - 1), "little"))).any()):
        return None  # a continuation bit out of place: not one varint of exactly w bytes
    x &= np.uint64(0x7F7F7F7F7F7F7F7F)
    x = (x & np.uint64(0x007F007F007F007F)) | ((x & np.uint64(0x7F007F007F007F00)) >> np.uint64(1))
    x = (x & np.uint64(0x00003FFF00003FFF)) | ((x & np.uint64(0x3FFF00003FFF0000)) >> np.uint64(2))
    x = (x & np.uint64(0x000000000FFFFFFF)) | ((x & np.uint64(0x0FFFFFFF00000000)) >> np.uint64(4))
    values = np.array(np.ndarray((n,), "<f8", table, 3, (e,)), dtype=np.float64)
    digits = np.ndarray((n, w), np.uint8, table, 12, (e, 1))
    return per_series, x.view(np.int64), values, digits
