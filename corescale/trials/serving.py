"""The server scenario as a tuner objective: one config -> the highest QPS whose LoadGen p99 meets an SLO.

`max_valid_qps(cfg, slo_p99_ms)` runs one `scenario=server target_qps=auto` trial through the ordinary trial loop
(machine lock, fresh pinned instances, atomic result directory with LoadGen's logs) and returns the figure with
its outcome; a failed trial, or a search where no rate met the SLO, gives None (a tuner's worst value).
"""

from __future__ import annotations

import dataclasses

from corescale.config import BenchmarkConfig, validate
from corescale.measure.runner import TrialOutcome, prepare_trial
from corescale.trials.local import run_trial


def server_config(cfg: BenchmarkConfig, slo_p99_ms: float, **server) -> BenchmarkConfig:
    """cfg as a target_qps=auto search under slo_p99_ms; `server` sets server.* (max_batch=, max_queue_ms=, ...)."""
    settings = dataclasses.replace(cfg.server, **server)
    return validate(dataclasses.replace(cfg, scenario="server", target_qps="auto", slo_p99_ms=slo_p99_ms,
                                        server=settings))


def qps_of(outcome: TrialOutcome) -> float | None:
    """The max valid QPS a finished server trial found (None when it failed or nothing met the SLO)."""
    record = outcome.record
    return record.server.max_valid_qps if record.ok and record.server else None


def max_valid_qps(cfg: BenchmarkConfig, slo_p99_ms: float, host: dict | None = None, on_event=None,
                  **server) -> tuple[float | None, TrialOutcome]:
    """Measures cfg's deployment under Poisson load and searches its max valid QPS at p99 <= slo_p99_ms."""
    outcome = run_trial(prepare_trial(server_config(cfg, slo_p99_ms, **server)), host, on_event)
    assert isinstance(outcome, TrialOutcome), "without done_meanwhile the trial is measured, never found"
    return qps_of(outcome), outcome
