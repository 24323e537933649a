"""OpenVINO's int8 artifact, built with NNCF from the ONNX export and saved as an IR (model.xml + model.bin):
`static` is nncf.quantize (the transformer preset: SmoothQuant, int8 MatMuls, fast bias correction) calibrated on
real text; `weights_asym` / `weights_sym` is nncf.compress_weights (int8 weights, per channel; activations stay
f32)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import openvino as ov

from corescale.backends.calibration import calibration_feeds, kept_fp32
from corescale.backends.openvino.options import OpenVinoOptions
from corescale.backends.options import options_as

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig


def int8_step(spec, cfg: BenchmarkConfig, core: ov.Core, model_path, input_names):
    """(variant, builder, what the record says of it); the variant names every option that shapes the artifact
    and the calibration texts' digest."""
    import nncf

    o = options_as(cfg.backend, OpenVinoOptions)
    names = [op.get_friendly_name() for op in core.read_model(str(model_path)).get_ops()]
    ignored = kept_fp32(names, o.keep_fp32)
    facts = {"quantization": o.quantization, "keep_fp32": o.keep_fp32, "fp32_nodes": len(ignored),
             "nncf": nncf.__version__}
    if o.quantization != "static":
        return f"int8-{o.quantization}-keep-{o.keep_fp32}", compress(o, ignored), facts
    feeds, origin, digest = calibration_feeds(spec, cfg, input_names)
    facts.update(per_channel=o.per_channel, calibration_samples=len(feeds), calibration_texts=origin,
                 calibration_digest=digest)
    variant = f"int8-static-pc{int(o.per_channel)}-keep-{o.keep_fp32}-n{len(feeds)}-{digest}"
    return variant, quantize(o, ignored, feeds), facts


def _quiet(nncf) -> None:
    nncf.set_log_level(logging.ERROR)  # its per-layer INFO lines and tables would fill the worker's log


def quantize(options, ignored: list[str], feeds: list[dict]):
    def build(source, target, large) -> None:
        import nncf
        from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, QuantizationParameters

        _quiet(nncf)
        weights = QuantizationParameters(per_channel=options.per_channel)
        quantized = nncf.quantize(ov.Core().read_model(str(source)), nncf.Dataset(feeds),
                                  model_type=nncf.ModelType.TRANSFORMER, subset_size=len(feeds),
                                  ignored_scope=nncf.IgnoredScope(names=ignored, validate=False),
                                  advanced_parameters=AdvancedQuantizationParameters(
                                      weights_quantization_params=weights))
        ov.save_model(quantized, str(target), compress_to_fp16=False)
    return build


def compress(options, ignored: list[str]):
    def build(source, target, large) -> None:
        import nncf

        _quiet(nncf)
        mode = {"weights_asym": nncf.CompressWeightsMode.INT8_ASYM,
                "weights_sym": nncf.CompressWeightsMode.INT8_SYM}[options.quantization]
        compressed = nncf.compress_weights(ov.Core().read_model(str(source)), mode=mode,
                                           ignored_scope=nncf.IgnoredScope(names=ignored, validate=False))
        ov.save_model(compressed, str(target), compress_to_fp16=False)
    return build
