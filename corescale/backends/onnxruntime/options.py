"""Options of `backend=onnxruntime`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from corescale.backends.options import KEEP_FP32, ONNX_EXPORT, BackendEntry, Int8Options, Profiler
from corescale.workload.tasks import HEADS

GRAPH_OPTIMIZATION_LEVELS = ("disable", "basic", "extended", "all")
EXECUTION_MODES = ("sequential", "parallel")
QUANTIZATIONS = ("dynamic", "static")  # quantize_dynamic; quantize_static (QDQ) calibrated on real text
CALIBRATIONS = ("minmax", "entropy", "percentile")  # onnxruntime's CalibrationMethod


@dataclass
class OnnxRuntimeOptions(Int8Options):
    name: str = "onnxruntime"
    graph_optimization_level: str = "all"
    execution_mode: str = "sequential"
    fusion: bool = False  # onnxruntime's transformer optimizer: Attention, SkipLayerNormalization, BiasGelu
    quantization: str = "dynamic"  # int8: QUANTIZATIONS
    calibration: str = "minmax"  # static int8: how activation ranges are taken from the calibration texts
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"graph_optimization_level": GRAPH_OPTIMIZATION_LEVELS,
                                                     "execution_mode": EXECUTION_MODES,
                                                     "quantization": QUANTIZATIONS, "calibration": CALIBRATIONS,
                                                     "keep_fp32": KEEP_FP32}
    CALIBRATED: ClassVar[tuple[str, ...]] = ("calibration_samples", "calibration")
    TUNED: ClassVar[dict[str, list[str]]] = {"quantization": list(QUANTIZATIONS), "per_channel": ["false", "true"],
                                             "keep_fp32": ["none", "ffn_output"]}
    RENAMED: ClassVar[dict[str, str]] = {"ort_graph_optimization_level": "graph_optimization_level",
                                         "ort_execution_mode": "execution_mode", "ort_fusion": "fusion"}


ONNXRUNTIME = BackendEntry(
    options=OnnxRuntimeOptions, backend="corescale.backends.onnxruntime.backend:OnnxRuntimeBackend",
    extra="onnxruntime", requires=("onnxruntime", "onnx"), precisions=("fp32", "int8"), openmp=False,
    forkable=True, worker_modules=("onnxruntime", "corescale.backends.onnxruntime.backend"),  # onnx: only info()
    artifacts=(ONNX_EXPORT,),
    profiler=Profiler("ONNX Runtime profiling (SessionOptions.enable_profiling)",
                      "corescale.backends.onnxruntime.profiler:OnnxRuntimeProfiler"),
    libraries=("onnxruntime", "onnx"), recorded=(), snippet="corescale.backends.onnxruntime.recipe:snippet",
    onednn_linear=False, heads=HEADS,
    model_files=("onnx",),
    shape_warm_calls=1)  # measured: its first call at each new shape is as fast as the next (within 10 %)
