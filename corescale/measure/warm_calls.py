"""An instance's warm calls before serving: every shape a service forms called before the start (warm_shapes), and
warm calls of real queries at each batch size (real_calls: the QPS search's first guess). Run inside the worker."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig


REAL_DRAWS = 5  # warm calls of real queries timed per batch size (their median is the size's call time)


def real_calls(backend, model, cfg: BenchmarkConfig, queries, max_batch: int) -> list[list[int]]:
    """[rows, median ns] of warm calls of real queries for each batch size 1, 2, 4, ... max_batch: each call's rows
    drawn (seeded) from the query set and padded as the pad policy pads them, so the call times follow the
    workload's length distribution (a batch pads to its longest row), not its mean. Sizes stop past the first whose
    call takes longer than SLO_SHARE of the SLO (the estimate takes no larger one). The QPS search's first guess."""
    import numpy as np

    from corescale.measure.qps_search import SLO_SHARE
    from corescale.workload.samples import batch_inputs, pad_id, padded_length

    rng = np.random.default_rng(cfg.seed)
    sizes = sorted({1, max_batch} | {2**k for k in range(1, 13) if 2**k < max_batch})
    found: list[list[int]] = []
    for rows in sizes:
        took = []
        for _ in range(REAL_DRAWS):
            chosen = [queries.ids[int(i)] for i in rng.integers(0, len(queries.ids), rows)]
            length = padded_length([len(q) for q in chosen], cfg.pad, cfg.sequence_length)
            prepared = backend.prepare(batch_inputs(chosen, length, pad_id(model), model.takes_token_type_ids))
            began = time.perf_counter_ns()
            backend.to_numpy(backend.forward(prepared))
            took.append(time.perf_counter_ns() - began)
        median = sorted(took)[len(took) // 2]
        found.append([rows, int(median)])
        if cfg.slo_p99_ms and median / 1e6 > SLO_SHARE * cfg.slo_p99_ms:
            break  # no larger batch is one the estimate may take (qps_search.slo_capacity)
    return found


def warm_shapes(backend, model, cfg: BenchmarkConfig, max_batch: int, calls: int = 2,
                single_calls: int = 4) -> tuple[int | None, list[int]]:
    """Serving meets every batch size up to max_batch (and, padded to buckets, every bucket length): each is
    called `calls` times before the start (one query at sequence_length `single_calls` times), so no first-call
    cost at a new shape lands in the measured latencies. Returns (the fastest warm call of one query at sequence_length,
    the durations of the calls at max_batch x sequence_length), ns."""
    from corescale.workload.inputs import make_inputs
    from corescale.workload.samples import BUCKET_EDGES

    sizes = range(1, max_batch + 1) if max_batch <= 16 else sorted({1, max_batch} | {2**k for k in range(1, 13)
                                                                                  if 2**k < max_batch})
    lengths = {cfg.sequence_length}
    if cfg.pad == "bucket":
        lengths |= {edge for edge in BUCKET_EDGES if edge < cfg.sequence_length}
    single_ns = None
    at_max: list[int] = []
    for rows in sizes:
        for length in sorted(lengths):
            prepared = backend.prepare(make_inputs(model, rows, length, cfg.seed))
            single = rows == 1 and length == cfg.sequence_length
            for call in range(single_calls if single else calls):
                began = time.perf_counter_ns()
                backend.forward(prepared)
                took = time.perf_counter_ns() - began
                if single and call:  # warm calls: their fastest bounds any query's latency from below
                    single_ns = min(single_ns or 2**63, took)
                if rows == sizes[-1] and length == cfg.sequence_length:
                    at_max.append(took)
    return single_ns, at_max
