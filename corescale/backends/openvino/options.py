"""Options of `backend=openvino`."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from corescale.backends.options import KEEP_FP32, ONNX_EXPORT, BackendEntry, CheckedSettings, Int8Options, Profiler
from corescale.errors import UserError
from corescale.workload.tasks import HEADS

PERFORMANCE_HINTS = ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT")
# nncf.quantize (int8 weights and activations, calibrated on real text); nncf.compress_weights (int8 weights only)
QUANTIZATIONS = ("static", "weights_asym", "weights_sym")


@dataclass
class OpenVinoOptions(Int8Options):
    name: str = "openvino"
    performance_hint: str = "LATENCY"
    quantization: str = "static"  # int8: QUANTIZATIONS
    per_channel: bool = True  # static: NNCF's default, one scale per output channel of each weight
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"performance_hint": PERFORMANCE_HINTS,
                                                     "quantization": QUANTIZATIONS, "keep_fp32": KEEP_FP32}
    CALIBRATED: ClassVar[tuple[str, ...]] = ("calibration_samples", "per_channel")  # weights_*: always per channel
    TUNED: ClassVar[dict[str, list[str]]] = {"quantization": ["static", "weights_asym"],
                                             "keep_fp32": ["none", "ffn_output"]}
    RENAMED: ClassVar[dict[str, str]] = {"ov_performance_hint": "performance_hint"}

    def check(self, cfg: CheckedSettings) -> None:
        super().check(cfg)
        if cfg.precision == "int8" and importlib.util.find_spec("nncf") is None:
            raise UserError("precision=int8 on openvino is built with NNCF, which is not installed: "
                            "pip install 'corescale[openvino]' (or nncf)")

    def allocator_companions(self) -> list[Path]:
        """The hwloc bundled with OpenVINO's TBB (loaded by tbbbind when the Core starts) frees with glibc's free()
        memory the preloaded allocator gave: "free(): invalid pointer", SIGABRT (OpenVINO 2026.4, jemalloc and
        tcmalloc alike). Preloading that hwloc binds its malloc and free to the allocator."""
        spec = importlib.util.find_spec("openvino")  # finds the package without importing it
        if spec is None or not spec.submodule_search_locations:
            return []
        return sorted(p for d in spec.submodule_search_locations for p in Path(d, "libs").glob("libhwloc.so*")
                      if p.is_file())[:1]


OPENVINO = BackendEntry(
    options=OpenVinoOptions, backend="corescale.backends.openvino.backend:OpenVinoBackend", extra="openvino",
    requires=("openvino", "onnx"), precisions=("fp32", "bf16", "int8"), openmp=False, forkable=True,
    worker_modules=("openvino", "corescale.backends.openvino.backend"), artifacts=(ONNX_EXPORT,),
    profiler=Profiler("OpenVINO per-layer performance counters (PERF_COUNT)",
                      "corescale.backends.openvino.profiler:OpenVinoProfiler"),
    libraries=("openvino", "onnx"), recorded=(), snippet="corescale.backends.openvino.recipe:snippet",
    onednn_linear=False, heads=HEADS,
    model_files=("onnx", "openvino-ir"), keeps_compiled=True,  # backends/openvino/compiled.py
    shape_warm_calls=1)  # measured: the first call at a new shape costs ~1.4x the next, the second is as fast as the
# third (median over the 24 shapes of the demo's int8 bundle: max batch 32, four bucket lengths)
