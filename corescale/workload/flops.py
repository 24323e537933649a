"""Analytic FLOP count of a transformer encoder or decoder-as-encoder (2 FLOPs per multiply-add).

Per layer, for S tokens: the q/k/v/o projections 2·S·d·(2·q + 2·kv) (q = heads x head dim, kv = key/value heads x
head dim: 8·S·d² for BERT), the FFN 2·S·d·f·m (m = 2 matrices, 3 for a gated FFN: GeGLU, SwiGLU) and attention's
two products 4·S²·q. ModernBERT's local attention (a 128-token window in two layers of three) is counted as
global: an upper bound beyond 128 tokens.
"""

from __future__ import annotations


def encoder_flops(layers: int, hidden: int, intermediate: int, sequence_length: int, query: int | None = None,
                  key_value: int | None = None, gated: bool = False) -> float:
    """FLOPs for one sequence: projections + FFN + attention, per layer (BERT: 8·S·d² + 4·S·d·f + 4·S²·d)."""
    s, d, f = sequence_length, hidden, intermediate
    q, kv = query or d, key_value or query or d
    return float(layers * (2 * s * d * (2 * q + 2 * kv) + 2 * s * d * f * (3 if gated else 2) + 4 * s * s * q))


def forward_flops(spec, batch_size: int, sequence_length: int) -> float:
    """FLOPs of one forward call at the padded length (padding is computed, so it counts)."""
    return batch_size * encoder_flops(spec.layers, spec.hidden, spec.intermediate, sequence_length,
                                      spec.query_width, spec.key_value_width, spec.gated_ffn)


def class_flops(spec, batch_size: int, sequence_length: int) -> dict[str, float]:
    """FLOPs of one call by op class: the linear layers (projections, FFN, pooler) and attention's two products."""
    s, d, f = sequence_length, spec.hidden, spec.intermediate
    q, kv = spec.query_width, spec.key_value_width
    pooler = 2 * d * d if spec.model_type in ("bert", "roberta", "xlm-roberta", "camembert") else 0
    linear = spec.layers * (2 * s * d * (2 * q + 2 * kv) + 2 * s * d * f * (3 if spec.gated_ffn else 2)) + pooler
    return {"gemm": float(batch_size * linear), "attention": float(batch_size * spec.layers * 4 * s * s * q)}
