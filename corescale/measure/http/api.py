"""What one query is over HTTP, per API and task (`api=openai|tei`; each task's routes, workload/tasks.py): the
request that carries it, the check that the answer is the task's answer to it, and the timing headers a server may
send (Hugging Face TEI's names, milliseconds)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

from corescale.http_keys import check_task
from corescale.measure.http.contract import API_KEY_ENV
from corescale.workload.tasks import TASKS, Route, resolve

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig

# the breakdown a server may report per response (TEI's headers; corescale serve sends the same)
TIMING_HEADERS = {"queue": "x-queue-time", "tokenization": "x-tokenization-time",
                  "inference": "x-inference-time", "total": "x-total-time"}
# one query: a text (embed, classify), or a rerank query with the texts it ranks
Query = Union[str, tuple[str, tuple[str, ...]]]


class BadAnswer(ValueError):
    """A 2xx answer that is not the task's answer to the query sent."""


@dataclass(frozen=True)
class HttpApi:
    name: str
    task: str
    route: Route  # the task's route on this API (workload/tasks.py)

    @property
    def path(self) -> str:  # POSTed to, under the endpoint
        return self.route.path

    @property
    def about(self) -> tuple[str, ...]:  # GET paths where a server of this API describes itself
        return self.route.about

    def body(self, query: Query, model: str) -> bytes:
        """The request of one query, serialised once before the test."""
        return json.dumps(resolve(str(self.route.request))(query, model)).encode()

    def check(self, content: bytes) -> int | None:
        """BadAnswer unless the answer is the task's answer to one query; the embedding's length (embed), else
        None."""
        try:
            payload = json.loads(content)
        except ValueError:
            raise BadAnswer(f"not JSON: {content[:80]!r}") from None
        return resolve(str(self.route.answer))(payload)


# the requests and answers of the registered tasks' routes (TEI: a long text is cut, not refused with 413)

def embeddings_request(query: Query, model: str) -> dict[str, Any]:
    return {"input": query, "model": model}


def texts_request(query: Query, model: str) -> dict[str, Any]:
    return {"inputs": query, "truncate": True}


def rerank_request(query: Query, model: str) -> dict[str, Any]:
    assert isinstance(query, tuple), "a rerank query carries its texts"
    return {"query": query[0], "texts": list(query[1]), "truncate": True}


def ranked_answer(payload: Any) -> None:
    if not isinstance(payload, list) or not payload or not all(scored(row, "index") for row in payload):
        raise BadAnswer(f"expected a list of {{index, score}}, got {str(payload)[:80]}")


def labelled_answer(payload: Any) -> None:
    rows = payload[0] if isinstance(payload, list) and len(payload) == 1 and isinstance(payload[0], list) \
        else payload  # TEI answers a list of lists when the inputs were a list
    if not isinstance(rows, list) or not rows or not all(scored(row, "label") for row in rows):
        raise BadAnswer(f"expected a list of {{label, score}}, got {str(payload)[:80]}")


def embeddings_answer(payload: Any) -> int:
    data = payload.get("data") if isinstance(payload, dict) else None
    return one_vector([row.get("embedding") for row in data if isinstance(row, dict)] if isinstance(data, list)
                      else [], payload)


def vectors_answer(payload: Any) -> int:
    return one_vector(payload if isinstance(payload, list) else [], payload)


def one_vector(vectors: list, payload: Any) -> int:
    if len(vectors) != 1 or not isinstance(vectors[0], list) or not vectors[0]:
        raise BadAnswer(f"expected one embedding, got {str(payload)[:80]}")
    return len(vectors[0])


def scored(row: Any, name: str) -> bool:
    return isinstance(row, dict) and name in row and isinstance(row.get("score"), (int, float))


def route_of(api: str, task: str) -> HttpApi:
    """The route `task` is sent to over `api` (one line where it has none)."""
    check_task(api, task)
    return HttpApi(api, task, TASKS[task].route(api))  # type: ignore[arg-type]  # check_task found it


def api_of(cfg: BenchmarkConfig) -> HttpApi:
    """The API and route a config's queries are sent to (its task: the first registered task unless task= says
    otherwise)."""
    return route_of(cfg.http_api, cfg.task or next(iter(TASKS)))


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
