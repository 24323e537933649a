"""Linux CPU list strings ("0-3,8,10-11") <-> sorted tuples of CPU ids."""

from __future__ import annotations

import re
from collections.abc import Iterable

from corescale.errors import UserError

MAX_CPU_ID = 65535  # far above Linux's NR_CPUS; guards against "0-999999999"

_ITEM = re.compile(r"([0-9]+)(?:-([0-9]+))?")


def parse_cpulist(text: str) -> tuple[int, ...]:
    """Parse "0-3,8,10-11" into sorted unique CPU ids; "" (or whitespace) -> ()."""
    stripped = text.strip()
    if not stripped:
        return ()
    cpus: set[int] = set()
    for item in stripped.split(","):
        m = _ITEM.fullmatch(item.strip())
        if m is None:
            raise UserError(f"invalid CPU list '{stripped}': expected numbers and ranges like 0-3,8")
        lo = int(m[1])
        hi = int(m[2]) if m[2] is not None else lo
        if hi < lo:
            raise UserError(f"invalid CPU list '{stripped}': range {lo}-{hi} is reversed")
        if hi > MAX_CPU_ID:
            raise UserError(f"invalid CPU list '{stripped}': CPU ids above {MAX_CPU_ID} are not supported")
        cpus.update(range(lo, hi + 1))
    return tuple(sorted(cpus))


def format_cpulist(cpus: Iterable[int]) -> str:
    """Format CPU ids as a compact list: (0, 1, 2, 3, 8) -> "0-3,8"; () -> ""."""
    ids = sorted(set(cpus))
    if ids and ids[0] < 0:
        raise ValueError(f"negative CPU id {ids[0]}")
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)
