"""The deployment snippet of `backend=openvino`: the compiled model corescale measured, on the exported model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from corescale.backends.openvino.options import OpenVinoOptions
from corescale.backends.options import options_as

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig


def snippet(cfg: BenchmarkConfig, threads: int, model: str) -> str:
    precision = {"fp32": "f32", "bf16": "bf16"}.get(cfg.precision, "f32")
    options = options_as(cfg.backend, OpenVinoOptions)
    steps = int8_steps(options) if cfg.precision == "int8" else ""
    source = "int8" if steps else 'core.read_model("model.onnx")'
    return (f"import openvino as ov\n\n{model}core = ov.Core()\n{steps}compiled = core.compile_model({source}, "
            f'"CPU", {{\n    "INFERENCE_NUM_THREADS": {threads}, "NUM_STREAMS": 1,\n'
            f'    "PERFORMANCE_HINT": "{options.performance_hint}", "INFERENCE_PRECISION_HINT": '
            f'"{precision}",\n}})\nrequest = compiled.create_infer_request()\n')


def int8_steps(o) -> str:
    """The int8 IR's build with NNCF (corescale.backends.calibration's texts and node names; the run's record holds
    the calibration texts' origin and digest)."""
    lines = ["import nncf", "from corescale.backends.calibration import kept_fp32",
             'fp32 = core.read_model("model.onnx")',
             f"scope = nncf.IgnoredScope(names=kept_fp32([op.get_friendly_name() for op in fp32.get_ops()], "
             f"{o.keep_fp32!r}), validate=False)"]
    if o.quantization == "static":
        lines += ["from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, "
                  "QuantizationParameters",
                  f"# FEEDS: one dict of input arrays per calibration text ({o.calibration_samples}, batch 1, padded "
                  "to the measured length: corescale.backends.calibration.calibration_feeds)",
                  "int8 = nncf.quantize(fp32, nncf.Dataset(FEEDS), model_type=nncf.ModelType.TRANSFORMER, "
                  f"subset_size={o.calibration_samples}, ignored_scope=scope,",
                  "    advanced_parameters=AdvancedQuantizationParameters(weights_quantization_params="
                  f"QuantizationParameters(per_channel={o.per_channel})))"]
    else:
        mode = {"weights_asym": "INT8_ASYM", "weights_sym": "INT8_SYM"}[o.quantization]
        lines.append(f"int8 = nncf.compress_weights(fp32, mode=nncf.CompressWeightsMode.{mode}, ignored_scope=scope)")
    return "\n".join(lines) + "\n"
