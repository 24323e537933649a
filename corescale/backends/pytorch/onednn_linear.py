"""`backend.linear=onednn`: every nn.Linear of a model replaced by one holding its weight prepacked for torch's own
oneDNN linear (machine/onednn.py), reordered once at load for the rows (batch x sequence) the model will see."""

from typing import Optional

import torch

from corescale.machine import onednn


class OnednnLinear(torch.nn.Module):
    """nn.Linear's forward on a weight prepacked in oneDNN's layout (inference only: the weight is opaque)."""

    # the buffers (register_buffer), typed for mypy; real objects, not strings: TorchScript reads class annotations
    packed: torch.Tensor
    bias: Optional[torch.Tensor]

    def __init__(self, linear: torch.nn.Linear, batch_hint: int | None = None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed", onednn.pack_weight(linear.weight, batch_hint))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return onednn.linear(x, self.packed, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN prepacked"


def replace_linears(module: torch.nn.Module, batch_hint: int | None = None, script: bool = False) -> int:
    """Replaces every nn.Linear under `module` in place; script=True compiles each replacement with TorchScript
    (so a traced model calls it). Returns how many were replaced."""
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear):
            replacement = OnednnLinear(child, batch_hint)
            setattr(module, name, torch.jit.script(replacement) if script else replacement)
            count += 1
        else:
            count += replace_linears(child, batch_hint, script)
    return count
