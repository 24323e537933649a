"""Findings: plain sentences from measured facts, each with the figures behind it.

A finding is a rule over the facts of one explained configuration (explain/analysis.py: shares of the call by op
class, the GEMM class's rate against the machine's measured peak, the GEMM libraries measured on the same cores,
the roofline position, how well the profile agrees with unprofiled timing). No rule names a CPU model: what
differs between CPUs is in the measured facts. RULES is the table; `findings` applies every rule in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from corescale.backends import onednn_linear_at

LIBRARY_GAIN = 1.15  # oneDNN must beat torch.mm by this much on these cores before it is offered as the remedy


@dataclass(frozen=True)
class Rule:
    id: str
    applies: Callable[[dict], bool]
    says: Callable[[dict], str]
    evidence: tuple[str, ...]  # the facts shown beside the sentence


def _has(facts: dict, *names: str) -> bool:
    return all(facts.get(name) is not None for name in names)


def _onednn_linear(f: dict) -> bool:
    """The explained backend's linears can run as torch's prepacked oneDNN linear at the explained precision (its
    registry entry says)."""
    return onednn_linear_at(f.get("backend") or "", f.get("precision") or "")


def remedy_rates(f: dict) -> tuple[float, float, str] | None:
    """(torch's default linear, the oneDNN linear) GFLOP/s and where they were measured: on the model's own linear
    shapes in the explain worker when known, else the peak's square GEMM on the same cores."""
    if _has(f, "linear_default_gflops", "linear_onednn_gflops"):
        return f["linear_default_gflops"], f["linear_onednn_gflops"], "on this model's linear shapes"
    if _has(f, "torch_mm_gflops", "torch_onednn_gflops"):
        return f["torch_mm_gflops"], f["torch_onednn_gflops"], "in the peak's square GEMM"
    return None


def _mkl_path(f: dict) -> bool:
    rates = remedy_rates(f)
    return (_onednn_linear(f) and f.get("linear", "default") == "default"
            and _has(f, "gemm_efficiency", "peak_gflops")
            and f["gemm_efficiency"] < 0.75 and rates is not None and rates[1] > LIBRARY_GAIN * rates[0])


def _matched_rates(f: dict) -> tuple[float, float, str]:
    rates = remedy_rates(f)
    assert rates is not None, "a rule's message is written only where its test matched"
    return rates


def _mkl_says(f: dict) -> str:
    default, onednn, where = _matched_rates(f)
    return (f"fp32 GEMMs run at {f['gemm_efficiency']:.0%} of this CPU's GEMM peak: PyTorch's MKL path; torch's own "
            f"oneDNN linear runs {onednn:.0f} GFLOP/s against {default:.0f} through torch's default linear ({where}, "
            f"measured on these cores): backend.linear=onednn gains about {onednn / default:.1f}x in the GEMMs and "
            f"reaches {min(onednn / f['peak_gflops'], 1.0):.0%} of the peak")


def _no_remedy(f: dict) -> bool:
    rates = remedy_rates(f)
    return (_onednn_linear(f) and rates is not None
            and rates[1] <= LIBRARY_GAIN * rates[0])


RULES = (
    Rule("gemm-library",
         _mkl_path,
         _mkl_says,
         ("gemm_gflops", "peak_gflops", "peak_library", "linear_default_gflops", "linear_onednn_gflops",
          "torch_mm_gflops", "torch_onednn_gflops")),
    Rule("same-gemm-library",
         _no_remedy,
         lambda f: ("torch's default linear and its oneDNN linear run this model's GEMMs alike on these cores "
                    "({:.0f} and {:.0f} GFLOP/s, {}): ".format(*_matched_rates(f)) +
                    "backend.linear=onednn would change little here"),
         ("linear_default_gflops", "linear_onednn_gflops", "torch_mm_gflops", "torch_onednn_gflops")),
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
