"""What one request to `corescale serve` may hold: each limit a `corescale serve` option (commands/serve.py),
shown by GET /info, checked before any work (serve/guard.py: the body; serve/tokens.py: the rest)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Limits:
    """What one request may hold; each is a `corescale serve` option and is shown by GET /info."""

    payload_bytes: int = 2_000_000  # the body (TEI's --payload-limit), counted as it is received
    max_inputs: int = 32  # inputs in one request (TEI's --max-client-batch-size)
    input_chars: int = 100_000  # characters of one input (a pair: both texts), before tokenizing
    request_chars: int = 1_000_000  # characters of all a request's inputs, before tokenizing
    request_tokens: int = 16_384  # tokens of all a request's inputs, special ones included (TEI's max-batch-tokens)
    answer_floats: int = 8_388_608  # floats in one /embed_all answer (rows x tokens x hidden), 32 MB as float32
    auto_truncate: bool = False  # cut inputs over the maximum length instead of refusing them (TEI's name)

    def to_json(self) -> dict:
        return asdict(self)
