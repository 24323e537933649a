"""The machine's real peak: the best measured GEMM rate on an instance's CPUs, per thread count and precision.

"% of peak" is against the best of several GEMM implementations, never one library's view of the hardware: on
AMD CPUs torch.mm goes through MKL, whose AVX2 kernels reach about half of what oneDNN or OpenBLAS reach there
with AVX-512. Measured here:

- `torch_mm`      torch.mm (MKL on x86 for fp32; oneDNN for bf16)
- `torch_onednn`  torch's own oneDNN linear on a prepacked weight (`torch.ops.mkldnn._linear_pointwise`)
- `openvino`      an OpenVINO MatMul model on the CPU plugin (when openvino is installed)
- `numpy`         numpy's BLAS as the environment configures it (the OPENBLAS_* variables are left alone)
- `torch_int_mm`  torch._int_mm, int8 x int8 -> int32 (int8 only)

Which libraries measure a precision, in which type, and on which CPUs it is measured at all are its registry
entry's facts (machine/precisions.py: peak_libraries, gemm_dtype, computes): bf16 and int8 are measured only where
the ISA has them (avx512_bf16/amx_bf16; avx512_vnni/avx_vnni/amx_int8); elsewhere a run at that precision computes
in fp32 and the fp32 peak is its yardstick (the record says so).
Results are cached per machine + software fingerprint under `<cache_dir>/peak/`, one file per (CPUs, threads,
precision), so a run, a sweep or another day re-measures nothing; `corescale info --peak` measures again.
The analytic ISA peak (FMA units x vector lanes x 2 x clock x cores) is reported beside it, as an upper bound.
Importing this module imports no framework: the measuring functions import theirs when called (in a worker).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import time
from pathlib import Path
from typing import Callable

from corescale.errors import UserError
from corescale.machine.cpulist import format_cpulist
from corescale.machine.environment import CpuInfo
from corescale.machine.instance_env import unbind_calling_thread
from corescale.machine.precisions import PRECISIONS, REFERENCE

METHOD_VERSION = 1  # bump when the way the peak is measured changes: old cache entries are then ignored
LIBRARIES = ("torch_mm", "torch_onednn", "openvino", "numpy", "torch_int_mm")
SOFTWARE = ("torch", "numpy", "openvino")  # whose versions decide the measured rates
MIN_SECONDS = 0.3  # per library: best of the calls within this long (at least 3)


def gemm_size(threads: int) -> int:
    """Square GEMM size large enough to keep `threads` threads busy (and well past the caches)."""
    return 1024 if threads <= 2 else 2048 if threads <= 16 else 4096


def peak_precision(precision: str, isa: dict[str, bool]) -> str:
    """The precision whose peak bounds a run: the run's own where the ISA computes in it natively, else the
    reference's (fp32)."""
    return precision if PRECISIONS[precision].native(isa) else REFERENCE


# --- measuring (in the process whose CPUs and threads are measured) ---------------------------------------------

def _best_rate(call: Callable[[], object], flops: float, min_seconds: float) -> float:
    call()  # first call: allocation, packing, JIT
    best = float("inf")
    deadline = time.perf_counter() + min_seconds
    reps = 0
    while reps < 3 or time.perf_counter() < deadline:
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
        reps += 1
    return flops / best / 1e9


def _torch_operands(n: int, precision: str):
    import torch

    dtype = getattr(torch, PRECISIONS[precision].gemm_dtype)
    return torch.rand(n, n, dtype=torch.float32).to(dtype), torch.rand(n, n, dtype=torch.float32).to(dtype)


def torch_mm(n: int, threads: int, precision: str) -> Callable[[], object]:
    import torch

    torch.set_num_threads(threads)
    a, b = _torch_operands(n, precision)
    return lambda: torch.mm(a, b)


def torch_onednn(n: int, threads: int, precision: str) -> Callable[[], object]:
    import torch

    from corescale.machine import onednn

    torch.set_num_threads(threads)
    a, b = _torch_operands(n, precision)
    packed = onednn.pack_weight(b)
    return lambda: onednn.linear(a, packed, None)


def torch_int_mm(n: int, threads: int, precision: str) -> Callable[[], object]:
    import torch

    torch.set_num_threads(threads)
    a = torch.randint(-128, 127, (n, n), dtype=torch.int8)
    b = torch.randint(-128, 127, (n, n), dtype=torch.int8)
    return lambda: torch._int_mm(a, b)


