"""The HTTP front of `corescale serve`: FastAPI (Starlette underneath, pydantic for the request schemas).

Routes: each registered task's (workload/tasks.py; serve/routes.py: OpenAI's `POST /v1/embeddings`, Hugging Face
text-embeddings-inference's `/embed`, `/embed_all`, `/rerank`, `/predict`), `/tokenize`; `GET /health`, `GET /info`
(TEI's fields, and what runs: the layout and the artifact of each instance), `GET /metrics`. Every answer of a
computed route carries TEI's timing headers (milliseconds): X-Tokenization-Time, X-Queue-Time, X-Inference-Time,
X-Total-Time.
Statuses (every error as `{"error", "error_type"}`, the framework's own included; docs/deploy.md "Limits"): 400 a
route the bundle's task does not serve, or a Host header other than loopback's on a loopback service without a key;
401 without the API key (when one is set); 404 an unknown path or `model`; 405 a wrong method; 413 a body, an
input or a request over a limit (checked before any work), an input longer than the model takes (unless
truncated), an answer over --max-answer-floats; 422 malformed JSON, a field of the wrong type (named), an empty
input, token ids past the vocabulary; 429 the queue is full (Retry-After, checked before tokenizing); 500 a
non-finite output, or a batch the instance could not compute (it serves on); 503 the instance computing the
request died or missed its deadline (it is started again).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Annotated, Any

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from corescale.measure.http.contract import ServiceInfo, WhatRuns
from corescale.serve import pool as pools
from corescale.serve.guard import DISCONNECTED, Guard, Refused, refusal
from corescale.serve.names import serves
from corescale.serve.tokens import Tokens, TooLarge, Unservable
from corescale.workload.heads import HeadSpec
from corescale.workload.tasks import TASKS, Route, Task, resolve

TEXTS = str | Annotated[list[str], Field(min_length=1)]
INLINE_BYTES = 65_536  # a body parsed, or an answer of as many floats encoded, on the event loop; larger: a thread
# texts tokenized on the event loop: a few hundred tokens take ~0.1 ms there, while a hand-off to a thread costs
# the front 0.3-0.5 ms of CPU per request (docs/serve-profile.md); longer ones: a thread
INLINE_CHARS = 4_096
KINDS = {400: "Validation", 401: "Unauthorized", 404: "NotFound", 405: "MethodNotAllowed", 413: "Validation",
         422: "Validation", 429: "Overloaded", 500: "Backend", 503: "Unhealthy"}  # TEI's error types


class Tokenize(BaseModel):
    inputs: TEXTS
    add_special_tokens: bool = True


def as_list(texts: TEXTS) -> list[str]:
    return [texts] if isinstance(texts, str) else list(texts)


class Front:
    """What the routes share: the pool, the tokenizer, the head, the metrics; `width`: the length of one output
    row (an embedding's dimensions, a token's hidden size) where the model says it, else None."""

    def __init__(self, pool: pools.Pool, tokens: Tokens, head: HeadSpec, names: list[str], metrics,
                 width: int | None = None):
        self.pool, self.tokens, self.head, self.metrics = pool, tokens, head, metrics
        self.names = names  # serve/names.py: the canonical one first (what answers carry)
        self.model_name = names[0]
        self.started = int(time.time())
        self.width = width
        self.extra: dict[str, Any] = {}  # GET /info's corescale.extra: which front (or Ray replica) answered
        self.limiter: Any = None  # the threads tokenizing and encoding (made on the loop, on first use)

    def needs(self, task: str, route: str) -> None:
        if self.head.task != task:
            raise Refused(400, f"{route} needs a {task} bundle; this one serves task '{self.head.task}'",
                          "Validation")

    async def offload(self, work: Callable, *args) -> Any:
        """`work(*args)` in one of a few threads, the event loop free meanwhile (tokenizers and numpy release
        the GIL; json gives it up every few milliseconds)."""
        import anyio

        if self.limiter is None:
            self.limiter = anyio.CapacityLimiter(2)
        return await anyio.to_thread.run_sync(work, *args, limiter=self.limiter)

    async def parse(self, request: Request, schema: type[BaseModel]) -> Any:
        """The body as `schema` (422 naming the field), parsed in a thread when large; JSON only, as FastAPI
        requires (a cross-site text/plain POST computes nothing)."""
        json_only(request.headers.get("content-type"))
        try:
            raw = await request.body()
        except ClientDisconnect:  # gone before its body arrived (cut at --receive-timeout): no answer to send
            raise Refused(400, DISCONNECTED, "Validation") from None
        return await self.validated(raw, schema)

    async def validated(self, raw: bytes, schema: type[BaseModel]) -> Any:
        """`raw` as `schema` (pydantic's parser in Rust: ~2 % of the front's samples, docs/serve-profile.md), in a
        thread when large; 422 naming the field."""
        try:
            if len(raw) > INLINE_BYTES:
                return await self.offload(schema.model_validate_json, raw)
            return schema.model_validate_json(raw)
        except ValidationError as exc:
            raise Refused(422, "; ".join(dict.fromkeys(problem(e) for e in exc.errors())), "Validation") from None

    async def compute(self, texts: list, truncate: bool, pairs: bool = False,
                      floats_per_token: int = 0) -> tuple[list[np.ndarray], dict]:
        """Checked before any work (the counts, then room in the queue, then the tokens in a thread), then
        computed by an instance. `floats_per_token`: the answer holds that many floats per token (/embed_all),
        bounded by --max-answer-floats."""
        began = time.perf_counter()
        try:
            self.tokens.check(texts)
        except (TooLarge, Unservable) as exc:
            raise Refused(413 if isinstance(exc, TooLarge) else 422, str(exc), "Validation") from None
        try:
            self.pool.admit(len(texts))
        except pools.Overloaded as exc:
            raise Refused(429, f"Model is overloaded: {exc}", "Overloaded", {"Retry-After": "1"}) from None
        except pools.NotReady as exc:
            raise Refused(503, str(exc), "Unhealthy", {"Retry-After": str(math.ceil(exc.retry_after_s))}) from None
        loop = asyncio.get_running_loop()
        submitted = False
        try:
            try:
                encoded = self.tokens.encode(texts, truncate, pairs) if characters(texts) <= INLINE_CHARS else \
                    await self.offload(self.tokens.encode, texts, truncate, pairs)
            except (TooLarge, Unservable) as exc:
                raise Refused(413 if isinstance(exc, TooLarge) else 422, str(exc), "Validation") from None
            floats, limit = encoded.tokens * floats_per_token, self.tokens.limits.answer_floats
            if floats > limit:
                raise Refused(413, f"the answer would hold {floats} floats ({encoded.tokens} tokens x "
                              f"{floats_per_token}); at most {limit} (--max-answer-floats): send fewer or shorter "
                              "inputs", "Validation")
            tokenized = time.perf_counter()
            request = pools.Request(encoded.rows, loop, loop.create_future(), encoded.types)
            self.pool.submit(request)
            submitted = True
        finally:
            if not submitted:
                self.pool.release(len(texts))
        try:
            outputs = await request.future
        except pools.InstanceDied as exc:
            raise Refused(503, str(exc), "Unhealthy") from None
        except pools.BatchFailed as exc:
            raise Refused(500, str(exc), "Backend") from None
        broken = [i for i, row in enumerate(outputs) if not np.isfinite(row).all()]
        if broken:
            raise Refused(500, f"the model gave a non-finite output (NaN or inf) for input {broken[0]}", "Backend")
        timings = {"tokenization": tokenized - began, "queue": request.queue_ns / 1e9,
                   "inference": request.inference_ns / 1e9, "total": time.perf_counter() - began,
                   "tokens": encoded.tokens, "lengths": [len(row) for row in encoded.rows]}
        return outputs, timings

    def model_card(self, name: str) -> dict[str, Any]:
        """One entry of GET /v1/models, in OpenAI's shape (`created`: when this service started)."""
        return {"id": name, "object": "model", "created": self.started, "owned_by": "corescale"}

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
                      opened.cfg.to_dict(), layout, extra=dict(self.extra))
        return ServiceInfo(self.model_name, opened.cfg.precision,
                           {TASKS[task].tei_type if task in TASKS else task: self.head.to_json()},
                           self.tokens.max_length, self.tokens.max_inputs, opened.cfg.server.max_batch,
                           version("corescale"), runs,
                           {"auto_truncate": self.tokens.limits.auto_truncate,
                            "measured_length": opened.cfg.sequence_length, "limits": self.tokens.limits.to_json()})

    def answer(self, route: str, body: Any, timings: dict) -> Response:
        """`body` as JSON, with TEI's timing headers (a small answer: encoded on the event loop)."""
        return self.answered(route, encoded(lambda: body), timings)

    async def answer_built(self, route: str, build: Callable[[], Any], timings: dict, floats: int) -> Response:
        """`build()` as JSON, built and encoded in a thread when it holds more than INLINE_BYTES floats."""
        return self.answered(route, await self.offload(encoded, build) if floats > INLINE_BYTES else encoded(build),
                             timings)

    def answered(self, route: str, content: bytes, timings: dict) -> Response:
        self.metrics.answered(route, 200, timings)
        headers = {f"X-{name.title()}-Time": f"{timings[name] * 1e3:.3f}"
                   for name in ("tokenization", "queue", "inference", "total")}
        return Response(content, media_type="application/json", headers=headers)


