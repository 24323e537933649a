"""What a measured layout would do on a catalog machine kind: copies that fit × per-copy rate, capped by memory.

From one measured result (per-instance samples/s at its cores per instance, the model's memory traffic per
sample from the roofline) and a catalog kind (physical cores, SMT, ISA, memory bandwidth):
- copies = the kind's physical cores ÷ the layout's physical cores per instance (a vCPU price hides SMT: the
  projection counts physical cores; a layout measured on SMT siblings needs a kind with as many threads a core);
- rate = copies × the measured per-instance rate, capped at the kind's memory bandwidth ÷ traffic per sample
  (copies that stream their weights share the channels; latency then grows by the same factor);
- the ISA: the precision's GEMM runs on the best instruction tier each CPU has (int8: AMX > AVX-512 VNNI > ...).
  Where the kind's tier differs from the measured one the projection is a range: the rate may move by anything
  up to the tiers' per-cycle peak ratio (all time in GEMMs) or not at all (none).
- what the model cannot know is a range with its reason, never one number: another vendor or microarchitecture
  (Intel AVX-512 → Zen 4, whose AVX-512 FMAs are half as wide; Zen 4 → Zen 5; Neoverse V1 → N2) and another
  architecture (x86-64 → aarch64: other kernels altogether) give ×UNKNOWN_CORE (0.5–1) of the measured per-core
  rate, times the tiers' range.
- a multiplication of the measured instances by EXTRAPOLATION (8) or more is flagged; where the results measured
  the layout at several instance counts, the slow end is multiplied by that measured scaling efficiency.
Every figure made here is labelled a projection; only the measured machine's own figures are measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from corescale.analysis.catalog import Machine, arch_of
from corescale.machine.precisions import PRECISIONS, REFERENCE

MEASURED, PROJECTED, REFUSED = "measured", "projected", "refused"
UNKNOWN_CORE = (0.5, 1.0)  # the per-core rate on another vendor, microarchitecture or architecture: not known
EXTRAPOLATION = 8  # copies ÷ measured instances from which the multiplication is flagged


def tier(isa: frozenset[str], arch: str, precision: str) -> tuple[str, float] | None:
    """(the best tier the CPU has for the precision's GEMMs, its relative peak: its entry's tiers, the reference's
    for a precision not registered here); None: no tier known."""
    ladder = PRECISIONS.get(precision, PRECISIONS[REFERENCE]).tiers.get(arch, ())
    return next(((name, peak) for name, peak in ladder if name in isa or name == "neon" and arch == "aarch64"), None)


@dataclass(frozen=True)
class LayoutRate:
    """What one measured result says about its layout (from a results row)."""

    per_instance: float  # samples/s of one instance
    cores_per_instance: int  # physical cores one instance occupies
    threads_per_core: int  # 1, or the SMT siblings the layout used per core
    precision: str
    isa: frozenset[str]
    arch: str
    bytes_per_sample: float | None  # minimum memory traffic per sample (roofline); None: not measured
    p99_ms: float | None
    tokens_per_sample: float | None  # real tokens per sample (tokens/s ÷ samples/s)
    cpu_model: str = ""  # the measured CPU's model name
    instances: int = 1  # instances measured
    scaling_efficiency: float | None = None  # per-instance rate at the most instances ÷ at one (None: not measured)


@dataclass
class Projection:
    """A measured layout on one kind: samples/s from `low` to `high` (equal: one number), or refused."""

    basis: str  # measured | projected | refused
    copies: int = 0
    low: float = 0.0
    high: float = 0.0
    p99_low_ms: float | None = None
    p99_high_ms: float | None = None
    flags: list[str] = field(default_factory=list)
    reason: str = ""  # why refused (or why nothing fits)

    @property
    def is_range(self) -> bool:
        return self.basis == PROJECTED and not math.isclose(self.low, self.high, rel_tol=1e-9)


def measured_of(row) -> LayoutRate:
    """The per-instance facts of one results row (store.flatten's columns)."""
    instances = int(row.get("instances") or 1)
    logical = bool(row.get("use_logical_cores"))
    per_core = int(row.get("host_logical_cpus") or 1) // max(int(row.get("host_physical_cores") or 1), 1)
    threads = max(per_core, 1) if logical else 1
    cpus = int(row.get("cpus_per_instance") or 0)
    bytes_call, batch = _number(row.get("roofline_bytes_per_call")), _number(row.get("instance_batch_size")) or 1
    samples, tokens = _number(row.get("throughput_samples_per_s")), _number(row.get("throughput_tokens_per_s"))
    isa = frozenset(str(row.get("cpu_isa") or "").split())
    return LayoutRate(
        per_instance=(samples or 0.0) / instances, cores_per_instance=max(math.ceil(cpus / threads), 1),
        threads_per_core=threads, precision=str(row.get("precision") or REFERENCE), isa=isa, arch=arch_of(isa),
        bytes_per_sample=bytes_call / batch if bytes_call else None, p99_ms=_number(row.get("latency_p99_ms")),
        tokens_per_sample=tokens / samples if tokens and samples else None, cpu_model=str(row.get("cpu_model") or ""),
        instances=instances)


def _number(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def project(measured: LayoutRate, kind: Machine) -> Projection:
    """The layout copied onto `kind`'s physical cores, capped by its memory bandwidth, ISA-checked."""
    flags: list[str] = []
    if not measured.isa:
        return Projection(REFUSED, reason="the measured CPU's ISA is not recorded")
    if not kind.isa or not kind.arch:
        return Projection(REFUSED, reason=f"{kind.name}'s ISA is not in the catalog")
    if measured.threads_per_core > kind.smt:
        return Projection(REFUSED, reason=f"measured on {measured.threads_per_core} SMT threads a core; "
                                          f"{kind.name} has {kind.smt}")
    copies = kind.physical_cores // measured.cores_per_instance
    if copies == 0:
        return Projection(PROJECTED, 0, flags=flags, reason=f"{measured.cores_per_instance} cores per instance do "
                                                             f"not fit on {kind.physical_cores}")
    if kind.smt == 1:
        flags.append("no SMT: every vCPU is a physical core")
    slow, fast = isa_factors(measured, kind, flags) if kind.arch == measured.arch else (1.0, 1.0)
    core_slow, core_fast = core_factors(measured, kind, flags)
    slow, fast = slow * core_slow, fast * core_fast
    linear = copies * measured.per_instance
    low, high, stretch = linear * slow, linear * fast, 1.0
    times = copies / max(measured.instances, 1)
    if times >= EXTRAPOLATION:
        efficiency = measured.scaling_efficiency
        known = (f"; the slow end × the measured scaling efficiency {efficiency:.2g} ({measured.instances} "
                 "instances against 1)") if efficiency is not None and efficiency < 1 else \
            "; scaling beyond the measured cores was not measured"
        flags.append(f"extrapolated ×{times:.0f}: {copies} copies from {measured.instances} measured instance(s) "
                     f"on {measured.instances * measured.cores_per_instance} core(s){known}")
        if efficiency is not None and efficiency < 1:
            low *= efficiency
    cap = bandwidth_cap(measured, kind, flags)
    if cap is not None and cap < high:
        flags.append(f"memory-bound: capped at {cap:.4g} samples/s by {kind.bandwidth_gbps:.0f} GB/s")
        stretch = max(low / cap, 1.0)
        low, high = min(low, cap), cap
    p99 = measured.p99_ms
    return Projection(PROJECTED, copies, low, high, None if p99 is None else p99 / fast,
                      None if p99 is None else p99 / slow * stretch, flags)


def core_factors(measured: LayoutRate, kind: Machine, flags: list[str]) -> tuple[float, float]:
    """(slowest, fastest) per-core rate on the kind relative to the measured one from what the ISA tiers do not
    say: the same CPU model, or the same vendor and microarchitecture (1, 1), else UNKNOWN_CORE with the reason in
    the flags."""
    from corescale.analysis.catalog import family_of, vendor_of

    low, high = UNKNOWN_CORE
    if measured.cpu_model and measured.cpu_model == kind.cpu_model and kind.arch == measured.arch:
        return 1.0, 1.0  # the measured CPU itself (the catalog need not know it)
    there = f"{kind.cpu_text} ({vendor_of(kind.cpu_model) or 'vendor unknown'})"
    if kind.arch != measured.arch:
        flags.append(f"another architecture ({measured.arch} → {kind.arch}, {kind.cpu_text}): other kernels "
                     f"altogether; ×{low:g}–×{high:g} of the measured per-core rate assumed, not known: measure it "
                     "there")
        return low, high
    here_vendor, here_family = vendor_of(measured.cpu_model), family_of(measured.cpu_model)
    if here_vendor != vendor_of(kind.cpu_model):
        flags.append(f"another vendor ({here_vendor or 'unknown'} → {there}): the per-core speed at the same "
                     f"instruction tier differs (Zen 4's AVX-512 FMAs are half as wide as Intel's); ×{low:g}–×{high:g}")
        return low, high
    if not here_family or here_family != kind.family:
        flags.append(f"another microarchitecture ({here_family or 'measured CPU not in the catalog'} → "
                     f"{kind.cpu_text}): per-core speed not known; ×{low:g}–×{high:g}")
        return low, high
    return 1.0, 1.0


def isa_factors(measured: LayoutRate, kind: Machine, flags: list[str]) -> tuple[float, float]:
    """(slowest, fastest) per-copy rate on the kind relative to the measured one, from the precision's tiers."""
    here = tier(measured.isa, measured.arch, measured.precision)
    there = tier(kind.isa, kind.arch, measured.precision)
    if here is None or there is None:
        flags.append(f"no {measured.precision} instruction tier known: ISA assumed equivalent")
        return 1.0, 1.0
    if here[0] == there[0]:
        return 1.0, 1.0
    ratio = there[1] / here[1]
    flags.append(f"ISA differs: {measured.precision} GEMMs on {there[0]} there, {here[0]} here (peak ×{ratio:.2g})")
    return min(ratio, 1.0), max(ratio, 1.0)


def bandwidth_cap(measured: LayoutRate, kind: Machine, flags: list[str]) -> float | None:
    """The most samples/s the kind's memory can feed (None: traffic or bandwidth unknown, said in flags)."""
    if measured.bytes_per_sample is None:
        flags.append("no memory cap: the model's traffic was not measured (calibrate=false)")
        return None
    if kind.bandwidth_gbps is None:
        flags.append(f"no memory cap: {kind.bandwidth_basis or 'bandwidth unknown'}")
        return None
    return kind.bandwidth_gbps * 1e9 / measured.bytes_per_sample
