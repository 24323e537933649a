"""Analytic FLOP count of a BERT-like encoder (2 FLOPs per multiply-add)."""

from __future__ import annotations


def encoder_flops(layers: int, hidden: int, intermediate: int, sequence_length: int) -> float:
    """FLOPs for one sequence: projections (8·S·d²) + FFN (4·S·d·f) + attention (4·S²·d), per layer."""
    s, d, f = sequence_length, hidden, intermediate
    return float(layers * (8 * s * d * d + 4 * s * d * f + 4 * s * s * d))


def forward_flops(spec, batch_size: int, sequence_length: int) -> float:
    """FLOPs of one forward call at the padded length (padding is computed, so it counts)."""
    return batch_size * encoder_flops(spec.layers, spec.hidden, spec.intermediate, sequence_length)


def class_flops(spec, batch_size: int, sequence_length: int) -> dict[str, float]:
    """FLOPs of one call by op class: the linear layers (projections, FFN, pooler) and attention's two products."""
    s, d, f = sequence_length, spec.hidden, spec.intermediate
    pooler = 0 if spec.model_type == "distilbert" else 2 * d * d
    linear = spec.layers * (8 * s * d * d + 4 * s * d * f) + pooler
    return {"gemm": float(batch_size * linear), "attention": float(batch_size * spec.layers * 4 * s * s * d)}
