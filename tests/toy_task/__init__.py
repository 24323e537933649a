"""A toy task registered from the test suite (as tests/toy_backend is a backend): `task=toyscore`, a pooled head
(one vector per text, which every backend with a pooled head computes), judged by how far its vectors' norms
move, served at `POST /toy` (TEI's API) and sent there by the HTTP measurement.

TOYSCORE is its registry entry; the hooks it names (the route's schema, handler, request and answer, the judge)
are this module's. `register(TOYSCORE)` adds it (the `toy_task` fixture in conftest.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import BaseModel

from corescale.workload.tasks import Route, Task

NAME = "toyscore"


class ToyRequest(BaseModel):
    inputs: list[str]


async def answer(front, task: Task, body: ToyRequest):
    """The norm of each text's vector."""
    outputs, timings = await front.compute(list(body.inputs), truncate=True)
    return front.answer("/toy", {"norms": [float(np.linalg.norm(row)) for row in outputs]}, timings)


def request(query: Any, model: str) -> dict[str, Any]:
    return {"inputs": [query]}


def norms_answer(payload: Any) -> None:
    from corescale.measure.http.api import BadAnswer

    if not (isinstance(payload, dict) and isinstance(payload.get("norms"), list) and len(payload["norms"]) == 1):
        raise BadAnswer(f"expected one norm, got {str(payload)[:80]}")


def judge(out: np.ndarray, ref: np.ndarray, groups: np.ndarray | None) -> dict[str, float]:
    moved = np.abs(np.linalg.norm(out, axis=1) - np.linalg.norm(ref, axis=1))
    return {"norm_drift_max": float(moved.max())}


TOYSCORE = Task(NAME, "toy scorer", "pooled", "sentence_embedding", "toy", metrics=(("norm_drift_max", "lower"),),
                gate="norm_drift_max<=0.01", judge="toy_task:judge",
                routes=(Route("tei", "/toy", "toy_task:ToyRequest", "toy_task:answer", "toy_task:request",
                              "toy_task:norms_answer"),))