def encoded(body: Callable[[], Any]) -> bytes:
    """orjson: numpy rows (float32) go to JSON in C, no Python float lists in between (the stdlib encoder was the
    largest single item of the front's profile, docs/serve-profile.md); NaN is refused before (Front.compute)."""
    return orjson.dumps(body(), option=orjson.OPT_SERIALIZE_NUMPY)


def create_app(front: Front, api_key: str | None, payload_bytes: int = 2_000_000,
               loopback_only: bool = False) -> Served:
    """The routes, behind the Guard; every error, the framework's own included, in the documented body."""
    app = Served(title="corescale serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(Guard, metrics=front.metrics, key=api_key, payload_bytes=payload_bytes,
                       loopback_only=loopback_only)
    guard = Guard(None, front.metrics, api_key, payload_bytes, loopback_only)

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused):
        front.metrics.answered(request.url.path, exc.status)
        return refusal(exc)

    @app.exception_handler(HTTPException)
    async def framework(request: Request, exc: HTTPException):  # 404 unknown path, 405 wrong method, ...
        front.metrics.answered(request.url.path, exc.status_code)
        return refusal(Refused(exc.status_code, str(exc.detail), KINDS.get(exc.status_code, "Validation"),
                               dict(exc.headers or {})))

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception):  # a bug of ours: logged by uvicorn, answered in shape
        front.metrics.answered(request.url.path, 500)
        return refusal(Refused(500, f"internal error ({type(exc).__name__})", "Backend"))

    for task in TASKS.values():
        for route in task.routes:
            app.post(route.path)(endpoint(front, task, route))
            app.fast[route.path] = fast_endpoint(front, task, route, guard)

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await front.parse(request, Tokenize)
        texts = as_list(body.inputs)
        try:
            front.tokens.check(texts)
            pieces = await front.offload(front.tokens.pieces, texts, body.add_special_tokens)
        except (TooLarge, Unservable) as exc:
            raise Refused(413 if isinstance(exc, TooLarge) else 422, str(exc), "Validation") from None
        front.metrics.answered("/tokenize", 200)
        return Response(await front.offload(encoded, lambda: pieces), media_type="application/json")

    @app.get("/health")
    async def health():
        ready = front.pool.ready_count()
        return Response(status_code=200 if ready else 503, content=f"{ready} of {len(front.pool.instances)} "
                        "instances ready\n", media_type="text/plain")

    @app.get("/v1/models")
    async def models():
        return Response(encoded(lambda: {"object": "list", "data": [front.model_card(n) for n in front.names]}),
                        media_type="application/json")

    @app.get("/v1/models/{model:path}")
    async def model(model: str):
        if not serves(front.names, model):
            raise Refused(404, f"The model '{model[:200]}' does not exist; this service serves "
                          f"{', '.join(repr(n) for n in front.names)}", "model_not_found")
        return Response(encoded(lambda: front.model_card(front.model_name)), media_type="application/json")

    @app.get("/info")
    async def info():
        return Response(encoded(lambda: front.info().to_dict()), media_type="application/json")

    @app.get("/metrics")
    async def metrics():
        return Response(front.metrics.text(), media_type="text/plain; version=0.0.4")

    front.metrics.routes = frozenset(getattr(route, "path", "") for route in app.routes)
    return app


