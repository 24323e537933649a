"""The measured call as a PyTorch module: the model and its head (workload/heads.py), keyword inputs in, the
task's one output tensor out. Every backend measures this: PyTorch runs it, TorchScript traces it, the ONNX export
(and so ONNX Runtime and OpenVINO, their int8 and bf16 graphs included) holds it whole.

- embed: pooled (cls | mean | max | lasttoken over the attention mask), Dense layers, L2-normalised -> [B, D]
- rerank / classify: the sequence classifier's logits -> [B, labels]
- encode: the last hidden state -> [B, S, H]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from corescale.workload.heads import DenseLayer, HeadSpec
from corescale.workload.models import build_torch_model

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig

ACTIVATIONS = {"tanh": torch.nn.Tanh, "identity": torch.nn.Identity, "relu": torch.nn.ReLU, "gelu": torch.nn.GELU}


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Sentence-Transformers' pooling, padding excluded by the attention mask (right padding)."""
    if mode == "cls":
        return hidden[:, 0]
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "mean":
        return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
    if mode == "max":
        return hidden.masked_fill(weights == 0, torch.finfo(hidden.dtype).min).max(1).values
    if mode == "lasttoken":
        last = mask.sum(1) - 1  # the last real token of each row
        return hidden[torch.arange(hidden.shape[0]), last]
    raise ValueError(f"unknown pooling mode {mode}")


def dense_module(layer: DenseLayer) -> torch.nn.Module:
    from pathlib import Path

    from safetensors.torch import load_file

    linear = torch.nn.Linear(layer.in_features, layer.out_features, bias=layer.bias)
    weights = Path(layer.path) / "model.safetensors"
    state = load_file(str(weights))
    linear.load_state_dict({k.removeprefix("linear."): v for k, v in state.items()})
    return torch.nn.Sequential(linear, ACTIVATIONS[layer.activation]())


class TaskModule(torch.nn.Module):
    """Keyword-call wrapper returning the task's output (what tracers and exporters want)."""

    def __init__(self, model: torch.nn.Module, head: HeadSpec, input_names: tuple[str, ...]):
        super().__init__()
        self.model, self.head, self.input_names = model, head, input_names
        self.dense = torch.nn.ModuleList(dense_module(d) for d in head.dense)

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if "token_type_ids" in self.input_names:
            kwargs["token_type_ids"] = token_type_ids
        out = self.model(**kwargs)
        if self.head.entry.head == "logits":
            return out.logits
        if self.head.entry.head == "tokens":
            return out.last_hidden_state
        vector = pool(out.last_hidden_state, attention_mask, self.head.pooling or "mean")
        for layer in self.dense:
            vector = layer(vector)
        return F.normalize(vector, p=2.0, dim=1) if self.head.normalize else vector


def task_module(spec, cfg: BenchmarkConfig, inputs) -> TaskModule:
    model = build_torch_model(spec, cfg.seed, cfg.trust_remote_code, cfg.allow_pickle)
    return TaskModule(model, spec.head, tuple(inputs)).eval()
