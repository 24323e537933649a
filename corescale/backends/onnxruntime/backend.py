"""ONNX Runtime (CPU execution provider) on the cached ONNX export; optional transformer fusion and int8."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

from corescale.backends.base import TimedStages, require_precision, unbind_calling_thread
from corescale.backends.calibration import calibration_feeds, kept_fp32
from corescale.backends.onnx_export import drop_if_hit, onnx_model
from corescale.backends.onnxruntime.options import EXECUTION_MODES as MODE_NAMES
from corescale.backends.onnxruntime.options import GRAPH_OPTIMIZATION_LEVELS as LEVEL_NAMES
from corescale.backends.onnxruntime.options import OnnxRuntimeOptions
from corescale.backends.options import options_as
from corescale.errors import UserError
from corescale.workload.heads import file_head, pool_states

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig

# keyed by the names OnnxRuntimeOptions accepts
GRAPH_OPTIMIZATION_LEVELS = dict(zip(LEVEL_NAMES, (
    ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)))
EXECUTION_MODES = dict(zip(MODE_NAMES, (ort.ExecutionMode.ORT_SEQUENTIAL, ort.ExecutionMode.ORT_PARALLEL)))
# encoders that onnxruntime's transformer optimizer fuses with its model_type "bert"
FUSION_MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "camembert", "distilbert", "electra")


def fuse(spec):
    """Builder for the fused variant: Attention, EmbedLayerNormalization, SkipLayerNormalization, BiasGelu."""
    if spec.model_type not in FUSION_MODEL_TYPES:
        raise UserError(f"backend.fusion=true does not know model type '{spec.model_type}'; "
                        f"supported: {', '.join(FUSION_MODEL_TYPES)}")

    def build(source, target, large):
        from onnxruntime.transformers.optimizer import optimize_model

        optimized = optimize_model(str(source), model_type="bert", num_heads=spec.heads,
                                   hidden_size=spec.hidden, opt_level=0)
        optimized.save_model_to_file(str(target), use_external_data_format=large)
    return build


def quantize(options, nodes_to_exclude: list[str]):
    """Builder of the dynamic int8 variant: int8 weights, activations quantized per call."""
    def build(source, target, large) -> None:
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic

        # fused contrib ops defeat shape inference; their outputs are float
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, use_external_data_format=large,
                         per_channel=options.per_channel, nodes_to_exclude=nodes_to_exclude,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    return build


def quantize_calibrated(options, nodes_to_exclude: list[str], feeds: list[dict]):
    """Builder of the static int8 variant: QDQ MatMuls, u8 activations (their ranges taken from the calibration
    texts) and s8 weights, the u8s8 pair VNNI/AMX kernels take."""
    def build(source, target, large) -> None:
        from onnxruntime import quantization as q

        class Texts(q.CalibrationDataReader):
            def __init__(self):
                self.left = iter(feeds)

            def get_next(self):
                return next(self.left, None)

        method = {"minmax": q.CalibrationMethod.MinMax, "entropy": q.CalibrationMethod.Entropy,
                  "percentile": q.CalibrationMethod.Percentile}[options.calibration]
        q.quantize_static(str(source), str(target), Texts(), quant_format=q.QuantFormat.QDQ,
                        op_types_to_quantize=list(QUANTIZED_OPS), per_channel=options.per_channel,
                        activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8,
                        nodes_to_exclude=nodes_to_exclude, calibrate_method=method, use_external_data_format=large)
    return build


# MatMul only: quantizing Add/Softmax/Gather too takes the ranges of the attention mask's large negative bias and of
# the embeddings, and costs far more quality than it saves time (cosine p1 0.67 on all-MiniLM-L6-v2, docs/tasks.md)
QUANTIZED_OPS = ("MatMul",)


def int8_step(spec, cfg: BenchmarkConfig, model_path, input_names):
    """The int8 step: (variant, builder, what the record says of it); the variant names every option that shapes
    the artifact and the calibration texts' digest."""
    import onnx

    o = options_as(cfg.backend, OnnxRuntimeOptions)
    names = [node.name for node in onnx.load(str(model_path), load_external_data=False).graph.node]
    excluded = kept_fp32(names, o.keep_fp32)
    shape = f"pc{int(o.per_channel)}-keep-{o.keep_fp32}"
    facts = {"quantization": o.quantization, "per_channel": o.per_channel, "keep_fp32": o.keep_fp32,
             "fp32_nodes": len(excluded)}
    if o.quantization == "dynamic":
        return f"int8-{shape}-ort{ort.__version__}", quantize(o, excluded), facts
    feeds, origin, digest = calibration_feeds(spec, cfg, input_names)
    facts.update(calibration=o.calibration, calibration_samples=len(feeds), calibration_texts=origin,
                 calibration_digest=digest)
    return (f"int8-static-{o.calibration}-{shape}-n{len(feeds)}-{digest}-ort{ort.__version__}",
            quantize_calibrated(o, excluded, feeds), facts)


