"""The deployment snippet of `backend=onnxruntime`: the session corescale measured, on the exported model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from corescale.backends.onnxruntime.options import OnnxRuntimeOptions
from corescale.backends.options import options_as

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig

LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
          "all": "ORT_ENABLE_ALL"}
MODES = {"sequential": "ORT_SEQUENTIAL", "parallel": "ORT_PARALLEL"}


def snippet(cfg: BenchmarkConfig, threads: int, model: str) -> str:
    o = options_as(cfg.backend, OnnxRuntimeOptions)
    steps = ["import onnxruntime as ort", "", model + 'MODEL = "model.onnx"  # torch.onnx.export of the model'
             " (corescale caches its export under cache_dir)"]
    if o.fusion:
        steps += ["from onnxruntime.transformers.optimizer import optimize_model",
                  'optimize_model(MODEL, model_type="bert", opt_level=0).save_model_to_file("fused.onnx")',
                  'MODEL = "fused.onnx"']
    if cfg.precision == "int8":
        steps += int8_steps(o)
    steps += ["options = ort.SessionOptions()",
              f"options.graph_optimization_level = ort.GraphOptimizationLevel.{LEVELS[o.graph_optimization_level]}",
              f"options.execution_mode = ort.ExecutionMode.{MODES[o.execution_mode]}",
              f"options.intra_op_num_threads = {threads}", f"options.inter_op_num_threads = {cfg.interop_threads}",
              'session = ort.InferenceSession(MODEL, options, providers=["CPUExecutionProvider"])']
    return "\n".join(steps) + "\n"


def int8_steps(o) -> list[str]:
    """The int8 artifact's build, with the options that shape it (corescale.backends.calibration's texts and
    node names: the run's record holds the calibration texts' origin and digest)."""
    common = (f"per_channel={o.per_channel}, weight_type=QuantType.QInt8,\n"
              f"    nodes_to_exclude=kept_fp32([n.name for n in onnx.load(MODEL).graph.node], {o.keep_fp32!r}))")
    steps = ["import onnx", "from corescale.backends.calibration import kept_fp32"]
    if o.quantization == "dynamic":
        return steps + ["from onnxruntime.quantization import QuantType, quantize_dynamic",
                        f'quantize_dynamic(MODEL, "int8.onnx", {common}', 'MODEL = "int8.onnx"']
    method = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}[o.calibration]
    return steps + [
        "from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, "
        "quantize_static",
        "# FEEDS: one dict of input arrays per calibration text (batch 1, padded to the measured sequence length;",
        f"# corescale.backends.calibration.calibration_feeds builds the {o.calibration_samples} it used)",
        "class Texts(CalibrationDataReader):",
        "    def __init__(self):", "        self.left = iter(FEEDS)",
        "    def get_next(self):", "        return next(self.left, None)",
        f'quantize_static(MODEL, "int8.onnx", Texts(), quant_format=QuantFormat.QDQ, op_types_to_quantize=["MatMul"],\n'
        f"    calibrate_method=CalibrationMethod.{method}, activation_type=QuantType.QUInt8, {common}",
        'MODEL = "int8.onnx"']
