"""The bundle's fast tokenizer in the front (Hugging Face `tokenizers`, one thread per call: the cores are the
instances'), with the limits the service enforces before any work: inputs per request, characters per input and
per request (checked before tokenizing), tokens per input (the model's maximum length) and per request, and the
ids against the model's vocabulary (an id past it would crash an instance, or give a wrong vector silently).

Length: an input up to the model's maximum length is served (config.json max_position_embeddings, the
tokenizer's model_max_length, a Sentence-Transformers max_seq_length: the smallest that is given), whatever the
length the bundle was measured at; a longer one is refused (413) unless truncation is asked for, per request
(`truncate`) or for the service (`--auto-truncate`)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from corescale.serve.limits import Limits

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # its thread pool would compete with the instances

from tokenizers import Encoding, Tokenizer  # noqa: E402 - after the variable above, which it reads on import

from corescale.workload.heads import with_prompt  # noqa: E402

TOKENIZER_SENTINEL = 1_000_000  # transformers writes model_max_length=1e30 for "no limit"


class TooLarge(ValueError):
    """An input, a request or an answer over a limit (413)."""


class Unservable(ValueError):
    """An input no instance can compute: empty, only whitespace, or ids past the vocabulary (422)."""


@dataclass
class Encoded:
    rows: list[np.ndarray]
    types: list[np.ndarray] | None  # token type ids, for pairs (a cross-encoder tells query from document by them)
    tokens: int  # real tokens, special ones included (the usage count)


def longest_served(folder: Path, positions: int | None, measured: int) -> int:
    """The longest input the model takes: the smallest of config.json's positions and the length the tokenizer
    or the Sentence-Transformers module declares (in `folder`, the bundle's tokenizer/model folder); never
    below the measured sequence length (which ran); the measured length when none is known."""
    declared = [positions] if positions else []
    for name, key in (("tokenizer_config.json", "model_max_length"), ("sentence_bert_config.json", "max_seq_length")):
        try:
            value = json.loads((folder / name).read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, (int, float)) and 0 < value < TOKENIZER_SENTINEL:
            declared.append(int(value))
    return max(min(declared), measured) if declared else measured


class Tokens:
    def __init__(self, path: Path, max_length: int, limits: Limits, vocab_size: int | None = None,
                 prompt: str = ""):
        self.tokenizer = Tokenizer.from_file(str(path))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.truncating = Tokenizer.from_file(str(path))
        self.truncating.no_padding()
        self.truncating.enable_truncation(max_length)
        self.max_length, self.limits, self.vocab_size = max_length, limits, vocab_size
        self.prompt = prompt  # the model's default prompt, before each text as its library puts it

    @property
    def max_inputs(self) -> int:
        return self.limits.max_inputs

    def check(self, texts: list) -> None:
        """Before any work (cheap: lengths only): the count, the characters, no empty input; TooLarge (413) or
        Unservable (422)."""
        limits = self.limits
        if len(texts) > limits.max_inputs:
            raise TooLarge(f"{len(texts)} inputs in one request; at most {limits.max_inputs} (--max-inputs)")
        total, firsts = 0, set()
        for index, item in enumerate(texts):
            parts = (item,) if isinstance(item, str) else tuple(item)
            if any(not part or part.isspace() for part in parts):
                raise Unservable(f"input {index} is empty or only whitespace")
            chars = sum(len(part) for part in parts)
            if chars > limits.input_chars:
                raise TooLarge(f"input {index} has {chars} characters; at most {limits.input_chars} "
                               "(--max-input-chars)")
            repeated = len(parts) > 1 and parts[0] in firsts  # /rerank's query is tokenized once: counted once
            total += chars - (len(parts[0]) if repeated else 0)
            if len(parts) > 1:
                firsts.add(parts[0])
        if total > limits.request_chars:
            raise TooLarge(f"the request's inputs hold {total} characters; at most {limits.request_chars} "
                           "(--max-request-chars)")

    def encode(self, texts: list, truncate: bool = False, pairs: bool = False) -> Encoded:
        """Token ids of each input (a text, or a (text, text) pair: each distinct first text tokenized once);
        TooLarge past a limit, Unservable for ids no instance can take. Call check() first."""
        self.check(texts)
        encoded = self.ids(texts, truncate, pairs)
        self.check_rows(encoded.rows)
        return encoded

    def encode_each(self, texts: list, truncate: bool = False, pairs: bool = False) -> tuple[Encoded, dict[int, str]]:
        """A corpus job's: the ids of each input that can be computed, and why each other one cannot (its
        index -> the reason), checked one by one with every limit but the request's."""
        problems: dict[int, str] = {}
        for index, text in enumerate(texts):
            try:
                self.check([text])
            except (TooLarge, Unservable) as exc:
                problems[index] = str(exc).replace("input 0 ", "the input ", 1)
        kept = [i for i in range(len(texts)) if i not in problems]
        encoded = self.ids([texts[i] for i in kept], truncate, pairs)
        good: list[int] = []
        for index, row in zip(kept, encoded.rows):
            try:
                self.check_rows([row], whole=False)
                good.append(index)
            except (TooLarge, Unservable) as exc:
                problems[index] = str(exc).replace("input 0 ", "the input ", 1).split(" (send truncate")[0]
        rows = dict(zip(kept, encoded.rows))
        types = dict(zip(kept, encoded.types)) if encoded.types is not None else None
        picked = [rows[i] for i in good]
        return Encoded(picked, [types[i] for i in good] if types is not None else None,
                       sum(len(r) for r in picked)), problems

    def ids(self, texts: list, truncate: bool, pairs: bool) -> Encoded:
        truncate = truncate or self.limits.auto_truncate
        tokenizer = self.truncating if truncate else self.tokenizer
        texts = with_prompt(texts, self.prompt)
        if pairs:
            firsts = list(dict.fromkeys(first for first, _ in texts))  # /rerank: the query, once
            alone = dict(zip(firsts, ids_only(self.tokenizer)(firsts, add_special_tokens=False)))
            seconds = ids_only(self.tokenizer)([second for _, second in texts], add_special_tokens=False)
            encodings = [tokenizer.post_process(alone[first], second) for (first, _), second in zip(texts, seconds)]
        else:
            encodings = ids_only(tokenizer)(texts)
        rows = [np.asarray(e.ids, dtype=np.int64) for e in encodings]
        types = [np.asarray(e.type_ids, dtype=np.int64) for e in encodings] if pairs else None
        return Encoded(rows, types, sum(len(r) for r in rows))

    def check_rows(self, rows: list[np.ndarray], whole: bool = True) -> None:
        """Each row's length and ids; `whole`: the rows are one request, bounded in tokens."""
        for index, row in enumerate(rows):
            if len(row) > self.max_length:
                raise TooLarge(f"input {index} has {len(row)} tokens; the model takes at most {self.max_length} "
                               "(send truncate=true to cut it, or serve with --auto-truncate)")
            if not len(row):
                raise Unservable(f"input {index} gives no tokens")
            if self.vocab_size is not None and (int(row.max()) >= self.vocab_size or int(row.min()) < 0):
                raise Unservable(f"input {index} gives token id {int(row.max())}, past the model's vocabulary "
                                 f"({self.vocab_size} ids): the tokenizer does not match the model")
        total = sum(len(row) for row in rows)
        if whole and total > self.limits.request_tokens:
            raise TooLarge(f"the request's inputs give {total} tokens; at most {self.limits.request_tokens} "
                           "(--max-request-tokens)")

    def pieces(self, texts: list[str], special: bool) -> list[list[dict]]:
        """TEI's /tokenize answer: each token's id, text, whether it is special, and its character span; the
        inputs bounded as every route's are (characters before, tokens after)."""
        self.check(texts)
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=special)
        self.check_rows([np.asarray(e.ids, dtype=np.int64) for e in encodings])
        return [[piece(e, i, text) for i in range(len(e.ids))] for e, text in zip(encodings, texts)]


def ids_only(tokenizer: Tokenizer):
    """`encode_batch` without the characters' offsets (tokenizers >= 0.20: the same ids, a quarter less time: the
    tokenizer was a fifth of the front's event loop at batch-1 requests, docs/serve-profile.md); /tokenize, which
    answers the offsets, keeps `encode_batch`."""
    return getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)


def piece(encoding: Encoding, i: int, text: str) -> dict:
    start, stop = encoding.offsets[i]
    special = bool(encoding.special_tokens_mask[i])
    return {"id": encoding.ids[i], "text": encoding.tokens[i] if special else text[start:stop],
            "special": special, "start": None if special else start, "stop": None if special else stop}
