"""The config's `server` section: each instance's dynamic batcher and LoadGen's settings (docs/scenarios.md),
and its checks (config.validate calls them, before any worker starts)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from corescale.errors import UserError

QUEUE_DELAYS = ("fixed", "adaptive")  # server.queue_delay (measure/batching.py)
# LoadGen's early stopping: the fewest queries that can pass with none over the latency bound
# (loadgen/early_stopping.cc: 459 for the Server scenario's p99, 64 for SingleStream's p90)
EARLY_STOPPING_QUERIES = {"server": 459, "single_stream": 64}
# fields that bound how long a measurement may take, not what it measures: outside the config key (config.py)
UNMEASURED_SERVER_FIELDS = ("max_search_s",)
# fields added later: in the config key only where they differ from these defaults (earlier keys hold)
LATER_SERVER_FIELDS = {"fronts": 1, "max_padding": None}


@dataclass
class ServerConfig:
    """`scenario=server|single_stream`: each instance's dynamic batcher and LoadGen's settings (docs/scenarios.md)."""

    max_batch: int = 8  # queries one instance call may take
    max_queue_ms: float = 2.0  # how long the oldest waiting query may wait for a batch to fill
    # fixed: a batch that is not full waits max_queue_ms | adaptive: it waits only while the arrival rate says
    # another query comes within what is left of max_queue_ms (a slow stream goes at once, a fast one fills)
    queue_delay: str = "fixed"
    max_batch_tokens: Optional[int] = None  # padded tokens per call (rows x padded length); None = no budget
    # the share of a call's padded tokens that may be padding: a waiting query that would take the call past it
    # waits for another (the oldest always goes); None = no cap
    max_padding: Optional[float] = None
    min_query_count: int = 1024  # LoadGen's minimum per test (its minimum duration is `duration`)
    search_precision: float = 0.05  # target_qps=auto stops when (hi - lo) / lo is below this
    max_steps: int = 12  # LoadGen tests target_qps=auto may run
    # seconds a target_qps=auto search may run in all: it stops with the best valid rate found so far, the record
    # saying why (server.bounded); None = no bound but max_steps (a tune sets one from its budget: docs/tune.md)
    max_search_s: Optional[float] = None
    # front processes when the layout is served (endpoint=managed's `corescale serve`, and a bundle's), each before
    # its share of the instances: it must divide them (serve/fronts.py); an in-process run has no front
    fronts: int = 1


def validate_server(cfg: Any) -> None:
    """The server section's values (cfg: the BenchmarkConfig; its scenario and lengths bound some of them)."""
    server = cfg.server
    if server.max_batch < 1 or server.max_batch > 4096:
        raise UserError(f"server.max_batch must be a whole number from 1 to 4096 (got {server.max_batch})")
    if server.max_queue_ms < 0:
        raise UserError(f"server.max_queue_ms must be >= 0 (got {server.max_queue_ms})")
    if server.queue_delay not in QUEUE_DELAYS:
        raise UserError(f"unknown server.queue_delay '{server.queue_delay}'; allowed: {', '.join(QUEUE_DELAYS)}")
    if server.max_batch_tokens is not None and server.max_batch_tokens < cfg.sequence_length:
        raise UserError(f"server.max_batch_tokens={server.max_batch_tokens} cannot hold one query of up to "
                        f"sequence_length={cfg.sequence_length} tokens; allowed: >= {cfg.sequence_length}")
    padding = server.max_padding
    if padding is not None and (isinstance(padding, bool) or not isinstance(padding, (int, float))
                                or not 0 <= padding < 1):
        raise UserError(f"server.max_padding must be a share of a call's padded tokens from 0 to below 1, or "
                        f"null (no cap) (got {padding!r})")
    if server.min_query_count is None or server.min_query_count <= 0:
        raise UserError(f"server.min_query_count must be > 0 (got {server.min_query_count})")
    least = EARLY_STOPPING_QUERIES.get(cfg.scenario)
    if least and server.min_query_count < least:
        percentile = "99th" if cfg.scenario == "server" else "90th"
        raise UserError(f"server.min_query_count={server.min_query_count} is below {least}, the fewest queries "
                        f"LoadGen's early stopping needs to judge a {percentile} percentile ({cfg.scenario}; none "
                        f"over the bound, 99 % confidence): every test would be INVALID; allowed: >= {least}")
    if not 0 < server.search_precision < 1 or server.max_steps < 2:
        raise UserError("server.search_precision must be in (0, 1) and server.max_steps >= 2 "
                        f"(got {server.search_precision}, {server.max_steps})")
    _check_search_bound(server.max_search_s, cfg.duration)
    if isinstance(server.fronts, bool) or not isinstance(server.fronts, int) or server.fronts < 1:
        raise UserError(f"server.fronts must be a whole number >= 1 (got {server.fronts!r})")
    check_fronts(server.fronts, cfg.instances, f"server.fronts={server.fronts}", f"instances={cfg.instances}")


def _check_search_bound(seconds: Any, duration: float) -> None:
    """max_search_s: null, or a finite number of seconds that holds at least one LoadGen test (its minimum
    duration is `duration`)."""
    if seconds is None:
        return
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        raise UserError(f"server.max_search_s must be a number of seconds or null (got {seconds!r})")
    if seconds < duration:
        raise UserError(f"server.max_search_s={seconds:g} s cannot hold one LoadGen test of duration={duration:g} s; "
                        f"allowed: >= {duration:g}, or null (no bound)")


def check_fronts(fronts: int, instances: int, given: str, of: str | None = None) -> None:
    """Before any worker: `fronts` front processes must share the `instances` evenly (serve/fronts.py); `given`:
    where the count came from, `of`: the instances in words."""
    if instances % fronts:
        allowed = ", ".join(str(n) for n in range(1, instances + 1) if instances % n == 0)
        of = of or f"the layout's {instances} instance(s)"
        raise UserError(f"{given} does not divide {of} evenly among the fronts: give one of {allowed}")
