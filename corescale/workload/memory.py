"""A lower bound on the memory one instance needs for a model and an input shape, known before any framework loads.

Weights: the encoder's parameters in fp32 (every backend builds the PyTorch model first, whatever the precision):
embeddings (vocab + positions + token types) x d, per layer 4 d^2 + 2 d f (+ biases and layer norms), the
pooler d^2 (not DistilBERT's). Activations of one forward call (no gradients): the inputs (int64), the hidden
state, its residual and the output b x s x d, the intermediate b x s x f and the attention scores with their
softmax 2 b h s^2, all fp32. Frameworks need more than this (workspaces, a second copy of the weights during an
export); the bound is meant to refuse shapes that cannot fit, never one that could.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from corescale.machine.precisions import PRECISIONS, REFERENCE

FLOAT_BYTES = 4
INT_BYTES = 8


@dataclass(frozen=True)
class MemoryEstimate:
    weights_bytes: int
    activation_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.activation_bytes


def encoder_parameter_count(spec) -> int:
    """The parameters every call reads whole: the layers (weights, biases, layer norms) and the pooler."""
    d, f, layers = spec.hidden, spec.intermediate, spec.layers
    layer = 4 * d * d + 2 * d * f + 9 * d + f
    pooler = 0 if spec.model_type == "distilbert" else d * d + d
    return layers * layer + pooler


def parameter_count(spec) -> int:
    d = spec.hidden
    positions = int(spec.config.get("max_position_embeddings", 512))
    token_types = int(spec.config.get("type_vocab_size", 0) or 0)
    embeddings = (spec.vocab_size + positions + token_types) * d + 2 * d
    return embeddings + encoder_parameter_count(spec)


def traffic_bytes(spec, batch_size: int, sequence_length: int, precision: str = REFERENCE) -> int:
    """A lower bound on the memory traffic of one forward call (the roofline's denominator): the encoder's
    weights read once at the precision's width (its entry's bytes), the embedding rows the inputs touch (word,
    position, token type), the int64 inputs and the fp32 output. Activations between layers are not counted (they
    may stay in the caches), so the intensity is an upper bound and the memory roof never too low."""
    b, s, d = batch_size, sequence_length, spec.hidden
    weights = math.ceil(PRECISIONS[precision].bytes * encoder_parameter_count(spec))
    embeddings = FLOAT_BYTES * (b * s * d + s * d + b * s * d)
    return weights + embeddings + 3 * INT_BYTES * b * s + FLOAT_BYTES * b * s * d


def estimate(spec, batch_size: int, sequence_length: int) -> MemoryEstimate:
    """What one instance holds at least: its weights and one call's activations (Python ints: no overflow)."""
    b, s = batch_size, sequence_length
    d, f, heads = spec.hidden, spec.intermediate, max(spec.heads, 1)
    activations = FLOAT_BYTES * (b * s * (3 * d + f) + 2 * b * heads * s * s) + 3 * INT_BYTES * b * s
    if spec.model_file is not None:  # a model file: its weights are its bytes (the sizes may be unknown: then the
        return MemoryEstimate(int(spec.model_file["bytes"]), activations)  # activations count what is known)
    return MemoryEstimate(FLOAT_BYTES * parameter_count(spec), activations)


def gib(n: int) -> str:
    """Bytes as GiB for a message; astronomically large estimates in powers of ten."""
    value = n / 2**30
    return f"{value:.2f} GiB" if value < 1e6 else f"{value:.1e} GiB"
