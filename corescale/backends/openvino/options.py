"""Options of `backend=openvino`."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from corescale.backends.options import ONNX_EXPORT, TASKS, BackendEntry, BackendOptions, Profiler

PERFORMANCE_HINTS = ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT")


@dataclass
class OpenVinoOptions(BackendOptions):
    name: str = "openvino"
    performance_hint: str = "LATENCY"
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"performance_hint": PERFORMANCE_HINTS}
    RENAMED: ClassVar[dict[str, str]] = {"ov_performance_hint": "performance_hint"}

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
    requires=("openvino", "onnx"), precisions=("fp32", "bf16"), openmp=False, forkable=True,
    worker_modules=("openvino", "corescale.backends.openvino.backend"), artifacts=(ONNX_EXPORT,),
    profiler=Profiler("OpenVINO per-layer performance counters (PERF_COUNT)",
                      "corescale.backends.openvino.profiler:OpenVinoProfiler"),
    libraries=("openvino", "onnx"), recorded=(), snippet="corescale.backends.openvino.recipe:snippet",
    onednn_linear=False, tasks=TASKS,
    model_files=("onnx", "openvino-ir"))
