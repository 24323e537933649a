"""The deployment snippet of `backend=openvino`: the compiled model corescale measured, on the exported model."""

from __future__ import annotations


def snippet(cfg, threads: int, model: str) -> str:
    precision = {"fp32": "f32", "bf16": "bf16"}.get(cfg.precision, "f32")
    return (f"import openvino as ov\n\n{model}core = ov.Core()\ncompiled = core.compile_model(core.read_model("
            f'"model.onnx"), "CPU", {{\n    "INFERENCE_NUM_THREADS": {threads}, "NUM_STREAMS": 1,\n'
            f'    "PERFORMANCE_HINT": "{cfg.backend.performance_hint}", "INFERENCE_PRECISION_HINT": '
            f'"{precision}",\n}})\nrequest = compiled.create_infer_request()\n')
