"""The deployment snippet of `backend=onnxruntime`: the session corescale measured, on the exported model."""

from __future__ import annotations

LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
          "all": "ORT_ENABLE_ALL"}
MODES = {"sequential": "ORT_SEQUENTIAL", "parallel": "ORT_PARALLEL"}


def snippet(cfg, threads: int, model: str) -> str:
    o = cfg.backend
    steps = ["import onnxruntime as ort", "", model + 'MODEL = "model.onnx"  # torch.onnx.export of the model'
             " (corescale caches its export under cache_dir)"]
    if o.fusion:
        steps += ["from onnxruntime.transformers.optimizer import optimize_model",
                  'optimize_model(MODEL, model_type="bert", opt_level=0).save_model_to_file("fused.onnx")',
                  'MODEL = "fused.onnx"']
    if cfg.precision == "int8":
        steps += ["from onnxruntime.quantization import QuantType, quantize_dynamic",
                  'quantize_dynamic(MODEL, "int8.onnx", weight_type=QuantType.QInt8)', 'MODEL = "int8.onnx"']
    steps += ["options = ort.SessionOptions()",
              f"options.graph_optimization_level = ort.GraphOptimizationLevel.{LEVELS[o.graph_optimization_level]}",
              f"options.execution_mode = ort.ExecutionMode.{MODES[o.execution_mode]}",
              f"options.intra_op_num_threads = {threads}", f"options.inter_op_num_threads = {cfg.interop_threads}",
              'session = ort.InferenceSession(MODEL, options, providers=["CPUExecutionProvider"])']
    return "\n".join(steps) + "\n"