class OnnxRuntimeBackend(TimedStages):
    name = "onnxruntime"

    def load(self, spec, cfg: BenchmarkConfig, threads, inputs) -> None:
        require_precision(self.name, cfg.precision)
        chosen = options_as(cfg.backend, OnnxRuntimeOptions)
        options = ort.SessionOptions()
        options.graph_optimization_level = GRAPH_OPTIMIZATION_LEVELS[chosen.graph_optimization_level]
        options.execution_mode = EXECUTION_MODES[chosen.execution_mode]
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = cfg.interop_threads
        model = onnx_model(spec, cfg, inputs, self)
        self.cache_hits = {"export": model.cache_hit}
        steps = [("fuse", f"fused-ort{ort.__version__}", fuse(spec))] if chosen.fusion else []
        self.quantization: dict = {}
        for stage, variant, build in steps:  # each a cached derivative of the previous model
            with self.stage(stage):
                model = model.derived(variant, build)
            self.cache_hits[stage] = drop_if_hit(self, stage, model).cache_hit
        if cfg.precision == "int8" and spec.quantization is None:  # on the fused model when fusion=true: its names
            # are the export's own; a model file quantized already runs as it is
            with self.stage("quantize"):
                variant, build, self.quantization = int8_step(spec, cfg, model.path, list(inputs))
                model = model.derived(variant, build)
            self.cache_hits["quantize"] = drop_if_hit(self, "quantize", model).cache_hit
        self.model_path = model.path
        unbind_calling_thread()  # the session's pool inherits this thread's CPUs
        with self.stage("session"):
            self.session = ort.InferenceSession(str(model.path), options, providers=["CPUExecutionProvider"])
        self.options = options
        # the output measured: the export's one, or the model file's chosen one (it may hold several)
        self.outputs = [spec.model_file["output"]] if spec.model_file else None
        self.head = file_head(spec)  # pooling= on a model file's token states, computed after the graph

    def prepare(self, inputs):
        names = {i.name for i in self.session.get_inputs()}
        return {name: array for name, array in inputs.items() if name in names}

    def forward(self, prepared):
        found = self.session.run(self.outputs, prepared)[0]
        return found if self.head is None else pool_states(self.head, found, prepared["attention_mask"])

    def to_numpy(self, output) -> np.ndarray:
        return np.asarray(output, dtype=np.float32)

    def info(self) -> dict:
        import onnx

        graph = onnx.load(str(self.model_path), load_external_data=False).graph
        return {
            "framework": "onnxruntime",
            "version": ort.__version__,
            "providers": self.session.get_providers(),
            "intra_op_num_threads": self.options.intra_op_num_threads,
            "inter_op_num_threads": self.options.inter_op_num_threads,
            "graph_optimization_level": str(self.options.graph_optimization_level),
            "execution_mode": str(self.options.execution_mode),
            "cache_hits": self.cache_hits,
            "quantization": self.quantization,
            "operators": dict(Counter(node.op_type for node in graph.node).most_common()),
        }
