"""The HTTP front of `corescale serve`: FastAPI (Starlette underneath, pydantic for the request schemas).

Routes: OpenAI's `POST /v1/embeddings`; Hugging Face text-embeddings-inference's `/embed`, `/embed_all`,
`/rerank`, `/predict`, `/tokenize`; `GET /health`, `GET /info` (TEI's fields, and what runs: the layout and the
artifact of each instance), `GET /metrics`. Every answer of a computed route carries TEI's timing headers
(milliseconds): X-Tokenization-Time, X-Queue-Time, X-Inference-Time, X-Total-Time.
Statuses: 401 without the API key (when one is set), 413 an input over the measured length or too many inputs,
422 malformed JSON or a field of the wrong type (named), 429 the queue is full (Retry-After), 400 a route the
bundle's task does not serve, 503 the instance computing the request died (it is started again).
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import time
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from corescale.serve import pool as pools
from corescale.serve.tokens import Tokens, TooLarge

TEXTS = str | Annotated[list[str], Field(min_length=1)]


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


class Tokenize(BaseModel):
    inputs: TEXTS
    add_special_tokens: bool = True


class Refused(Exception):
    def __init__(self, status: int, message: str, kind: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.kind, self.headers = status, kind, headers or {}


def as_list(texts: TEXTS) -> list[str]:
    return [texts] if isinstance(texts, str) else list(texts)


TEI_TYPES = {"embed": "embedding", "rerank": "reranker", "classify": "classifier", "encode": "embedding"}


class Front:
    """What the routes share: the pool, the tokenizer, the head, the metrics."""

    def __init__(self, pool: pools.Pool, tokens: Tokens, head: dict[str, Any], model_name: str, metrics):
        self.pool, self.tokens, self.head, self.model_name, self.metrics = pool, tokens, head, model_name, metrics

    def needs(self, task: str, route: str) -> None:
        if self.head.get("task") != task:
            raise Refused(400, f"{route} needs a {task} bundle; this one serves task '{self.head.get('task')}'",
                          "Validation")

    async def compute(self, texts: list, truncate: bool, pairs: bool = False) -> tuple[list[np.ndarray], dict]:
        began = time.perf_counter()
        try:
            encoded = self.tokens.encode(texts, truncate, pairs)
        except TooLarge as exc:
            raise Refused(413, str(exc), "Validation") from None
        tokenized = time.perf_counter()
        loop = asyncio.get_running_loop()
        request = pools.Request(encoded.rows, loop, loop.create_future(), encoded.types)
        try:
            self.pool.submit(request)
        except pools.Overloaded as exc:
            raise Refused(429, f"Model is overloaded: {exc}", "Overloaded", {"Retry-After": "1"}) from None
        try:
            outputs = await request.future
        except pools.InstanceDied as exc:
            raise Refused(503, str(exc), "Unhealthy") from None
        timings = {"tokenization": tokenized - began, "queue": request.queue_ns / 1e9,
                   "inference": request.inference_ns / 1e9, "total": time.perf_counter() - began,
                   "tokens": encoded.tokens, "lengths": [len(row) for row in encoded.rows]}
        return outputs, timings

    def info(self) -> dict[str, Any]:
        """GET /info: Hugging Face TEI's fields, and under `corescale` what runs: the source, the serving config,
        the layout (each instance's CPUs, threads, the variables set, the artifact it loaded)."""
        from importlib.metadata import version

        opened, task = self.pool.bundle, self.head.get("task")
        layout = dict(opened.manifest.get("layout") or {})
        layout["instances"] = [{**entry, "artifact": instance.artifact} for entry, instance in
                               zip(layout.get("instances") or [], self.pool.instances)]
        return {"model_id": self.model_name, "model_dtype": opened.cfg.precision,
                "model_type": {TEI_TYPES.get(str(task), str(task)): self.head},
                "max_input_length": opened.cfg.sequence_length, "max_client_batch_size": self.tokens.max_inputs,
                "max_batch_requests": opened.cfg.server.max_batch, "version": version("corescale"),
                "corescale": {"source": str(opened.root) if opened.root else "overrides",
                              "backend": opened.cfg.backend.name, "precision": opened.cfg.precision,
                              "config": opened.cfg.to_dict(), "layout": layout}}

    def answer(self, route: str, body: Any, timings: dict) -> JSONResponse:
        self.metrics.answered(route, 200, timings)
        headers = {f"X-{name.title()}-Time": f"{timings[name] * 1e3:.3f}"
                   for name in ("tokenization", "queue", "inference", "total")}
        return JSONResponse(body, headers=headers)


class KeyCheck:
    """Plain ASGI middleware (no per-request task group): every route but /health needs the key."""

    def __init__(self, app, key: str, metrics) -> None:
        self.app, self.expected, self.metrics = app, f"Bearer {key}".encode(), metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] != "/health":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                self.metrics.answered(scope["path"], 401)
                response = refusal(Refused(401, "a valid API key is required (Authorization: Bearer KEY)",
                                           "Unauthorized"))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(front: Front, api_key: str | None) -> FastAPI:
    app = FastAPI(title="corescale serve", docs_url=None, redoc_url=None)

    if api_key:
        app.add_middleware(KeyCheck, key=api_key, metrics=front.metrics)

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused):
        front.metrics.answered(request.url.path, exc.status)
        return refusal(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        front.metrics.answered(request.url.path, 422)
        problems = [problem(e) for e in exc.errors()]
        return refusal(Refused(422, "; ".join(dict.fromkeys(problems)), "Validation"))

    @app.post("/v1/embeddings")
    async def embeddings(body: Embeddings):
        front.needs("embed", "/v1/embeddings")
        outputs, timings = await front.compute(as_list(body.input), truncate=False)
        if body.dimensions is not None and body.dimensions != outputs[0].shape[-1]:
            raise Refused(422, f"dimensions: this model gives {outputs[0].shape[-1]}, not {body.dimensions}",
                          "Validation")
        data = [{"object": "embedding", "index": i, "embedding": base64.b64encode(row.astype("<f4").tobytes()).decode()
                 if body.encoding_format == "base64" else row.tolist()} for i, row in enumerate(outputs)]
        usage = {"prompt_tokens": timings["tokens"], "total_tokens": timings["tokens"]}
        return front.answer("/v1/embeddings", {"object": "list", "data": data, "model": body.model or
                                               front.model_name, "usage": usage}, timings)

    @app.post("/embed")
    async def embed(body: Embed):
        front.needs("embed", "/embed")
        if not body.normalize and front.head.get("normalize"):
            raise Refused(422, "normalize: this bundle's head normalises inside the measured graph", "Validation")
        outputs, timings = await front.compute(as_list(body.inputs), body.truncate)
        return front.answer("/embed", [row.tolist() for row in outputs], timings)

    @app.post("/embed_all")
    async def embed_all(body: Embed):
        front.needs("encode", "/embed_all")
        outputs, timings = await front.compute(as_list(body.inputs), body.truncate)
        return front.answer("/embed_all", [row[:length].tolist() for row, length in zip(outputs, timings["lengths"])],
                            timings)

    @app.post("/rerank")
    async def rerank(body: Rerank):
        front.needs("rerank", "/rerank")
        outputs, timings = await front.compute([(body.query, t) for t in body.texts], body.truncate, pairs=True)
        logits = np.array([float(row.reshape(-1)[0]) for row in outputs])
        scores = logits if body.raw_scores else 1 / (1 + np.exp(-logits))
        ranked = [{"index": int(i), "score": float(scores[i]), **({"text": body.texts[i]} if body.return_text
                                                                 else {})} for i in np.argsort(-scores)]
        return front.answer("/rerank", ranked, timings)

    @app.post("/predict")
    async def predict(body: Predict):
        front.needs("classify", "/predict")
        single = isinstance(body.inputs, str)
        pairs = not single and bool(body.inputs) and isinstance(body.inputs[0], list)
        texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
        outputs, timings = await front.compute(texts, body.truncate, pairs=pairs)
        labels = list(front.head.get("labels") or [])
        answers = [[{"label": labels[i] if i < len(labels) else f"LABEL_{i}", "score": float(scores[i])}
                    for i in np.argsort(-scores)] for scores in (probabilities(row, body.raw_scores)
                                                                 for row in outputs)]
        return front.answer("/predict", answers[0] if single else answers, timings)

    @app.post("/tokenize")
    async def tokenize(body: Tokenize):
        texts = as_list(body.inputs)
        if len(texts) > front.tokens.max_inputs:
            raise Refused(413, f"{len(texts)} inputs in one request; at most {front.tokens.max_inputs}", "Validation")
        front.metrics.answered("/tokenize", 200)
        return JSONResponse(front.tokens.pieces(texts, body.add_special_tokens))

    @app.get("/health")
    async def health():
        ready = front.pool.ready_count()
        return Response(status_code=200 if ready else 503, content=f"{ready} of {len(front.pool.instances)} "
                        "instances ready\n", media_type="text/plain")

    @app.get("/info")
    async def info():
        return JSONResponse(front.info())

    @app.get("/metrics")
    async def metrics():
        return Response(front.metrics.text(), media_type="text/plain; version=0.0.4")

    return app


def problem(error: dict) -> str:
    """One validation error: the field's path, then what is wrong."""
    where = [str(p) for p in error["loc"][1:]]
    if error.get("type") == "json_invalid":
        return f"body: malformed JSON at character {where[0] if where else '?'}"
    return f"{'.'.join(where) or 'body'}: {error['msg']}"


def probabilities(row: np.ndarray, raw: bool) -> np.ndarray:
    logits = row.reshape(-1).astype(np.float64)
    if raw:
        return logits
    exp = np.exp(logits - logits.max())
    return exp / exp.sum()


def refusal(exc: Refused) -> JSONResponse:
    return JSONResponse({"error": str(exc), "error_type": exc.kind}, status_code=exc.status, headers=exc.headers)
