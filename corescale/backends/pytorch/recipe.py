"""The deployment snippet of the PyTorch family: the Transformers model as corescale measured it (eager, traced
and frozen, or compiled)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from corescale.backends.options import options_as
from corescale.backends.pytorch.options import TorchCompileOptions

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig


def snippet(cfg: BenchmarkConfig, threads: int, model: str) -> str:
    name = cfg.backend.name
    lines = ["import torch", "from transformers import AutoConfig, AutoModel", "", model.rstrip(),
             f"torch.set_num_threads({threads})", f"torch.set_num_interop_threads({cfg.interop_threads})",
             'model = AutoModel.from_config(AutoConfig.from_pretrained("bert-base-uncased")).eval()'
             "  # or from_pretrained(YOUR_DIR)"]
    if cfg.precision == "int8":
        lines.append("model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, torch.qint8)")
    for option, value in cfg.backend.changed().items():
        lines.append(f"# backend.{option}={value}: see corescale/backends/pytorch/")
    if name == "torchscript":
        lines.append("model = torch.jit.freeze(torch.jit.trace(model, example_kwarg_inputs=INPUTS, strict=False))")
    if name == "torch_compile":
        lines.append(f'model = torch.compile(model, mode="{options_as(cfg.backend, TorchCompileOptions).mode}")')
    call = "with torch.inference_mode()" + (", torch.autocast(\"cpu\", dtype=torch.bfloat16)"
                                             if cfg.precision == "bf16" else "")
    lines.append(f"{call}:\n    outputs = model(**INPUTS)  # INPUTS: input_ids, attention_mask, token_type_ids")
    return "\n".join(lines) + "\n"
