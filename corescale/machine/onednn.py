"""torch's own oneDNN linear: a weight reordered once into oneDNN's blocked layout, then
`mkldnn::_linear_pointwise` on it (the primitive torch's inductor CPU freezing pass emits). One implementation for
the GEMM peak (machine/peak.py, library `torch_onednn`) and for `backend.linear=onednn` (backends/pytorch).

Imports torch: import this module only where torch is wanted. No `from __future__ import annotations` here: the
linear is compiled by TorchScript, which reads these annotations.
"""

from typing import List, Optional, Union

import torch


def available() -> bool:
    return torch.backends.mkldnn.is_available()


def pack_weight(weight: torch.Tensor, batch_hint: Optional[int] = None) -> torch.Tensor:
    """`weight` [out, in] as an opaque oneDNN tensor; batch_hint: the rows (M) the GEMM will see, if known."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), batch_hint)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """x @ weight.T + bias on the packed weight (any leading dimensions of x)."""
    scalars: List[Optional[Union[int, float, complex]]] = []  # TorchScript's spelling of Scalar?[]
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", scalars, "")
