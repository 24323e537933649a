"""The memory roof: a STREAM-like triad `a = b + s * c` on the instance's CPUs and threads.

torch's `add(b, c, alpha=s, out=a)` is one fused, OpenMP-parallel pass over the three arrays; the bandwidth is
STREAM's count (3 arrays x 8 bytes per element read or written; the write-allocate of `a` is not counted) over
the best of several passes. Each array is at least ARRAY_LLC_MULTIPLE x the last-level cache and ARRAY_MIN_BYTES,
so no pass is served from the cache. Measured in the calibration process (measure/calibrate.py) beside the GEMM
peak and cached with it (PeakCache). Importing this module imports no framework.
"""

from __future__ import annotations

import os
import time

METHOD_VERSION = 1
LIBRARY = "torch_triad"  # the kernel that sets the memory roof
ARRAY_LLC_MULTIPLE = 4
ARRAY_MIN_BYTES = 64 * 2**20
MIN_PASSES = 5
MIN_SECONDS = 0.3


def last_level_cache_bytes(cpu: int = 0) -> int:
    """The largest cache of `cpu` (sysfs), 0 when unreadable."""
    base = f"/sys/devices/system/cpu/cpu{cpu}/cache"
    sizes = []
    try:
        entries = os.listdir(base)
    except OSError:
        return 0
    for entry in entries:
        try:
            with open(f"{base}/{entry}/size") as handle:
                text = handle.read().strip()
        except OSError:
            continue
        unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes, default=0)


def array_bytes(llc_bytes: int) -> int:
    return max(ARRAY_MIN_BYTES, ARRAY_LLC_MULTIPLE * llc_bytes)


def triad(threads: int, min_seconds: float = MIN_SECONDS, size_bytes: int | None = None) -> dict:
    """Best triad bandwidth (GB/s, 1e9 bytes) in this process, with `threads` torch threads."""
    import torch

    torch.set_num_threads(threads)
    cpu = sorted(os.sched_getaffinity(0))[0]
    size = size_bytes or array_bytes(last_level_cache_bytes(cpu))
    n = size // 8
    a, b, c = (torch.full((n,), v, dtype=torch.float64) for v in (0.0, 1.0, 2.0))  # touched: pages mapped
    best = float("inf")
    passes = 0
    deadline = time.perf_counter() + min_seconds
    torch.add(b, c, alpha=3.0, out=a)  # first pass: thread pool start
    while passes < MIN_PASSES or time.perf_counter() < deadline:
        start = time.perf_counter()
        torch.add(b, c, alpha=3.0, out=a)
        best = min(best, time.perf_counter() - start)
        passes += 1
    if float(a[n // 2]) != 7.0:
        raise RuntimeError("triad computed a wrong result")
    return {"gbps": 3 * 8 * n / best / 1e9, "library": LIBRARY, "threads": threads, "array_bytes": 8 * n,
            "passes": passes, "method_version": METHOD_VERSION}
