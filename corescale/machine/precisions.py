"""Precision registry: every fact about one precision (`precision=NAME`), declared once, read by every stage.

A precision's facts used to be spread over nine tables (drift, the tune's gate, space and first trials, the
bundle's CPU features, the GEMM peak, memory traffic, the projection's tiers, the roofline's markers); now each
reads its entry here. Nothing outside this module branches on a precision's name (tests/test_layout.py).

Adding a precision: one `register_precision(name, Precision(...))` call, from this module for a built-in one or
from a plug-in module named in CORESCALE_BACKENDS (before the backend that computes in it registers): docs/
adding-a-backend.md, "Adding a precision". Light on purpose: no framework import.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

from corescale.errors import RegistrationError

REFERENCE = "fp32"  # the default precision, and the one every reduced precision is judged against
ARCHES = ("x86_64", "aarch64")  # the architectures a precision's CPU facts are given for

_REQUIRED: Any = object()  # a fact not given: register_precision() names every one missing


@dataclass(frozen=True)
class Precision:
    """Every fact about one precision. docs/adding-a-backend.md ("Adding a precision") explains each."""

    bytes: float = _REQUIRED  # bytes per weight value (the roofline's memory traffic)
    computes: dict[str, tuple[str, ...]] = _REQUIRED  # arch -> CPU flags (machine/environment.py ISA_FLAGS) any
    # one of which computes it natively; {}: every CPU does. Its GEMM peak is measured only where one is present
    requires: dict[str, tuple[str, ...]] = _REQUIRED  # arch -> CPU flags its kernels use: a bundle measured on a
    # CPU with some of them requires those where it is served
    drift_tolerance: float = _REQUIRED  # max_rel_error allowed against the reference backend at REFERENCE
    min_cosine: float = _REQUIRED  # the least cosine similarity against it
    reduced: bool = _REQUIRED  # judged against REFERENCE: the tune's drift gate (encode) or quality gate (a head)
    rank: int = _REQUIRED  # the tune's first trials take a backend's lowest rank first (the fastest)
    anywhere: bool = _REQUIRED  # the tuner offers it on CPUs that do not compute it natively too
    peak_libraries: tuple[str, ...] = _REQUIRED  # machine/peak.py LIBRARIES measuring its GEMM peak
    gemm_dtype: str = _REQUIRED  # the floating type torch and OpenVINO's GEMMs compute it in for the peak
    tiers: dict[str, tuple[tuple[str, float], ...]] = _REQUIRED  # arch -> its GEMMs' instruction tiers, best first
    # (analysis/catalog.py ISA_NAMES), each with its peak per core and cycle relative to the tier marked 1
    integer: bool = False  # computed on integer kernels: a model file whose graph holds integer kernels, (de)quantize
    # nodes or compressed weights is recorded in it (workload/modelfile.py reads the graph, not its config)

    def native(self, isa: Mapping[str, bool]) -> bool:
        """Whether a CPU with these flags computes it natively."""
        return not self.computes or any(isa.get(flag) for flags in self.computes.values() for flag in flags)

    def offered(self, isa: Mapping[str, bool]) -> bool:
        """Whether the tuner may draw it on a CPU with these flags."""
        return self.anywhere or self.native(isa)

    def required(self, isa: Mapping[str, bool]) -> list[str]:
        """The CPU features a bundle measured on a CPU with these flags requires."""
        return [flag for flags in self.requires.values() for flag in flags if isa.get(flag)]

    def check(self, name: str) -> None:
        """Raises RegistrationError naming every missing or malformed fact."""
        missing = [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is _REQUIRED]
        if missing:
            raise RegistrationError(f"precision '{name}' is incomplete: {', '.join(f'{m} missing' for m in missing)} "
                                    "(docs/adding-a-backend.md lists every fact)")
        problems = []
        if not _number(self.bytes):
            problems.append(f"bytes is not a number > 0 (got {self.bytes!r})")
        for fact in ("computes", "requires"):
            if not _per_arch(getattr(self, fact), _names):
                problems.append(f"{fact} is not a mapping of {' or '.join(ARCHES)} to a tuple of CPU flags")
        if not _per_arch(self.tiers, _ladder):
            problems.append(f"tiers is not a mapping of {' or '.join(ARCHES)} to (ISA name, relative peak) pairs")
        if not (_number(self.drift_tolerance) and _number(self.min_cosine) and self.min_cosine <= 1):
            problems.append("drift_tolerance must be > 0 and min_cosine in (0, 1]")
        for fact in ("reduced", "anywhere", "integer"):
            if not isinstance(getattr(self, fact), bool):
                problems.append(f"{fact} is not True or False")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int):
            problems.append(f"rank is not a whole number (got {self.rank!r})")
        if not (_names(self.peak_libraries) and self.peak_libraries):
            problems.append(f"peak_libraries is not a tuple of library names (got {self.peak_libraries!r})")
        if not (isinstance(self.gemm_dtype, str) and self.gemm_dtype):
            problems.append(f"gemm_dtype is not a type name (got {self.gemm_dtype!r})")
        if name == REFERENCE and self.reduced:
            problems.append(f"{REFERENCE} is the reference: it cannot be reduced")
        if problems:
            raise RegistrationError(f"precision '{name}' is malformed: {'; '.join(problems)}")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _names(value) -> bool:
    return isinstance(value, tuple) and all(isinstance(v, str) and v for v in value)


def _ladder(value) -> bool:
    return isinstance(value, tuple) and all(isinstance(t, tuple) and len(t) == 2 and isinstance(t[0], str)
                                            and _number(t[1]) for t in value)


def _per_arch(value, fits) -> bool:
    return isinstance(value, dict) and set(value) <= set(ARCHES) and all(fits(v) for v in value.values())


PRECISIONS: dict[str, Precision] = {}


def integer_precision() -> str | None:
    """The registered precision computed on integer kernels (a quantized model file's), None when none is."""
    return next((name for name, entry in PRECISIONS.items() if entry.integer), None)


def register_precision(name: str, precision: Precision) -> Precision:
    """Adds a precision; an incomplete or malformed entry, or a name taken by another entry, raises
    RegistrationError (the same entry again, a module imported twice, is no error)."""
    if not isinstance(precision, Precision):
        raise RegistrationError(f"precision '{name}': register_precision() takes a Precision "
                                f"(got {type(precision).__name__})")
    if name in PRECISIONS and PRECISIONS[name] != precision:
        raise RegistrationError(f"precision '{name}' is registered already")
    precision.check(name)
    PRECISIONS[name] = precision
    return precision


# GEMM tiers: vendor figures (AMX 2048 int8 / 1024 bf16 ops a cycle, AVX-512 VNNI 256 int8 ops, AVX-512 fp32 64
# FLOP with two FMA units; Arm i8mm's SMMLA doubles SDOT's MACs). Drift: measured on every backend with bert-base
# and a trained MiniLM (docs/backends.md): fp32 stays below 5e-6, bf16 below 3e-2; dynamic int8 below 0.15 on the
# presets' random weights, 0.47-1.24 on the trained model (the default fails it: drift_tolerance= accepts it).
X86_BASE = ("avx2", "fma", "avx512f")
register_precision(REFERENCE, Precision(
    bytes=4, computes={}, requires={"x86_64": X86_BASE}, drift_tolerance=1e-4, min_cosine=0.99999, reduced=False,
    rank=2, anywhere=True, peak_libraries=("torch_mm", "torch_onednn", "openvino", "numpy"), gemm_dtype="float32",
    tiers={"x86_64": (("avx512", 1.0), ("avx2", 0.5)), "aarch64": (("neon", 1.0),)}))
register_precision("bf16", Precision(
    bytes=2, computes={"x86_64": ("avx512_bf16", "amx_bf16"), "aarch64": ("bf16",)},
    requires={"x86_64": (*X86_BASE, "avx512_bf16", "amx_tile", "amx_bf16")}, drift_tolerance=1e-1, min_cosine=0.999,
    reduced=True, rank=1, anywhere=False, peak_libraries=("torch_mm", "torch_onednn", "openvino"),
    gemm_dtype="bfloat16", tiers={"x86_64": (("amx", 8.0), ("avx512_bf16", 1.0), ("avx512", 0.5), ("avx2", 0.25)),
                                  "aarch64": (("bf16", 1.0), ("neon", 0.5))}))
register_precision("int8", Precision(
    bytes=1, computes={"x86_64": ("avx512_vnni", "avx_vnni", "amx_int8"), "aarch64": ("i8mm",)},
    requires={"x86_64": (*X86_BASE, "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8")}, drift_tolerance=2.5e-1,
    min_cosine=0.85, reduced=True, rank=0, anywhere=True, peak_libraries=("torch_int_mm",), gemm_dtype="float32",
    integer=True,
    tiers={"x86_64": (("amx", 8.0), ("avx512_vnni", 1.0), ("avx_vnni", 0.5), ("avx512", 1 / 3), ("avx2", 1 / 6)),
           "aarch64": (("i8mm", 2.0), ("neon", 1.0))}))  # min_cosine: trained models reach 0.86 (docs/backends.md)