class Served(FastAPI):
    """FastAPI, with every registered task's POST route (`fast`: path -> its ASGI endpoint) answered before
    FastAPI's stack: its five middlewares, routing and dependency solving were a third of the front's CPU per
    request, more than the endpoint's own work (docs/serve-profile.md). The same checks in the same order (the
    Guard's, the task, the content type, the body's size as it arrives, the route's pydantic schema), the same
    handlers and answers; every other path and method goes through FastAPI (404, 405, /tokenize, GET routes)."""

    fast: dict[str, Callable[..., Any]]

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.fast = {}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            fast = self.fast.get(scope["path"])
            if fast is not None:
                await fast(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


LOG = logging.getLogger("uvicorn.error")


def fast_endpoint(front: Front, task: Task, route: Route, guard: Guard) -> Callable[..., Any]:
    """One task's route as a plain ASGI endpoint (Served): what the Guard middleware, FastAPI's exception handlers
    and `endpoint` below do for it, without the layers between them."""
    handler, schema, path = resolve(route.handler), resolve(route.schema), route.path

    async def answer(scope, receive, send) -> None:
        try:
            guard.check(scope)
            front.needs(task.name, path)
            json_only(next((value.decode("latin-1") for name, value in scope["headers"]
                            if name == b"content-type"), None))
            response = await handler(front, task, await front.validated(await guard.body(receive), schema))
        except Refused as exc:
            front.metrics.answered(path, exc.status)
            response = refusal(exc)
        except Exception as exc:  # a bug of ours: logged as uvicorn logs it, answered in shape
            LOG.exception("Exception in ASGI application")
            front.metrics.answered(path, 500)
            response = refusal(Refused(500, f"internal error ({type(exc).__name__})", "Backend"))
        await response(scope, receive, send)

    return answer


def json_only(content_type: str | None) -> None:
    """JSON bodies only, as FastAPI requires (a cross-site text/plain POST computes nothing); none said: JSON."""
    kind = ("application/json" if content_type is None else content_type).split(";")[0].strip().lower()
    if not (kind == "application/json" or kind.startswith("application/") and kind.endswith("+json")):
        raise Refused(422, f"body: expected Content-Type application/json, not '{kind[:40]}'", "Validation")


def endpoint(front: Front, task: Task, route: Route):
    """The endpoint of one task's route: refused (400) unless the bundle serves that task, its body parsed
    against the route's schema (422), then its handler."""
    handler, schema = resolve(route.handler), resolve(route.schema)

    async def post(request: Request):
        front.needs(task.name, route.path)
        return await handler(front, task, await front.parse(request, schema))

    post.__name__ = route.handler.split(":")[1]
    return post


def problem(error: Any) -> str:
    """One validation error: the field's path, then what is wrong."""
    where = [str(p) for p in error["loc"]]
    if error.get("type") == "json_invalid":
        return f"body: malformed JSON ({error['msg'].removeprefix('Invalid JSON: ')})"
    return f"{'.'.join(where) or 'body'}: {error['msg']}"


def characters(texts: list) -> int:
    """The characters of a request's texts (a pair's two)."""
    return sum(len(t) if isinstance(t, str) else sum(len(part) for part in t) for t in texts)
