"""What one query is over HTTP, per API and task (`api=openai|tei`; embed, rerank, classify): the request that
carries it, the check that the answer is the task's answer to it, and the timing headers a server may send
(Hugging Face TEI's names, milliseconds)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Union

from corescale.http_keys import check_task

# the breakdown a server may report per response (TEI's headers; corescale serve sends the same)
TIMING_HEADERS = {"queue": "x-queue-time", "tokenization": "x-tokenization-time",
                  "inference": "x-inference-time", "total": "x-total-time"}
API_KEY_ENV = "CORESCALE_API_KEY"  # sent as `Authorization: Bearer KEY` (kept out of the config and the record)
# one query: a text (embed, classify), or a rerank query with the texts it ranks
Query = Union[str, tuple[str, tuple[str, ...]]]


class BadAnswer(ValueError):
    """A 2xx answer that is not the task's answer to the query sent."""


@dataclass(frozen=True)
class HttpApi:
    name: str
    task: str  # embed | rerank | classify
    path: str  # POSTed to, under the endpoint
    about: tuple[str, ...]  # GET paths where a server of this API describes itself

    def body(self, query: Query, model: str) -> bytes:
        """The request of one query, serialised once before the test. TEI: a long text is cut, not refused (413)."""
        payload: dict[str, Any]
        if self.task == "rerank":
            assert isinstance(query, tuple), "a rerank query carries its texts"
            payload = {"query": query[0], "texts": list(query[1]), "truncate": True}
        else:
            payload = {"input": query, "model": model} if self.name == "openai" else {"inputs": query, "truncate": True}
        return json.dumps(payload).encode()

    def check(self, content: bytes) -> int | None:
        """BadAnswer unless the answer is the task's answer to one query; the embedding's length (embed), else
        None."""
        try:
            payload = json.loads(content)
        except ValueError:
            raise BadAnswer(f"not JSON: {content[:80]!r}") from None
        if self.task == "rerank":
            if not isinstance(payload, list) or not payload or not all(scored(row, "index") for row in payload):
                raise BadAnswer(f"expected a list of {{index, score}}, got {str(payload)[:80]}")
            return None
        if self.task == "classify":
            rows = payload[0] if isinstance(payload, list) and len(payload) == 1 and isinstance(payload[0], list) \
                else payload  # TEI answers a list of lists when the inputs were a list
            if not isinstance(rows, list) or not rows or not all(scored(row, "label") for row in rows):
                raise BadAnswer(f"expected a list of {{label, score}}, got {str(payload)[:80]}")
            return None
        if self.name == "openai":
            data = payload.get("data") if isinstance(payload, dict) else None
            vectors = [row.get("embedding") for row in data if isinstance(row, dict)] if isinstance(data, list) else []
        else:
            vectors = payload if isinstance(payload, list) else []
        if len(vectors) != 1 or not isinstance(vectors[0], list) or not vectors[0]:
            raise BadAnswer(f"expected one embedding, got {str(payload)[:80]}")
        return len(vectors[0])


def scored(row: Any, name: str) -> bool:
    return isinstance(row, dict) and name in row and isinstance(row.get("score"), (int, float))


ROUTES = {("openai", "embed"): HttpApi("openai", "embed", "/v1/embeddings", ("/v1/models", "/info")),
          ("tei", "embed"): HttpApi("tei", "embed", "/embed", ("/info",)),
          ("tei", "rerank"): HttpApi("tei", "rerank", "/rerank", ("/info",)),
          ("tei", "classify"): HttpApi("tei", "classify", "/predict", ("/info",))}


def api_of(cfg) -> HttpApi:
    """The API and route a config's queries are sent to (its task: embed unless task= says otherwise)."""
    task = cfg.task or "embed"
    check_task(cfg.http_api, task)
    return ROUTES[cfg.http_api, task]


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
