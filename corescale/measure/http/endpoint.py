"""endpoint=: the running server is checked before LoadGen starts (reachable, healthy, answering this API: one
line and exit 2 if not), then warmed up and asked what it is (what the record says was measured)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from corescale.errors import UserError
from corescale.measure.http.api import BadAnswer, HttpApi, Query, api_of, headers
from corescale.measure.http.contract import API_KEY_ENV, ServiceInfo, is_loopback_host
from corescale.measure.timing import warm_up

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig

PROBE_TIMEOUT_S = 10.0
ANSWER_LIMIT = 16 << 20  # bytes read of one answer outside the measurement (probe, self-description), at most
REDIRECTS = range(300, 400)  # followed by neither client: the load would measure another URL than the one named
OUR_MISTAKES = (400, 401, 403, 404, 405, 413, 415, 422)  # the request is wrong for this server: refused, not measured
REPORT_LIMIT = 20_000  # characters of a self-description kept in the record
WARM_MIN_REQUESTS = 16  # a server's first requests (lazy loading, first shapes) and a moment's noise settle


@dataclass(frozen=True)
class Read:
    """An answer read within a byte limit and a total deadline (httpx's timeouts apply to each read alone, so a
    server trickling a byte every few seconds would hold a plain read for ever)."""

    status_code: int
    content: bytes
    location: str

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    def json(self):
        return json.loads(self.content)


def read(http, method: str, path: str, content: bytes | None = None, limit: int = ANSWER_LIMIT) -> Read:
    """One request, its answer read in full up to `limit` bytes and within the client's timeout in all; past
    either, httpx.ReadTimeout / httpx.ReadError (what the callers already handle as a failed request)."""
    import httpx

    deadline = time.monotonic() + float(http.timeout.read or PROBE_TIMEOUT_S)
    chunks, size = [], 0
    with http.stream(method, path, content=content) as answer:
        for chunk in answer.iter_bytes():
            size += len(chunk)
            if size > limit:
                raise httpx.ReadError(f"the answer passed {limit} bytes")
            if time.monotonic() > deadline:
                raise httpx.ReadTimeout(f"the answer took more than {http.timeout.read:g} s in all")
            chunks.append(chunk)
        return Read(answer.status_code, b"".join(chunks), answer.headers.get("location", ""))


@dataclass(frozen=True)
class Probed:
    health: int | None  # GET /health's status; None when the server has none (a first request answered)


def client(cfg: BenchmarkConfig, timeout: float | None = None):
    import httpx

    assert cfg.endpoint, "a config measured over HTTP names its endpoint"
    return httpx.Client(base_url=cfg.endpoint.rstrip("/"), headers=headers(),
                        timeout=timeout or min(cfg.request_timeout, PROBE_TIMEOUT_S))


def check_settings(cfg: BenchmarkConfig) -> None:
    """What config.validate leaves to the trial: a URL a client can send to."""
    from urllib.parse import urlsplit

    url = str(cfg.endpoint)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UserError(f"endpoint={url} is not a URL ({exc}); give http://HOST:PORT") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment or port == 0:
        raise UserError(f"endpoint={url} is not an http(s) URL of a server; give http://HOST:PORT (the API's paths "
                        "are added to it: /v1/embeddings, /embed, /health), or endpoint=managed")
    if parts.scheme == "http" and os.environ.get(API_KEY_ENV) and not is_loopback_host(parts.hostname):
        print(f"corescale: warning: {API_KEY_ENV} is sent to {parts.hostname} over plain http (readable on the "
              "way); use https:// for a remote server", file=sys.stderr)



def probe(cfg: BenchmarkConfig, query: Query) -> Probed:
    """GET /health, then one real request; UserError (one line) when the server cannot be reached, is not healthy,
    or refuses the request as malformed for it (wrong api=, model= or key). A first request that fails on the
    server's side (5xx, reset) is left to the measurement, which counts such errors."""
    import httpx

    api, url = api_of(cfg), cfg.endpoint
    with client(cfg) as http:
        try:
            health = read(http, "GET", "/health")
        except httpx.HTTPError as exc:
            raise UserError(f"endpoint {url} cannot be reached: GET /health failed ({why(exc)}); start the server "
                            "or correct endpoint=") from None
        if health.status_code in REDIRECTS:
            raise UserError(redirected(str(url), "GET /health", health))
        if health.status_code not in (404, 405) and not health.is_success:
            raise UserError(f"endpoint {url} is not healthy: GET /health answered {health.status_code} "
                            f"({short(health.content)})")
        status = health.status_code if health.is_success else None
        try:
            answer = read(http, "POST", api.path, api.body(query, cfg.model))
        except httpx.HTTPError as exc:
            if status is None:
                raise UserError(f"endpoint {url} has no /health and POST {api.path} failed ({why(exc)})") from None
            return Probed(status)
        if answer.status_code in REDIRECTS:
            raise UserError(redirected(str(url), f"POST {api.path}", answer))
        if answer.status_code in OUR_MISTAKES or (status is None and not answer.is_success):
            raise UserError(f"endpoint {url} refused POST {api.path} with {answer.status_code} "
                            f"({short(answer.content)}); {hint(cfg, answer.status_code)}")
        if answer.is_success:
            try:
                api.check(answer.content)
            except BadAnswer as exc:
                raise UserError(f"endpoint {url} answered POST {api.path} without the {api.task} answer ({exc}); "
                                f"{hint(cfg, 200)}") from None
    return Probed(status)


