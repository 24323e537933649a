"""What one query is over HTTP, per API (`api=openai|tei`): the request that carries its text, the check that the
answer holds one embedding, and the timing headers a server may send (Hugging Face TEI's names, milliseconds)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

# the breakdown a server may report per response (TEI's headers; corescale serve sends the same)
TIMING_HEADERS = {"queue": "x-queue-time", "tokenization": "x-tokenization-time",
                  "inference": "x-inference-time", "total": "x-total-time"}
API_KEY_ENV = "CORESCALE_API_KEY"  # sent as `Authorization: Bearer KEY` (kept out of the config and the record)


class BadAnswer(ValueError):
    """A 2xx answer that does not hold the one embedding asked for."""


@dataclass(frozen=True)
class HttpApi:
    name: str
    path: str  # POSTed to, under the endpoint
    about: tuple[str, ...]  # GET paths where a server of this API describes itself

    def body(self, text: str, model: str) -> bytes:
        """The request of one query, serialised once before the test."""
        payload: dict[str, Any] = ({"input": text, "model": model} if self.name == "openai" else
                                   {"inputs": text, "truncate": True})  # TEI: a long text is cut, not refused (413)
        return json.dumps(payload).encode()

    def dimension(self, content: bytes) -> int:
        """The length of the one embedding the answer holds; BadAnswer when it holds none or several."""
        try:
            payload = json.loads(content)
        except ValueError:
            raise BadAnswer(f"not JSON: {content[:80]!r}") from None
        if self.name == "openai":
            data = payload.get("data") if isinstance(payload, dict) else None
            vectors = [row.get("embedding") for row in data if isinstance(row, dict)] if isinstance(data, list) else []
        else:
            vectors = payload if isinstance(payload, list) else []
        if len(vectors) != 1 or not isinstance(vectors[0], list) or not vectors[0]:
            raise BadAnswer(f"expected one embedding, got {str(payload)[:80]}")
        return len(vectors[0])


APIS = {"openai": HttpApi("openai", "/v1/embeddings", ("/v1/models", "/info")),
        "tei": HttpApi("tei", "/embed", ("/info",))}


def headers() -> dict[str, str]:
    key = os.environ.get(API_KEY_ENV)
    return {"content-type": "application/json", **({"authorization": f"Bearer {key}"} if key else {})}


def timings(response_headers) -> dict[str, float]:
    """The timing headers a response carries, in ms (a value that is not a number is left out)."""
    found = {}
    for name, header in TIMING_HEADERS.items():
        value = response_headers.get(header)
        if value is not None:
            try:
                found[name] = float(value)
            except ValueError:
                continue
    return found