OPENVINO_TYPES = {"bfloat16": "bf16", "float16": "f16"}  # a gemm_dtype -> OpenVINO's inference precision hint


def openvino(n: int, threads: int, precision: str) -> Callable[[], object]:
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    param = ops.parameter([n, n], ov.Type.f32, name="a")
    weight = ops.constant(np.random.default_rng(0).random((n, n), dtype=np.float32))
    model = ov.Model([ops.matmul(param, weight, False, False)], [param], "gemm")
    config = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY",
              "INFERENCE_PRECISION_HINT": OPENVINO_TYPES.get(PRECISIONS[precision].gemm_dtype, "f32")}
    request = ov.Core().compile_model(model, "CPU", config).create_infer_request()
    data = np.random.default_rng(1).random((n, n), dtype=np.float32)
    return lambda: request.infer({"a": data}, share_inputs=True, share_outputs=True)


def numpy(n: int, threads: int, precision: str) -> Callable[[], object]:
    import numpy as np
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads, user_api="blas")  # for the rest of this (short-lived) process
    rng = np.random.default_rng(0)
    a, b = rng.random((n, n), dtype=np.float32), rng.random((n, n), dtype=np.float32)
    return lambda: a @ b


def blas_info() -> list[dict]:
    """Which BLAS numpy runs and with which kernels (threadpoolctl), e.g. OpenBLAS 'Haswell' or 'SkylakeX'."""
    from threadpoolctl import threadpool_info

    return [{k: info.get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
            for info in threadpool_info() if info.get("user_api") == "blas"]


MEASURES = {"torch_mm": torch_mm, "torch_onednn": torch_onednn, "openvino": openvino, "numpy": numpy,
            "torch_int_mm": torch_int_mm}


def gemm_peak(threads: int, precision: str, libraries: tuple[str, ...] | None = None,
            min_seconds: float = MIN_SECONDS) -> dict:
    """Every library's GEMM rate here (this process's CPUs) and the best: the peak of this precision."""
    n = gemm_size(threads)
    rates: dict[str, float] = {}
    errors: dict[str, str] = {}
    for name in libraries or PRECISIONS[precision].peak_libraries:
        unbind_calling_thread()  # torch's GNU OpenMP binds this thread to one CPU; the next pool must not inherit it
        try:
            rates[name] = _best_rate(MEASURES[name](n, threads, precision), 2.0 * n**3, min_seconds)
        except Exception as exc:  # a library that cannot run here is reported, not fatal
            errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
    best = max(rates, key=lambda name: rates[name]) if rates else None
    detail = {}
    if "numpy" in rates:
        detail["numpy"] = blas_info()
    return {"precision": precision, "threads": threads, "size": n, "gflops": rates[best] if best else None,
            "library": best, "libraries": rates, "errors": errors, "detail": detail, "method_version": METHOD_VERSION}


# --- the cache (light: no framework import) ---------------------------------------------------------------------

def fingerprint(cpu: CpuInfo, topology: dict, clocks: dict | None = None) -> str:
    """Machine + software: CPU model and ISA, topology (SMT shows in its logical CPUs), what sets the clock
    (governor, turbo) and the versions of the libraries measured."""
    versions: dict[str, str | None] = {}
    for name in SOFTWARE:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    identity = {"cpu": cpu.model, "isa": cpu.isa, "topology": topology, "versions": versions,
                "method": METHOD_VERSION}
    if clocks:  # only when known: entries of machines without cpufreq keep their fingerprint
        identity["clocks"] = clocks
    blob = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def host_fingerprint() -> str:
    """This machine's: its CPU, topology, what sets its clock (governor, turbo, SMT: a peak taken under another
    one is not this one's) and the inherited variables that change what a calibration runs (MKL_*, OMP_*,
    LD_PRELOAD...: environment.measuring_variables)."""
    from corescale.machine.environment import ENV_NAMES, ENV_PREFIXES, cpuinfo, measuring_variables
    from corescale.machine.topology import Topology, read_text

    topology = Topology.from_sysfs()
    state = {name: (read_text(f"/sys/devices/system/cpu/{path}") or "").strip() or None for name, path in
             (("governor", "cpu0/cpufreq/scaling_governor"), ("no_turbo", "intel_pstate/no_turbo"),
              ("boost", "cpufreq/boost"), ("smt", "smt/control"))}
    env = measuring_variables({k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES) or k in ENV_NAMES})
    return fingerprint(cpuinfo(), {"logical_cpus": len(topology.cpu_ids), "physical_cores":
                                   len(topology.physical_cores), **({"env": env} if env else {})},
                       {name: value for name, value in state.items() if value is not None})


