"""A trial of a server measured over HTTP: `endpoint=URL` (a running server) or `endpoint=managed` (the trial
starts `corescale serve` on its own layout on loopback, measures it, and stops it), with LoadGen's tests sent by
the HTTP client (load.py). No local instance is started by the trial itself."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path

from corescale.config import BenchmarkConfig
from corescale.http_keys import check_task
from corescale.machine.placement import Plan
from corescale.machine.scratch import scratch
from corescale.measure.http.api import api_of
from corescale.measure.loadgen_summary import summarise
from corescale.measure.trial import Trial, UncommittedResult, check_places, housekeeping_cpus
from corescale.record.sections import Managed, ServerSummary
from corescale.record.trial import Failure, TrialRecord, spec_key, trial_key
from corescale.workload.models import ModelSpec
from corescale.workload.samples import query_texts, text_summary

LOG_KEEP = 200_000  # bytes of the service's log kept with the result


def served_config(cfg: BenchmarkConfig) -> BenchmarkConfig:
    """endpoint=managed: the config `corescale serve` runs, a run's config of the same layout (checked and placed
    by prepare_trial, as a run's is)."""
    return dataclasses.replace(cfg, endpoint=None, api=None)


def prepare_endpoint(cfg: BenchmarkConfig, served: Trial | None = None) -> Trial:
    """endpoint=URL: the texts, then the server itself (reachable, healthy, answering this API); no model is loaded
    here. endpoint=managed (`served`: the layout's trial, already checked): the task is the served model's, and the
    key holds the layout too."""
    from corescale.measure.http.endpoint import check_settings, probe

    if served is None:
        check_settings(cfg)
    else:
        check_task(cfg.http_api, served.model.task)
        from corescale.workload.tokens import served_tokenizer

        served_tokenizer(served.cfg, served.model)
        cfg = dataclasses.replace(cfg, task=served.model.task)  # the route its queries go to
    texts, origin = query_texts(cfg)
    check_places(cfg)
    if served is None:
        probe(cfg, texts[0])
        model = ModelSpec(name=cfg.model, source="endpoint", config={"endpoint": cfg.endpoint, "api": cfg.http_api})
    else:
        model = served.model
    model = dataclasses.replace(model, config={**model.config, "texts": origin})
    digest = hashlib.sha256(json.dumps(texts).encode()).hexdigest()[:16]
    return Trial(cfg, model, served.plan if served else Plan(()), trial_key(spec_key(cfg, model), {"texts": digest}),
                 texts=texts, served=served.cfg if served else None)


def run_endpoint(trial: Trial, record: TrialRecord, started: float) -> UncommittedResult:
    """endpoint=URL: LoadGen's tests against the server. endpoint=managed: against a `corescale serve` of the
    trial's layout, started here and stopped after (its exit status and log tail recorded on failure)."""
    if trial.served is None:
        return over_http(trial, trial.cfg, record, started)
    from corescale.measure.http import managed
    from corescale.measure.http.endpoint import probe

    assert trial.texts is not None, "an endpoint trial carries its texts"
    with scratch("managed") as work:
        config, log = Path(work) / "served-config.json", Path(work) / "serve.log"
        config.write_text(json.dumps(trial.served.to_dict()))
        try:
            with managed.started([str(config)], log, "--max-queue", "1000000", "--max-inputs", str(most_inputs(trial)),
                                 ready_s=trial.cfg.timeout) as service, \
                    housekeeping_cpus(trial.instance_specs()) as client_cpus:
                cfg = dataclasses.replace(trial.cfg, endpoint=service.url, api=trial.cfg.http_api)
                probe(cfg, trial.texts[0])
                front_before, began = managed.scraped_front_cpu(service.url), time.monotonic()
                measured = over_http(trial, cfg, record, started)
                front_after, wall = managed.scraped_front_cpu(service.url), time.monotonic() - began
            front_cpu = front_after - front_before if front_before is not None and front_after is not None else None
            facts = Managed(layout_words(trial), service.front, sorted(client_cpus or os.sched_getaffinity(0)),
                            front_cpu, wall, service.exit_code)
            if record.server is not None and record.server.endpoint is not None:
                record.server = dataclasses.replace(
                    record.server, endpoint=dataclasses.replace(record.server.endpoint, managed=facts))
            if service.exit_code != 0 and record.ok:
                record.fail(Failure("error", f"corescale serve exited with status {service.exit_code} after the "
                                             f"measurement ({service.tail()})"))
        except managed.ServeFailed as exc:
            record.fail(Failure("error", f"{exc}; layout: {layout_words(trial)}"))
            measured = UncommittedResult(record, None, {})
        measured.logs["serve.log"] = log.read_bytes()[-LOG_KEEP:] if log.is_file() else b""
        record.elapsed_s = time.time() - started
    return measured


