"""The benchmark scripts' one way to measure: their setups through the tool's own loop (trials/sweep.run_sweep,
what `corescale run -m` runs): every setup composed and checked before the first runs, `repeats` interleaved
round by round (A B C A B C ...), each repeat in fresh pinned processes (forks of pre-imported servers, as in any
sweep; CORESCALE_FORKSERVER=0 starts each worker from scratch), one progress line per trial on stderr."""

from __future__ import annotations

import dataclasses
import sys


def measure(setups: dict[str, list[str]], repeats: int = 1, stop_at_failure: bool = True) -> dict[str, list]:
    """{name: its TrialRecords, one per repeat in order} for each setup's overrides. stop_at_failure: the first
    failed trial ends the loop and the script (SystemExit naming it); else failures are records like the rest."""
    from corescale.trials.local import Listener
    from corescale.trials.sweep import plan_sweep, run_sweep

    planned = plan_sweep([[*overrides, f"repeats={repeats}"] for overrides in setups.values()])
    for item, name in zip(planned, setups):
        item.label = name

    class Progress(Listener):
        def starting(self, item, state):
            print(f"[{state.position}/{state.total}] {item.label} ...", file=sys.stderr, flush=True)

    state = run_sweep(planned, Progress(), resume=False, fail_fast=stop_at_failure)
    if state.stopped:
        failed = next(row for row in state.rows if row.status == "failed")
        raise SystemExit(f"{failed.item.label} failed: {failed.record.reason}")
    return {item.label: state.records_of(item) for item in planned}


def max_valid_qps(cfg, slo_p99_ms: float, **server) -> tuple[float | None, object]:
    """The server scenario as one figure: cfg as a `scenario=server target_qps=auto` search under slo_p99_ms
    (`server` sets server.*: max_batch=, max_queue_ms=, ...) through the ordinary trial loop (machine lock, fresh
    pinned instances, atomic result directory with LoadGen's logs). Returns (the max valid QPS, or None when the
    trial failed or no rate met the SLO; the TrialOutcome)."""
    from corescale.config import validate
    from corescale.measure.runner import TrialOutcome, prepare_trial
    from corescale.trials.local import run_trial

    searched = validate(dataclasses.replace(cfg, scenario="server", target_qps="auto", slo_p99_ms=slo_p99_ms,
                                            server=dataclasses.replace(cfg.server, **server)))
    outcome = run_trial(prepare_trial(searched), None, None)
    assert isinstance(outcome, TrialOutcome), "without done_meanwhile the trial is measured, never found"
    record = outcome.record
    return (record.server.max_valid_qps if record.ok and record.server else None), outcome
