"""The bundle's fast tokenizer in the front (Hugging Face `tokenizers`, one thread: the cores are the
instances'), with the limits the service enforces: the measured sequence length, the inputs per request."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # its thread pool would compete with the instances

from tokenizers import Encoding, Tokenizer  # noqa: E402 - after the variable above, which it reads on import

from corescale.workload.heads import with_prompt  # noqa: E402


class TooLarge(ValueError):
    """An input over the length limit, or a request with too many inputs (413)."""


@dataclass
class Encoded:
    rows: list[np.ndarray]
    types: list[np.ndarray] | None  # token type ids, for pairs (a cross-encoder tells query from document by them)
    tokens: int  # real tokens, special ones included (the usage count)


class Tokens:
    def __init__(self, path: Path, max_length: int, max_inputs: int, prompt: str = ""):
        self.tokenizer = Tokenizer.from_file(str(path))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.truncating = Tokenizer.from_file(str(path))
        self.truncating.no_padding()
        self.truncating.enable_truncation(max_length)
        self.max_length, self.max_inputs = max_length, max_inputs
        self.prompt = prompt  # the model's default prompt, before each text as its library puts it

    def encode(self, texts: list, truncate: bool = False, pairs: bool = False) -> Encoded:
        """Token ids of each input (a text, or a (text, text) pair); TooLarge past a limit."""
        if len(texts) > self.max_inputs:
            raise TooLarge(f"{len(texts)} inputs in one request; at most {self.max_inputs} (--max-inputs)")
        tokenizer = self.truncating if truncate else self.tokenizer
        encodings = tokenizer.encode_batch(with_prompt([tuple(t) for t in texts] if pairs else texts, self.prompt))
        for index, encoding in enumerate(encodings):
            if len(encoding.ids) > self.max_length:
                raise TooLarge(f"input {index} has {len(encoding.ids)} tokens; the bundle was measured at "
                               f"sequence_length {self.max_length} (send truncate=true to cut it)")
        rows = [np.asarray(e.ids, dtype=np.int64) for e in encodings]
        types = [np.asarray(e.type_ids, dtype=np.int64) for e in encodings] if pairs else None
        return Encoded(rows, types, sum(len(r) for r in rows))

    def pieces(self, texts: list[str], special: bool) -> list[list[dict]]:
        """TEI's /tokenize answer: each token's id, text, whether it is special, and its character span."""
        return [[piece(e, i, text) for i in range(len(e.ids))]
                for e, text in zip(self.tokenizer.encode_batch(texts, add_special_tokens=special), texts)]


def piece(encoding: Encoding, i: int, text: str) -> dict:
    start, stop = encoding.offsets[i]
    special = bool(encoding.special_tokens_mask[i])
    return {"id": encoding.ids[i], "text": encoding.tokens[i] if special else text[start:stop],
            "special": special, "start": None if special else start, "stop": None if special else stop}
