"""The keys of a server measured over HTTP (`endpoint=URL|managed api=openai|tei`), checked with the config: what
needs neither the server nor the model (docs/scenarios.md). The checks that need them are measure/http/endpoint.py's."""

from __future__ import annotations

from typing import Any

from corescale.errors import UserError
from corescale.workload.tasks import APIS, TASKS

HTTP_APIS = APIS  # endpoint=: what each query is sent as (measure/http/api.py; each task's routes)
MANAGED = "managed"  # endpoint=managed: each trial starts `corescale serve` on its own layout, measures it, stops it
LOCAL_ONLY = {"tokenize": "the front tokenizes every request",
              "min_quality": "no quality check runs over HTTP: check it in process (without endpoint=)",
              "reference": "no drift check runs over HTTP: check it in process (without endpoint=)"}


def default_api(endpoint: str | None) -> str:
    """openai for a running server; tei for endpoint=managed, whose requests ask for truncation at the layout's
    sequence_length (as the in-process server scenario truncates its text) and can carry any task."""
    return "tei" if endpoint == MANAGED else "openai"


def validate_endpoint(cfg: Any) -> None:
    """endpoint=URL|managed and api=: the API, the scenario, the task the API can send, and no key that asks for
    work a server does not do."""
    if cfg.endpoint is None:
        if cfg.api is not None:
            raise UserError(f"api={cfg.api} applies to a server measured over HTTP: add endpoint=http://HOST:PORT "
                            "(or endpoint=managed)")
        return
    if cfg.http_api not in HTTP_APIS:
        raise UserError(f"unknown api '{cfg.api}'; allowed: {', '.join(HTTP_APIS)}")
    managed = cfg.endpoint == MANAGED
    if (managed and cfg.scenario != "server") or cfg.scenario == "offline" or cfg.executor.name != "local":
        raise UserError(f"endpoint={cfg.endpoint} is measured from this machine under LoadGen's load: give "
                        "scenario=server (target_qps=QPS or auto with slo_p99_ms=MS)" +
                        ("" if managed else " or scenario=single_stream") + ", executor=local")
    if cfg.request_timeout is None or cfg.request_timeout <= 0:
        raise UserError(f"request_timeout must be > 0 (got {cfg.request_timeout})")
    if cfg.task is not None:
        check_task(cfg.http_api, cfg.task)
    for name, why in LOCAL_ONLY.items():
        if getattr(cfg, name):
            raise UserError(f"{name}= does not apply to a server measured over HTTP (endpoint=): {why}")
    if cfg.workload.lengths:
        raise UserError("workload.lengths draws random token ids, which cannot be sent to a server as text: give "
                        "workload=FILE with real text, or leave it out (the built-in corpus)")


def api_tasks(api: str) -> tuple[str, ...]:
    """The tasks the HTTP measurement can send over `api` (a route of theirs has a request)."""
    return tuple(name for name, task in TASKS.items() if task.route(api))


def check_task(api: str, task: str) -> None:
    """The task is one the API has a route for."""
    allowed = api_tasks(api)
    if task in allowed:
        return
    other = [route for a in HTTP_APIS if task in TASKS and (route := TASKS[task].route(a))]
    if other:
        sent = ", ".join(f"POST {route.path}" for name in allowed if (route := TASKS[name].route(api)))
        raise UserError(f"api={api} sends task {', '.join(allowed)} only ({sent}); task={task} is sent over "
                        f"api={other[0].api}: give api={other[0].api} (POST {other[0].path})")
    raise UserError(f"task={task} is not driven over HTTP; allowed with api={api}: {', '.join(allowed)}")
