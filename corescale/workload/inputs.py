"""Seeded model inputs of exactly [batch_size, sequence_length], built before timing."""

from __future__ import annotations

import numpy as np


def make_inputs(spec, batch_size: int, sequence_length: int, seed: int, padding_fraction: float = 0.0):
    """input_ids + attention_mask (+ token_type_ids when the model takes them), int64 numpy arrays.

    The last round(padding_fraction * S) positions of each row are padding (mask 0, pad token id).
    """
    rng = np.random.default_rng(seed)
    low = 5  # keep clear of special tokens
    ids = rng.integers(low, spec.vocab_size, size=(batch_size, sequence_length), dtype=np.int64)
    mask = np.ones((batch_size, sequence_length), dtype=np.int64)
    padded = int(round(padding_fraction * sequence_length))
    if padded:
        mask[:, sequence_length - padded:] = 0
        ids[:, sequence_length - padded:] = int(spec.config.get("pad_token_id") or 0)
    inputs = {"input_ids": ids, "attention_mask": mask}
    if spec.takes_token_type_ids:
        inputs["token_type_ids"] = np.zeros((batch_size, sequence_length), dtype=np.int64)
    return inputs
