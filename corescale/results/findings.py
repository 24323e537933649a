"""Findings: plain sentences from measured facts, each with the figures behind it.

A finding is a rule over the facts of one explained configuration (results/explain.py: shares of the call by op
class, the GEMM class's rate against the machine's measured peak, the GEMM libraries measured on the same cores,
the roofline position, how well the profile agrees with unprofiled timing). No rule names a CPU model: what
differs between CPUs is in the measured facts. RULES is the table; `findings` applies every rule in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

TORCH_FAMILY = ("pytorch", "torchscript", "torch_compile")
LIBRARY_GAIN = 1.15  # oneDNN must beat torch.mm by this much on these cores before it is offered as the remedy


@dataclass(frozen=True)
class Rule:
    id: str
    applies: Callable[[dict], bool]
    says: Callable[[dict], str]
    evidence: tuple[str, ...]  # the facts shown beside the sentence


def _has(facts: dict, *names: str) -> bool:
    return all(facts.get(name) is not None for name in names)


def _mkl_path(f: dict) -> bool:
    return (f.get("backend") in TORCH_FAMILY and f.get("linear", "default") == "default"
            and f.get("precision") == "fp32"
            and _has(f, "gemm_efficiency", "torch_mm_gflops", "torch_onednn_gflops") and f["gemm_efficiency"] < 0.75
            and f["torch_onednn_gflops"] > LIBRARY_GAIN * f["torch_mm_gflops"])


RULES = (
    Rule("gemm-library",
         _mkl_path,
         lambda f: (f"fp32 GEMMs run at {f['gemm_efficiency']:.0%} of this CPU's GEMM peak: PyTorch's MKL path "
                    f"(torch.mm reaches {f['torch_mm_gflops']:.0f} GFLOP/s on these cores, torch's own oneDNN linear "
                    f"{f['torch_onednn_gflops']:.0f}); backend.linear=onednn puts every nn.Linear on oneDNN, which "
                    f"reaches {f['torch_onednn_gflops'] / f['peak_gflops']:.0%} of the peak"),
         ("gemm_gflops", "peak_gflops", "peak_library", "torch_mm_gflops", "torch_onednn_gflops")),
    Rule("gemm-far-from-peak",
         lambda f: _has(f, "gemm_efficiency") and f["gemm_efficiency"] < 0.6 and not _mkl_path(f),
         lambda f: (f"GEMMs run at {f['gemm_efficiency']:.0%} of the GEMM peak ({f['gemm_gflops']:.0f} of "
                    f"{f['peak_gflops']:.0f} GFLOP/s, set by {f['peak_library']}): {f['backend']}'s kernels leave "
                    "most of it unused at this shape"),
         ("gemm_gflops", "peak_gflops", "peak_library", "batch_size", "sequence_length")),
    Rule("gemm-near-peak",
         lambda f: _has(f, "gemm_efficiency") and f["gemm_efficiency"] >= 0.8,
         lambda f: (f"GEMMs run at {f['gemm_efficiency']:.0%} of the GEMM peak: as fast as this CPU's best measured "
                    f"GEMM; the other {1 - f['share_gemm']:.0%} of the call is where time can still be won"),
         ("gemm_gflops", "peak_gflops", "share_gemm")),
    Rule("overhead",
         lambda f: _has(f, "share_overhead") and f["share_overhead"] >= 0.15,
         lambda f: (f"framework overhead is {f['share_overhead']:.0%} of each call ({f['overhead_ms']:.2f} ms outside "
                    f"any op): per-op dispatch dominates at batch {f['batch_size']}; a larger batch or a graph runtime "
                    "(torchscript, onnxruntime, openvino) amortises it"),
         ("overhead_ms", "latency_ms", "batch_size")),
    Rule("data-movement",
         lambda f: _has(f, "share_data_movement") and f["share_data_movement"] >= 0.10,
         lambda f: (f"data movement and reorders take {f['share_data_movement']:.0%} of each call: copies and layout "
                    "changes between ops, which a runtime that fuses them avoids"),
         ("share_data_movement", "latency_ms")),
    Rule("attention",
         lambda f: _has(f, "share_attention") and f["share_attention"] >= 0.25,
         lambda f: (f"attention takes {f['share_attention']:.0%} of each call at sequence length "
                    f"{f['sequence_length']} (its work grows with the square of the length, the linears' linearly): "
                    "a fused attention kernel (onnxruntime backend.fusion=true, openvino) or shorter sequences help"),
         ("share_attention", "sequence_length")),
    Rule("memory-bound",
         lambda f: f.get("bound") == "memory",
         lambda f: (f"at batch {f['batch_size']} the call is memory-bound: its intensity {f['intensity']:.0f} FLOP/B "
                    f"is below the ridge {f['ridge']:.0f} FLOP/B, so the attainable rate is "
                    f"{f['attainable_gflops']:.0f} GFLOP/s, not the peak; larger batches reuse each weight more"),
         ("intensity", "ridge", "attainable_gflops", "bandwidth_gbps")),
    Rule("other-ops",
         lambda f: _has(f, "share_other") and f["share_other"] >= 0.05,
         lambda f: f"{f['share_other']:.0%} of each call is in ops no class rule knows (see the ops table)",
         ("share_other",)),
    Rule("profile-disagrees",
         lambda f: _has(f, "closure") and abs(f["closure"] - 1) > 0.05,
         lambda f: (f"profiled calls took {f['closure'] - 1:+.0%} against unprofiled ones: the profiler's own cost or "
                    "a busy machine makes this breakdown approximate (a longer duration= narrows it)"),
         ("closure", "latency_ms", "profiled_wall_ms")),
)


def findings(facts: dict) -> list[dict]:
    """Every rule that applies, in table order: its id, its sentence and the facts behind it."""
    return [{"rule": rule.id, "text": rule.says(facts), "evidence": {name: facts.get(name) for name in rule.evidence}}
            for rule in RULES if rule.applies(facts)]