def redirected(url: str, request: str, answer: Read) -> str:
    return (f"endpoint {url} answered {request} with a redirect ({answer.status_code} to "
            f"'{answer.location[:120]}'); neither client follows one (the load would measure another URL): "
            "give the URL it redirects to")


def hint(cfg: BenchmarkConfig, status: int) -> str:
    if status in (401, 403):
        return f"the server wants a key: set {API_KEY_ENV}"
    other = "tei" if cfg.http_api == "openai" else "openai"
    model = f" or a model= it serves (sent: '{cfg.model}')" if cfg.http_api == "openai" else ""
    return f"is it an api={cfg.http_api} server? try api={other}{model}"


@dataclass(frozen=True)
class Warm:
    requests: int
    errors: int
    durations_ms: list[float]  # each successful request alone
    dimension: int | None


def warm(cfg: BenchmarkConfig, bodies: list[bytes], api: HttpApi) -> Warm:
    """One request at a time, cycling over the queries, until the latency settles (the warmup.* keys, at least
    WARM_MIN_REQUESTS requests)."""
    import httpx

    texts = itertools.cycle(bodies)
    errors, dimension = 0, None
    good: list[float] = []

    def call() -> None:
        nonlocal errors, dimension
        began = time.perf_counter_ns()
        try:
            answer = http.post(api.path, content=next(texts))
            answer.raise_for_status()
            dimension = api.check(answer.content)
            good.append((time.perf_counter_ns() - began) / 1e6)
        except (httpx.HTTPError, BadAnswer):
            errors += 1

    settle = dataclasses.replace(cfg.warmup, min_iterations=max(cfg.warmup.min_iterations, WARM_MIN_REQUESTS))
    with client(cfg, cfg.request_timeout) as http:
        done = warm_up(call, settle)
    return Warm(len(done.durations_ns), errors, good, dimension)


def self_description(cfg: BenchmarkConfig, api: HttpApi) -> tuple[int | None, dict]:
    """GET /health's status now (None: the server has none), and what the server says about itself at the API's
    paths (JSON answers only, each kept up to a size)."""
    import httpx

    found = {}
    with client(cfg) as http:
        try:
            status = read(http, "GET", "/health").status_code
        except httpx.HTTPError:
            status = None
        for path in api.about:
            try:
                answer = read(http, "GET", path)
                payload = answer.json() if answer.is_success else None
            except (httpx.HTTPError, ValueError):
                continue
            if payload is not None:
                text = json.dumps(payload)
                found[path] = payload if len(text) <= REPORT_LIMIT else {"truncated": text[:REPORT_LIMIT]}
    return (status if status not in (404, 405) else None), found


def instances_said(reports: dict) -> int:
    """How many instances the server says it runs side by side: a corescale serve's GET /info layout (a server
    that says nothing, or something else there: 1)."""
    try:
        return max(len(ServiceInfo.from_dict(reports.get("/info"), "GET /info").corescale.layout.instances), 1)
    except UserError:
        return 1


def engine_of(reports: dict) -> str | None:
    """Which engine served, as the server's GET /info says: corescale's names it under `corescale.engine`
    (`corescale serve`, or `ray serve` for `corescale deploy --target ray`; one written before it was said:
    `corescale serve`); None when the server does not say."""
    runs = (reports.get("/info") or {}).get("corescale") if isinstance(reports.get("/info"), dict) else None
    if not isinstance(runs, dict):
        return None
    return str(runs.get("engine") or "corescale serve")[:100]


def why(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:120]}" if text else type(exc).__name__


def short(content: bytes) -> str:
    text = content.decode(errors="replace").replace("\n", " ").strip()
    return (text[:100] + "...") if len(text) > 100 else (text or "empty body")
