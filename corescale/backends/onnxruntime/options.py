"""Options of `backend=onnxruntime`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from corescale.backends.options import BackendOptions

GRAPH_OPTIMIZATION_LEVELS = ("disable", "basic", "extended", "all")
EXECUTION_MODES = ("sequential", "parallel")


@dataclass
class OnnxRuntimeOptions(BackendOptions):
    name: str = "onnxruntime"
    graph_optimization_level: str = "all"
    execution_mode: str = "sequential"
    fusion: bool = False  # onnxruntime's transformer optimizer: Attention, SkipLayerNormalization, BiasGelu
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"graph_optimization_level": GRAPH_OPTIMIZATION_LEVELS,
                                                     "execution_mode": EXECUTION_MODES}
    # torch only when the export is not cached yet (backends/onnx_export.py)
    worker_modules: ClassVar[tuple[str, ...]] = ("onnxruntime", "onnx", "corescale.backends.onnxruntime.backend")
