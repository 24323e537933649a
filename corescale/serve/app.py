"""The HTTP front of `corescale serve`: FastAPI (Starlette underneath, pydantic for the request schemas).

Routes: each registered task's (workload/tasks.py; serve/routes.py: OpenAI's `POST /v1/embeddings`, Hugging Face
text-embeddings-inference's `/embed`, `/embed_all`, `/rerank`, `/predict`), `/tokenize`; `GET /health`, `GET /info`
(TEI's fields, and what runs: the layout and the artifact of each instance), `GET /metrics`. Every answer of a
computed route carries TEI's timing headers (milliseconds): X-Tokenization-Time, X-Queue-Time, X-Inference-Time,
X-Total-Time.
Statuses: 401 without the API key (when one is set), 413 an input over the measured length or too many inputs,
422 malformed JSON or a field of the wrong type (named), 429 the queue is full (Retry-After), 400 a route the
bundle's task does not serve, 503 the instance computing the request died (it is started again).
"""

from __future__ import annotations

import asyncio
import hmac
import time
from typing import Annotated, Any

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from corescale.measure.contract import ServiceInfo, WhatRuns
from corescale.serve import pool as pools
from corescale.serve.tokens import Tokens, TooLarge
from corescale.workload.heads import HeadSpec
from corescale.workload.tasks import TASKS, Route, Task, resolve

TEXTS = str | Annotated[list[str], Field(min_length=1)]


class Tokenize(BaseModel):
    inputs: TEXTS
    add_special_tokens: bool = True


class Answer(JSONResponse):
    """A computed route's answer, encoded by orjson: numpy rows (float32) go to JSON in C, no Python float lists
    in between (the stdlib encoder was the largest single item of the front's profile, docs/serve-profile.md)."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


class Refused(Exception):
    def __init__(self, status: int, message: str, kind: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.kind, self.headers = status, kind, headers or {}


def as_list(texts: TEXTS) -> list[str]:
    return [texts] if isinstance(texts, str) else list(texts)


class Front:
    """What the routes share: the pool, the tokenizer, the head, the metrics."""

    def __init__(self, pool: pools.Pool, tokens: Tokens, head: HeadSpec, model_name: str, metrics):
        self.pool, self.tokens, self.head, self.model_name, self.metrics = pool, tokens, head, model_name, metrics

    def needs(self, task: str, route: str) -> None:
        if self.head.task != task:
            raise Refused(400, f"{route} needs a {task} bundle; this one serves task '{self.head.task}'",
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

    def info(self) -> ServiceInfo:
        """GET /info: Hugging Face TEI's fields, and under `corescale` what runs: the source, the serving config,
        the layout (each instance's CPUs, threads, the variables set, the artifact it loaded)."""
        import dataclasses
        from importlib.metadata import version

        opened, task = self.pool.bundle, self.head.task
        layout = dataclasses.replace(opened.layout, instances=[
            dataclasses.replace(entry, artifact=instance.artifact)
            for entry, instance in zip(opened.layout.instances, self.pool.instances)])
        runs = WhatRuns(str(opened.root) if opened.root else "overrides", opened.cfg.backend.name, opened.cfg.precision,
                      opened.cfg.to_dict(), layout)
        return ServiceInfo(self.model_name, opened.cfg.precision,
                           {TASKS[task].tei_type if task in TASKS else task: self.head.to_json()},
                           opened.cfg.sequence_length, self.tokens.max_inputs, opened.cfg.server.max_batch,
                           version("corescale"), runs)

    def answer(self, route: str, body: Any, timings: dict) -> Answer:
        self.metrics.answered(route, 200, timings)
        headers = {f"X-{name.title()}-Time": f"{timings[name] * 1e3:.3f}"
                   for name in ("tokenization", "queue", "inference", "total")}
        return Answer(body, headers=headers)


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

    for task in TASKS.values():
        for route in task.routes:
            app.post(route.path)(endpoint(front, task, route))

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
        return JSONResponse(front.info().to_dict())

    @app.get("/metrics")
    async def metrics():
        return Response(front.metrics.text(), media_type="text/plain; version=0.0.4")

    return app


def endpoint(front: Front, task: Task, route: Route):
    """The FastAPI endpoint of one task's route: its request schema and handler (hooks), refused (400) unless the
    bundle serves that task."""
    handler = resolve(route.handler)

    async def post(body):
        front.needs(task.name, route.path)
        return await handler(front, task, body)

    post.__annotations__ = {"body": resolve(route.schema)}  # what FastAPI validates the body against (422)
    post.__name__ = route.handler.split(":")[1]
    return post


def problem(error: dict) -> str:
    """One validation error: the field's path, then what is wrong."""
    where = [str(p) for p in error["loc"][1:]]
    if error.get("type") == "json_invalid":
        return f"body: malformed JSON at character {where[0] if where else '?'}"
    return f"{'.'.join(where) or 'body'}: {error['msg']}"


def refusal(exc: Refused) -> JSONResponse:
    return JSONResponse({"error": str(exc), "error_type": exc.kind}, status_code=exc.status, headers=exc.headers)
