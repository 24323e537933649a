"""Bounded work: what a configuration asks of an instance must be able to finish within its `timeout`; counts
and durations that cannot are refused before anything starts (the rule: docs/config.md, "Bounded work")."""

from __future__ import annotations

from typing import Any

from corescale.errors import UserError

LOAD_MARGIN_S = 5.0  # the quickest load of any model and backend
MIN_CALL_S = 10e-6  # no forward call of any model on any backend is faster (nor the harness's own timing)
MAX_REPEATS = 1000  # a sweep has no overall timeout: each repeat is a trial of at least `duration`
MAX_QUERY_TOKENS = 1 << 27  # workload.samples x sequence_length: the query set's ids fit in 1 GiB


def check_bounded(cfg: Any, max_target_qps: float) -> None:
    """Work that cannot finish within `timeout` is refused before anything starts (docs/config.md, "Bounded
    work"): a count of calls that would outlast the timeout even at MIN_CALL_S a call."""
    budget = cfg.timeout - LOAD_MARGIN_S
    batches = -(-cfg.workload.samples // cfg.batch_size)  # a query set's window runs each of its batches once
    counts = {"min_iterations": cfg.min_iterations, "warmup.min_iterations": cfg.warmup.min_iterations,
              "warmup.max_iterations": cfg.warmup.max_iterations, "the batches of workload.samples": batches}
    for name, count in counts.items():
        if count * MIN_CALL_S > budget:
            raise UserError(f"{name}={count} cannot finish within timeout={cfg.timeout:g} s: even at "
                            f"{MIN_CALL_S * 1e6:g} us a call (faster than any model runs) that is "
                            f"{count * MIN_CALL_S:.3g} s; allowed: at most {int(budget / MIN_CALL_S)}")
    if cfg.repeats > MAX_REPEATS:
        raise UserError(f"repeats={cfg.repeats} is more than {MAX_REPEATS} (each repeat is a trial of at least "
                        f"duration={cfg.duration:g} s); allowed: 1 to {MAX_REPEATS}")
    query_set = cfg.workload.source or cfg.workload.lengths or cfg.scenario != "offline"  # else samples is unused
    if query_set and cfg.workload.samples * cfg.sequence_length > MAX_QUERY_TOKENS:
        raise UserError(f"workload.samples={cfg.workload.samples} x sequence_length={cfg.sequence_length} token ids "
                        f"are more than the {MAX_QUERY_TOKENS} a query set may hold (1 GiB); allowed: "
                        f"workload.samples <= {MAX_QUERY_TOKENS // cfg.sequence_length}")
    _check_loadgen_bounds(cfg, max_target_qps)


def _check_loadgen_bounds(cfg: Any, max_target_qps: float) -> None:
    """A LoadGen test stops issuing at half the timeout (measure/loadgen.py): its minimum duration and query count
    must be reachable before that, or every test is INVALID."""
    if cfg.scenario == "offline":
        return
    half = 0.5 * cfg.timeout
    if cfg.duration > half:
        raise UserError(f"scenario={cfg.scenario}: duration={cfg.duration:g} s is LoadGen's minimum test duration, "
                        f"but a test stops at half the timeout ({half:g} s); allowed: timeout >= {2 * cfg.duration:g}")
    count = cfg.server.min_query_count
    fastest = cfg.target_qps if isinstance(cfg.target_qps, (int, float)) else (
        max_target_qps if cfg.scenario == "server" else 1 / MIN_CALL_S)
    if count / fastest > half:
        rate = f"target_qps={fastest:g}" if fastest == cfg.target_qps else f"{fastest:g} queries/s at most"
        raise UserError(f"server.min_query_count={count} cannot be issued before a test stops at half the timeout "
                        f"({half:g} s) at {rate}: every test would be INVALID; allowed: server.min_query_count <= "
                        f"{int(fastest * half)}, or a longer timeout")