class PeakCache:
    """<cache_dir>/peak/<fingerprint>/<cpus>-t<threads>-<precision>.json (written by measure/calibrate.py)."""

    def __init__(self, cache_dir, machine: str | None = None):
        self.root = Path(cache_dir).expanduser() / "peak" / (machine or host_fingerprint())

    def path(self, cpus, threads: int, precision: str) -> Path:
        return self.root / f"{format_cpulist(sorted(cpus)) or 'none'}-t{threads}-{precision}.json"

    def get(self, cpus, threads: int, precision: str) -> dict | None:
        """The cached peak; None (measure again) when absent, another method's, malformed or out of range."""
        entry = _read_entry(self.path(cpus, threads, precision))
        ok = (entry is not None and entry.get("method_version") == METHOD_VERSION
              and entry.get("precision", precision) == precision
              and _in_range(entry.get("gflops"), threads * MAX_GFLOPS_PER_THREAD)
              and isinstance(entry.get("library"), (str, type(None)))
              and isinstance(entry.get("libraries", {}), dict)
              and all(isinstance(rate, (int, float)) for rate in entry.get("libraries", {}).values()))
        return entry if ok else None

    def bandwidth_path(self, cpus, threads: int) -> Path:
        """The memory roof (machine/bandwidth.py) beside the peaks."""
        return self.path(cpus, threads, "bandwidth")

    def get_bandwidth(self, cpus, threads: int) -> dict | None:
        from corescale.machine.bandwidth import METHOD_VERSION as BANDWIDTH_VERSION

        entry = _read_entry(self.bandwidth_path(cpus, threads))
        ok = (entry is not None and entry.get("method_version") == BANDWIDTH_VERSION
              and _in_range(entry.get("gbps"), MAX_GBPS))
        return entry if ok else None


MAX_GFLOPS_PER_THREAD = 50_000.0  # beyond any CPU core (AMX int8 peaks near 15 TOP/s a core): a corrupt entry
MAX_GBPS = 50_000.0  # beyond any memory system a CPU has (HBM parts: a few TB/s)


def _read_entry(path: Path) -> dict | None:
    """A cache file's JSON object; None when missing, unreadable, not JSON or not an object."""
    try:
        with open(path, "rb") as handle:
            entry = json.loads(handle.read(1 << 20))
    except (OSError, ValueError, RecursionError):
        return None
    return entry if isinstance(entry, dict) else None


def _in_range(value, limit: float) -> bool:
    """A real, finite number in (0, limit]."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= limit



def check_libraries(names: list[str]) -> tuple[str, ...]:
    """`info --peak --libraries a,b`: known names, each installed (one line otherwise)."""
    unknown = [n for n in names if n not in LIBRARIES]
    if unknown:
        raise UserError(f"unknown peak library {', '.join(unknown)}; allowed: {', '.join(LIBRARIES)}")
    import importlib.util

    needs = {"openvino": "openvino", "numpy": "numpy"}
    missing = [n for n in names if n in needs and importlib.util.find_spec(needs[n]) is None]
    if missing:
        raise UserError(f"peak library {', '.join(missing)} is not installed here (pip install "
                        f"'corescale[{missing[0]}]')")
    return tuple(names)


def analytic_gflops(cpu: CpuInfo, cores: int) -> dict | None:
    """FMA units x lanes x 2 x GHz x cores, assuming 2 full-width FMA units per core; None without a clock."""
    mhz = cpu.max_mhz or cpu.mhz
    if not mhz:
        return None
    isa = cpu.isa
    lanes = 16 if isa.get("avx512f") else 8 if isa.get("avx2") or isa.get("fma") else 4
    per_core = 2 * lanes * 2 * mhz / 1e3
    return {"gflops": per_core * cores, "per_core": per_core, "lanes": lanes, "mhz": mhz,
            "assumes": "2 full-width FMA units per core at the reported clock (an upper bound)"}

