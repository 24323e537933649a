"""Counts read as whole numbers in every table: a column that counts things (samples, rows, repeats, ...) is
written '256', never '256.0000' (a table's column of counts becomes floats where some row lacks it)."""

from __future__ import annotations

import math
from numbers import Real

COUNTED = frozenset({"samples", "rows", "repeats", "count", "instances", "cores", "copies", "machines", "nodes",
                     "threads", "batches", "steps", "trials", "texts", "pairs", "queries"})


def is_count(column: str) -> bool:
    """Whether a column counts things: its last word names what (quality_samples, calibration_samples, repeats)."""
    return column.rsplit("_", 1)[-1] in COUNTED


def count_text(column: str, value) -> str | None:
    """A count's whole number ('256'), or None where `column` is no count or `value` is no whole number."""
    if not is_count(column) or isinstance(value, bool) or not isinstance(value, Real):
        return None
    number = float(value)
    return str(int(number)) if math.isfinite(number) and number.is_integer() else None
