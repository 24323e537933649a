"""The registered tasks' routes (workload/tasks.py names each schema and handler here): OpenAI's
`POST /v1/embeddings`; Hugging Face text-embeddings-inference's `/embed`, `/embed_all`, `/rerank`, `/predict`. A
handler gets the front, its task's entry (the scores of its logits) and the validated body; serve/app.py refuses a
route of another task than the bundle's (400) before it runs."""

from __future__ import annotations

import base64
from typing import Annotated, Literal

import numpy as np
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from corescale.serve.app import TEXTS, Front, Refused, as_list
from corescale.workload.tasks import Task


class Embeddings(BaseModel):
    input: TEXTS
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


class Embed(BaseModel):
    inputs: TEXTS
    normalize: bool = True
    truncate: bool = False


class Rerank(BaseModel):
    query: str
    texts: list[str] = Field(min_length=1)
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool = False


class Predict(BaseModel):
    inputs: str | Annotated[list[str], Field(min_length=1)] | Annotated[list[Annotated[list[str], Field(
        min_length=2, max_length=2)]], Field(min_length=1)]
    raw_scores: bool = False
    truncate: bool = False


async def embeddings(front: Front, task: Task, body: Embeddings) -> JSONResponse:
    outputs, timings = await front.compute(as_list(body.input), truncate=False)
    if body.dimensions is not None and body.dimensions != outputs[0].shape[-1]:
        raise Refused(422, f"dimensions: this model gives {outputs[0].shape[-1]}, not {body.dimensions}",
                      "Validation")
    data = [{"object": "embedding", "index": i, "embedding": base64.b64encode(row.astype("<f4").tobytes()).decode()
             if body.encoding_format == "base64" else row} for i, row in enumerate(outputs)]
    usage = {"prompt_tokens": timings["tokens"], "total_tokens": timings["tokens"]}
    return front.answer("/v1/embeddings", {"object": "list", "data": data, "model": body.model or
                                           front.model_name, "usage": usage}, timings)


async def embed(front: Front, task: Task, body: Embed) -> JSONResponse:
    if not body.normalize and front.head.normalize:
        raise Refused(422, "normalize: this bundle's head normalises inside the measured graph", "Validation")
    outputs, timings = await front.compute(as_list(body.inputs), body.truncate)
    return front.answer("/embed", outputs, timings)


async def embed_all(front: Front, task: Task, body: Embed) -> JSONResponse:
    outputs, timings = await front.compute(as_list(body.inputs), body.truncate)
    return front.answer("/embed_all", [row[:length] for row, length in zip(outputs, timings["lengths"])],
                        timings)


async def rerank(front: Front, task: Task, body: Rerank) -> JSONResponse:
    outputs, timings = await front.compute([(body.query, t) for t in body.texts], body.truncate, pairs=True)
    logits = np.array([float(row.reshape(-1)[0]) for row in outputs])
    scores = task.scored(logits, body.raw_scores)
    ranked = [{"index": int(i), "score": float(scores[i]), **({"text": body.texts[i]} if body.return_text
                                                             else {})} for i in np.argsort(-scores)]
    return front.answer("/rerank", ranked, timings)


async def predict(front: Front, task: Task, body: Predict) -> JSONResponse:
    single = isinstance(body.inputs, str)
    pairs = not single and bool(body.inputs) and isinstance(body.inputs[0], list)
    texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
    outputs, timings = await front.compute(texts, body.truncate, pairs=pairs)
    labels = list(front.head.labels)
    answers = [[{"label": labels[i] if i < len(labels) else f"LABEL_{i}", "score": float(scores[i])}
                for i in np.argsort(-scores)] for scores in (task.scored(row.reshape(-1).astype(np.float64),
                                                                         body.raw_scores) for row in outputs)]
    return front.answer("/predict", answers[0] if single else answers, timings)
