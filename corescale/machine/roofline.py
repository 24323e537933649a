"""Where a run stands on the roofline: attainable GFLOP/s = min(GEMM peak, intensity x memory bandwidth).

The peak is the best measured GEMM on the instance's CPUs (peak.py), the bandwidth the triad measured on them
(bandwidth.py), the intensity the model's FLOPs per byte of its minimum memory traffic at the run's shape and
precision (workload/flops.py, workload/memory.py). With several instances every roof is the sum of theirs.
"""

from __future__ import annotations


def attainable(intensity: float, peak_gflops: float, bandwidth_gbps: float) -> tuple[float, str]:
    """(GFLOP/s attainable at this intensity, the roof that binds: "compute" or "memory")."""
    memory = intensity * bandwidth_gbps
    return (peak_gflops, "compute") if peak_gflops <= memory else (memory, "memory")


def position(achieved_gflops: float, flops_per_call: float, bytes_per_call: float,
             peaks: list[dict | None]) -> dict | None:
    """The run's roofline position, or None when a roof of any instance was not measured."""
    known = [p for p in peaks if p is not None]
    bandwidths = [(p.get("bandwidth") or {}).get("gbps") for p in known]
    rates = [p.get("gflops") for p in known]
    if not peaks or len(known) < len(peaks) or not all(rates) or not all(bandwidths) or bytes_per_call <= 0:
        return None
    intensity = flops_per_call / bytes_per_call
    peak, bandwidth = float(sum(float(r) for r in rates if r)), float(sum(float(b) for b in bandwidths if b))
    roof, bound = attainable(intensity, peak, bandwidth)
    libraries = sorted({str(p["library"]) for p in known if p.get("library")})
    return {"intensity_flops_per_byte": intensity, "bytes_per_call": float(bytes_per_call),
            "peak_gflops": peak, "peak_library": "+".join(libraries) or None,
            "bandwidth_gbps": bandwidth, "bandwidth_library": known[0]["bandwidth"].get("library"),
            "ridge_flops_per_byte": peak / bandwidth, "attainable_gflops": roof, "bound": bound,
            "achieved_gflops": achieved_gflops, "fraction_of_attainable": achieved_gflops / roof}
