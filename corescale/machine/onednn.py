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


def linear_rates(rows: int, shapes: list, repeats: int = 3) -> dict:
    """GFLOP/s of torch's default linear and of the prepacked oneDNN linear on a model's linear shapes
    [(in, out, count per model)], `rows` = batch x sequence: the remedy measured on the model's own GEMMs, in the
    process (CPUs, threads) that runs it. Each shape's best of `repeats` calls, weighted by its count."""
    import time

    flops, seconds = 0.0, {"default": 0.0, "onednn": 0.0}
    with torch.inference_mode():
        for k, n, count in shapes:
            x, w, b = torch.rand(rows, k), torch.rand(n, k), torch.rand(n)
            packed = pack_weight(w, rows)
            flops += 2.0 * rows * k * n * count
            for name, run in (("default", lambda x=x, w=w, b=b: torch.nn.functional.linear(x, w, b)),
                              ("onednn", lambda x=x, p=packed, b=b: linear(x, p, b))):
                run()  # first call: primitive creation
                best = float("inf")
                for _ in range(repeats):
                    start = time.perf_counter()
                    run()
                    best = min(best, time.perf_counter() - start)
                seconds[name] += count * best
    return {f"{name}_gflops": flops / spent / 1e9 for name, spent in seconds.items()}