def most_inputs(trial: Trial) -> int:
    """The most inputs one request carries (a rerank query's texts), so the service's limit refuses none."""
    return max((1 if isinstance(q, str) else len(q[1]) for q in trial.texts or []), default=1)


def layout_words(trial: Trial) -> str:
    """The layout served, in words: instances x cores, their CPUs, backend, precision, dynamic batch."""
    cfg = trial.served
    assert cfg is not None, "a managed trial serves a config"
    cpus = " | ".join(",".join(map(str, spec.cpus)) for spec in trial.instance_specs())
    return (f"{len(trial.plan.instances)} instance(s) on CPUs {cpus}, {cfg.backend.name} {cfg.precision}, threads "
            f"{cfg.threads or 'one per core'}, server.max_batch {cfg.server.max_batch}"
            + (f", {cfg.server.fronts} fronts" if cfg.server.fronts > 1 else ""))


def over_http(trial: Trial, cfg: BenchmarkConfig, record: TrialRecord, started: float) -> UncommittedResult:
    """Warm the server up, ask what it is, then LoadGen's tests through the HTTP client (cfg.endpoint: its URL)."""
    from corescale.measure.http.endpoint import engine_of, instances_said, self_description, warm
    from corescale.measure.http.load import HttpServer, requests_csv

    api = api_of(cfg)
    assert trial.texts is not None, "an endpoint trial carries its texts"
    bodies = [api.body(text, cfg.model) for text in trial.texts]
    warmed = warm(cfg, bodies, api)
    health, reports = self_description(cfg, api)
    endpoint = {"url": cfg.endpoint, "api": api.name, "path": api.path, "health": health,
                "model_field": cfg.model if api.name == "openai" else None, "reports": reports,
                "single_ms": min(warmed.durations_ms, default=None), "warmup_requests": warmed.requests,
                "warmup_errors": warmed.errors, "dimension": warmed.dimension, "request_timeout_s": cfg.request_timeout,
                "engine": engine_of(reports)}
    interrupted = None
    with scratch() as work:
        server = HttpServer(cfg, bodies, warmed, Path(work), instances_said(reports))
        try:
            server.run()
        except KeyboardInterrupt as stop:
            interrupted = stop
            server.failure = Failure("interrupted", f"interrupted by {getattr(stop, 'signal_name', 'SIGINT')}")
    logs = {**server.outcome.logs, "http-requests.csv": requests_csv(server.request_rows)}
    summary = summarise(cfg, server.outcome, text_summary(trial.texts, trial.model.config["texts"]), endpoint)
    summary["parent"]["cpus"] = sorted(os.sched_getaffinity(0))
    record.server = ServerSummary.from_dict(summary, "server")
    if server.failure:
        record.fail(server.failure)
    elif not server.outcome.steps and not server.outcome.unreachable:
        record.fail(Failure("error", "LoadGen ran no test"))
    record.elapsed_s = time.time() - started
    return UncommittedResult(record, None, logs, interrupted)
