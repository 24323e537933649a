"""The registered tasks' routes (workload/tasks.py names each schema and handler here): OpenAI's
`POST /v1/embeddings`; Hugging Face text-embeddings-inference's `/embed`, `/embed_all`, `/rerank`, `/predict`. A
handler gets the front, its task's entry (the scores of its logits) and the validated body; serve/app.py refuses a
route of another task than the bundle's (400) before it runs."""

from __future__ import annotations

import base64
from typing import Annotated, Literal

import numpy as np
from fastapi.responses import Response
from pydantic import BaseModel, Field

from corescale.serve.app import TEXTS, Front, Refused, as_list
from corescale.serve.names import serves
from corescale.workload.tasks import Task


class Embeddings(BaseModel):
    input: TEXTS | Annotated[list[int], Field(min_length=1)] | Annotated[list[list[int]], Field(min_length=1)]
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


async def embeddings(front: Front, task: Task, body: Embeddings) -> Response:
    """OpenAI's embeddings: unit-length vectors (as OpenAI's are: clients take the dot product as the cosine),
    `model` the served one (or 404 model_not_found), `dimensions` the model's (checked before computing)."""
    if body.model is not None and not serves(front.names, body.model):
        raise Refused(404, f"The model '{body.model[:200]}' does not exist; this service serves "
                      f"{', '.join(repr(n) for n in front.names)} (GET /v1/models)", "model_not_found")
    if any(not isinstance(item, str) for item in as_list(body.input)):  # type: ignore[arg-type]
        raise Refused(422, "input: token ids are not accepted: they would be another tokenizer's (tiktoken's) "
                      "ids, not this model's; send the text (LangChain: check_embedding_ctx_length=False)",
                      "Validation")
    if body.dimensions is not None and front.width is not None and body.dimensions != front.width:
        raise Refused(422, f"dimensions: this model gives {front.width}, not {body.dimensions}", "Validation")
    outputs, timings = await front.compute(as_list(body.input), truncate=False)  # type: ignore[arg-type]
    if body.dimensions is not None and body.dimensions != outputs[0].shape[-1]:
        raise Refused(422, f"dimensions: this model gives {outputs[0].shape[-1]}, not {body.dimensions}",
                      "Validation")
    vectors = unit(outputs, front.head.normalize)
    usage = {"prompt_tokens": timings["tokens"], "total_tokens": timings["tokens"]}

    def answer() -> dict:
        data = [{"object": "embedding", "index": i, "embedding": base64.b64encode(row.astype("<f4").tobytes())
                 .decode() if body.encoding_format == "base64" else row} for i, row in enumerate(vectors)]
        return {"object": "list", "data": data, "model": front.model_name, "usage": usage}
    return await front.answer_built("/v1/embeddings", answer, timings, vectors.size)


async def embed(front: Front, task: Task, body: Embed) -> Response:
    """TEI's /embed: `normalize` (default true) normalises in the front when the head does not; false on a head
    that normalises inside the measured graph is refused (the graph's vectors are all there is)."""
    if not body.normalize and front.head.normalize:
        raise Refused(422, "normalize: this bundle's head normalises inside the measured graph", "Validation")
    outputs, timings = await front.compute(as_list(body.inputs), body.truncate)
    vectors = unit(outputs, front.head.normalize) if body.normalize else np.stack(outputs)
    return await front.answer_built("/embed", lambda: vectors, timings, vectors.size)


async def embed_all(front: Front, task: Task, body: Embed) -> Response:
    outputs, timings = await front.compute(as_list(body.inputs), body.truncate, floats_per_token=front.width or 0)
    lengths = timings["lengths"]
    floats = sum(length * row.shape[-1] for row, length in zip(outputs, lengths))
    if floats > front.tokens.limits.answer_floats:  # the width was not known before computing
        raise Refused(413, f"the answer would hold {floats} floats; at most {front.tokens.limits.answer_floats} "
                      "(--max-answer-floats)", "Validation")
    return await front.answer_built("/embed_all", lambda: [row[:n] for row, n in zip(outputs, lengths)],
                                    timings, floats)


def unit(outputs: list[np.ndarray], normalised: bool) -> np.ndarray:
    """The rows as one array, L2-normalised unless the head did it already."""
    vectors = np.stack(outputs).astype(np.float32, copy=False)
    if normalised:
        return vectors
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.maximum(norms, np.float32(1e-12))


async def rerank(front: Front, task: Task, body: Rerank) -> Response:
    outputs, timings = await front.compute([(body.query, t) for t in body.texts], body.truncate, pairs=True)
    logits = np.array([float(row.reshape(-1)[0]) for row in outputs])
    scores = task.scored(logits, body.raw_scores)
    ranked = [{"index": int(i), "score": float(scores[i]), **({"text": body.texts[i]} if body.return_text
                                                             else {})} for i in np.argsort(-scores)]
    return front.answer("/rerank", ranked, timings)


async def predict(front: Front, task: Task, body: Predict) -> Response:
    single = isinstance(body.inputs, str)
    pairs = not single and bool(body.inputs) and isinstance(body.inputs[0], list)
    texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
    outputs, timings = await front.compute(texts, body.truncate, pairs=pairs)
    labels = list(front.head.labels)
    answers = [[{"label": labels[i] if i < len(labels) else f"LABEL_{i}", "score": float(scores[i])}
                for i in np.argsort(-scores)] for scores in (task.scored(row.reshape(-1).astype(np.float64),
                                                                         body.raw_scores) for row in outputs)]
    return front.answer("/predict", answers[0] if single else answers, timings)
