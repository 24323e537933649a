"""OpenVINO CPU plugin on the cached ONNX export: one stream per instance, `threads` inference threads."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import openvino as ov

from corescale.backends.base import TimedStages, require_precision, unbind_calling_thread
from corescale.backends.onnx_export import IR_FILE, drop_if_hit, onnx_model
from corescale.backends.openvino.compiled import compile_cached
from corescale.backends.openvino.options import OpenVinoOptions
from corescale.backends.openvino.quantize import int8_step
from corescale.backends.options import options_as
from corescale.errors import UserError
from corescale.workload.heads import file_head, pool_states

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig

# int8: the IR's quantized nodes run in int8, the rest in f32 (left unset, OpenVINO would pick bf16 on AMX CPUs)
INFERENCE_PRECISIONS = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}
REPORTED = ("INFERENCE_NUM_THREADS", "NUM_STREAMS", "PERFORMANCE_HINT", "INFERENCE_PRECISION_HINT",
            "ENABLE_CPU_PINNING", "OPTIMAL_NUMBER_OF_INFER_REQUESTS")


def cpu_capabilities(core: ov.Core) -> list[str]:
    return list(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def _plain(value):
    if hasattr(value, "get_type_name"):  # an element type such as f32 / bf16
        return value.get_type_name()
    return value if isinstance(value, (int, float, bool, str)) else str(value)


class OpenVinoBackend(TimedStages):
    name = "openvino"

    def load(self, spec, cfg: BenchmarkConfig, threads, inputs) -> None:
        require_precision(self.name, cfg.precision)
        unbind_calling_thread()  # OpenVINO reads this thread's CPUs when its CPU plugin loads
        core = ov.Core()
        self.capabilities = cpu_capabilities(core)
        if cfg.precision == "bf16" and "BF16" not in self.capabilities:
            raise UserError("precision=bf16 on openvino needs a CPU with bf16 instructions (AVX512_BF16 or AMX); "
                            f"this CPU offers {', '.join(self.capabilities)}")
        model = onnx_model(spec, cfg, inputs, self)
        self.cache_hits: dict[str, bool | None] = {"export": model.cache_hit}
        self.quantization: dict = {}
        if cfg.precision == "int8" and not model.final and spec.quantization is None:  # a bundle's artifact is the
            # int8 IR already, a model file quantized already runs as it is
            with self.stage("quantize"):
                variant, build, self.quantization = int8_step(spec, cfg, core, model.path, list(inputs))
                model = model.derived(variant, build, file=IR_FILE)
            self.cache_hits["quantize"] = drop_if_hit(self, "quantize", model).cache_hit
            unbind_calling_thread(every_thread=True)  # NNCF loads torch, whose OpenMP binds to one CPU
        self.model_path = model.path  # the artifact a deployment bundle carries (serve/bundle.py)
        with self.stage("convert"):
            network = core.read_model(str(model.path))
        config = {
            "INFERENCE_NUM_THREADS": threads,
            "NUM_STREAMS": 1,  # one stream per instance: instances are the unit of parallelism here
            "PERFORMANCE_HINT": options_as(cfg.backend, OpenVinoOptions).performance_hint,
            # explicit: OpenVINO would otherwise pick bf16 by itself on CPUs that have it
            "INFERENCE_PRECISION_HINT": INFERENCE_PRECISIONS[cfg.precision],
        }
        self.network, self.compile_config = network, config  # what `corescale explain` profiles again
        cache = Path(os.path.expanduser(cfg.compiled_cache)) if cfg.compiled_cache else None
        with self.stage("compile"):
            self.compiled, self.cache_hits["compiled"] = compile_cached(core, network, model.path, config, cache)
        self.request = self.compiled.create_infer_request()
        # the output measured: the export's one, or the model file's chosen one (it may hold several)
        self.output = self.compiled.output(spec.model_file["output"]) if spec.model_file else 0
        self.head = file_head(spec)  # pooling= on a model file's token states, computed after the graph

    def prepare(self, inputs):
        names = {name for port in self.compiled.inputs for name in port.get_names()}
        return {name: np.ascontiguousarray(array) for name, array in inputs.items() if name in names}

    def forward(self, prepared):
        found = self.request.infer(prepared, share_inputs=True, share_outputs=True)
        return found if self.head is None else pool_states(self.head, found[self.output], prepared["attention_mask"])

    def to_numpy(self, output) -> np.ndarray:
        if isinstance(output, np.ndarray):  # pooled already (a new array)
            return output
        return np.array(output[self.output], dtype=np.float32)  # copies out of the request's own buffer

    def info(self) -> dict:
        return {
            "framework": "openvino",
            "version": ov.get_version(),
            "cpu_capabilities": self.capabilities,
            "cache_hits": self.cache_hits,
            "quantization": self.quantization,
            **{key.lower(): _plain(self.compiled.get_property(key)) for key in REPORTED},
        }
