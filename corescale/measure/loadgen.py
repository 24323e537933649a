"""`scenario=server|single_stream`: MLPerf LoadGen drives the load, the trial's pinned instances serve it.

The parent holds LoadGen (seeded Poisson arrivals in Server, one query at a time in SingleStream) and ONE queue;
each instance has a dispatcher thread that, whenever its instance is idle, takes the next batch from the queue
(dynamic batching: up to server.max_batch queries and server.max_batch_tokens padded tokens, waiting at most
server.max_queue_ms after the oldest query arrived), sends the query indices down the instance's pipe, waits for
its `served` line and reports the queries complete to LoadGen. LoadGen counts latency from each query's
*scheduled* issue time, so a queue that falls behind shows in p99 (no coordinated omission).
`target_qps=auto` brackets then bisects on QPS, each step one LoadGen test judged by its validity (p99 within
the SLO, early stopping, minimum duration and query count), the instances staying loaded between steps;
`server.max_search_s` bounds the search's wall time: no test starts that cannot end within it, and a test still
running at the bound stops issuing and has its queued queries answered at once (cut: not valid).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import queue
import re
import resource
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from corescale.measure import qps_search
from corescale.measure.batching import Batcher, Waiting
from corescale.measure.instance import dispatch
from corescale.measure.protocol import Batch, Served, Stop
from corescale.measure.qps_search import Bound, floor_qps, search, slo_capacity, warm_capacity
from corescale.record.trial import Failure

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig

NO_SLO_NS = 3_600 * 10**9  # fixed target_qps without slo_p99_ms: LoadGen needs a bound; an hour judges nothing
PERCENTILES = ("50.00", "90.00", "95.00", "97.00", "99.00", "99.90")
LOG_FILES = ("summary", "detail")
FITS = 0.9  # a bounded search's first test issues its queries within this share of the bound
SINGLE_STREAM_QUERIES = 20_000  # the fewest single-stream queries LoadGen pre-generates (single_stream_expected_ns)


_ONE_TEST = threading.Lock()
_RUNNING: list[threading.Thread] = []  # the controller of this process's latest LoadGen test
log = logging.getLogger(__name__)


def _wait_for(thread: threading.Thread, timeout_s: float) -> None:
    """Joins a controller thread, at most its LoadGen test's max_duration (timeout_s / 2) and a margin; says so
    when that takes more than a moment."""
    thread.join(2.0)
    if thread.is_alive():
        log.warning("waiting for the stopped trial's LoadGen test to end (it issues the rest of its schedule, up to "
                    "%.0f s)", timeout_s / 2)
        thread.join(timeout_s / 2 + 30)


@dataclass
class StepResult:
    """One LoadGen test."""

    target_qps: float | None
    validity: str
    meets_slo: bool | None  # the search's verdict: None = LoadGen could not decide (too few queries)
    latency_ms: dict[str, float]
    scheduled_qps: float | None
    completed_qps: float | None
    queries: int
    overlatency_queries: int | None
    early_stopping: str
    checks: dict[str, bool]
    duration_s: float
    parent_cpu_s: float
    batches: dict[str, float]
    log_prefix: str
    errors: int = 0  # queries the system under test failed (over HTTP: non-2xx, reset, timeout, bad answer)
    http: dict | None = None  # over HTTP: the step's errors by kind and the server's timing breakdown
    broken: bool = False  # every query failed, none for lack of time (refused, 5xx): lower rates cannot help
    cut: bool = False  # the search's wall-time bound ended this test: its queued queries were answered at once
    retest: bool = False  # the search ran this rate again: its first test's miss was doubtful (qps_search.DOUBTFUL)

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class ServeOutcome:
    steps: list[StepResult] = field(default_factory=list)
    batch_rows: list[tuple] = field(default_factory=list)
    logs: dict[str, bytes] = field(default_factory=dict)
    unreachable: str | None = None  # target_qps=auto found no rate worth testing, and why
    bounded: str | None = None  # target_qps=auto: its wall-time bound (server.max_search_s) ended it, and how
    unestablished: str | None = None  # target_qps=auto: no rate met the SLO before a bound ended it (not: none can)
    capacity: dict | None = None  # target_qps=auto: the capacity estimate its first test came from
    skipped: str | None = None  # no LoadGen test ran: the artifact missed the quality gate first, and how


class LoadGenServer:
    """The launcher's serve hook: begin() once every instance is ready, served() for each reply line."""

    def __init__(self, cfg: BenchmarkConfig, lengths: np.ndarray, work_dir: Path, withhold=None):
        self.cfg, self.lengths, self.work_dir = cfg, lengths, work_dir
        self.withhold = withhold  # (instance 0's quality report) -> why it misses the gate, or None
        self.outcome = ServeOutcome()
        self.failure: Failure | None = None
        self.finished = threading.Event()
        self.aborted = False
        self.replies: dict[int, queue.Queue] = {}
        self.batcher: Batcher | None = None
        self.thread: threading.Thread | None = None
        self.batch_count = 0
        self.tests = 0
        self.lock = threading.Lock()
        self.step_batches: list[int] = []  # rows of each batch of the current step
        self.dispatchers: list[threading.Thread] = []
        self.bound = Bound(None)  # target_qps=auto: the search's wall-time bound, from its first test
        self.cut = False  # the bound ended the current test: queued queries are answered at once

    # --- the launcher's side ---
    def begin(self, launcher, start_ns: int) -> None:
        self.launcher = launcher
        self.replies = {i: queue.Queue() for i in launcher.instances}
        thread = threading.Thread(target=self._control, args=(start_ns,), name="corescale-loadgen", daemon=True)
        with _ONE_TEST:  # LoadGen's logger is process-wide: never two tests at once
            if _RUNNING and _RUNNING[0].is_alive():
                _wait_for(_RUNNING[0], self.cfg.timeout)
            if _RUNNING and _RUNNING[0].is_alive():
                self.failure = Failure("error", "the LoadGen test of an earlier trial in this process is still "
                                       "running; run this trial again")
                return
            _RUNNING[:] = [thread]
            self.thread = thread
            thread.start()

    def served(self, instance: int, reply: Served) -> None:
        self.replies[instance].put(reply)

    def abort(self) -> None:
        """The trial failed or was interrupted: dispatchers answer LoadGen at once so its test ends (wait_ended)."""
        self.aborted = True
        for replies in self.replies.values():
            replies.put(None)

    def wait_ended(self) -> None:
        """Returns once LoadGen's test has returned: an aborted test still issues the rest of its schedule (LoadGen
        cannot be stopped), at most its max_duration (half the timeout), answered at once. A next trial's test
        must not start beside it (mixed latencies in its summary)."""
        if self.thread is not None:
            _wait_for(self.thread, self.cfg.timeout)

    # --- the controller thread ---
    def _control(self, start_ns: int) -> None:

        try:
            time.sleep(max(start_ns - time.perf_counter_ns(), 0) / 1e9)
            self.outcome.skipped = self._withheld()
            if self.outcome.skipped:
                return
            if self.cfg.scenario == "server" and self.cfg.target_qps == "auto":
                self.outcome.unreachable = self._unreachable()
                if self.outcome.unreachable:
                    return
                server = self.cfg.server
                self.bound = Bound(server.max_search_s)
                first = self._first_guess()
                if server.max_search_s is not None:  # at least the lowest rate whose test fits the bound
                    first = max(first, float(f"{server.min_query_count / (FITS * server.max_search_s):.3g}"))
                found = search(self._step, first, server.search_precision, server.max_steps,
                               self.outcome.steps, floor_qps(self.cfg), self.cfg.slo_p99_ms, self.bound,
                               lambda qps: self._least_s(qps, server.min_query_count))
                self.outcome.bounded, self.outcome.unestablished = found.bounded, found.unestablished
                if self.outcome.capacity is not None:
                    self.outcome.capacity["first_qps"] = self.outcome.steps[0].target_qps if self.outcome.steps \
                        else None
            else:
                self.outcome.steps.append(self._step(self.cfg.target_qps if self.cfg.scenario == "server" else None))
        except BaseException as exc:  # reported through the launcher's loop
            self.failure = Failure.from_exception(exc)
        finally:
            self._stop()
            self.finished.set()

    def _stop(self) -> None:
        """The tests are over: the instances stop."""
        self.launcher.tell_all_quietly(Stop())

    def _withheld(self) -> str | None:
        """Why no LoadGen test runs: instance 0 checked the artifact's quality during its warm-up, and it missed
        the gate (the search would only measure a configuration that is withheld whatever it serves)."""
        if self.withhold is None:  # over HTTP: no instance of this process, no check
            return None
        checked = [inst.quality for inst in self.launcher.instances.values() if getattr(inst, "quality", None)]
        if not checked:
            return None
        reason = self.withhold(checked[0])
        if reason is None:
            return None
        return (f"skipped: the artifact's quality was checked before the QPS search and missed the gate ({reason}); "
                "no LoadGen test ran")

    def _unreachable(self) -> str | None:
        """Why no rate can meet the SLO, when one query alone (batch 1, warm, at the one length every query has)
        already takes longer on the fastest instance: its p99 can only be higher."""
        single = [inst.single_ns for inst in self.launcher.instances.values() if inst.single_ns]
        if not single or len(set(self.lengths.tolist())) != 1 or self.lengths[0] != self.cfg.sequence_length:
            return None
        fastest_ms = min(single) / 1e6
        if fastest_ms <= self.cfg.slo_p99_ms:
            return None
        return (f"one query alone takes {fastest_ms:.1f} ms on the fastest instance (batch 1, warm, "
                f"{self.cfg.sequence_length} tokens), over the SLO of {self.cfg.slo_p99_ms:g} ms: no arrival rate "
                "can meet it; use more cores per instance or a smaller model")

    def _first_guess(self) -> float:
        """qps_search.FIRST_SHARE of the instances' capacity at the SLO from their warm calls of real queries
        (qps_search.slo_capacity); where an instance sent none, half the warm capacity from its calls at
        sequence_length (qps_search.warm_capacity). A guess the bracket corrects either way; a low one costs the
        longest test (the minimum query count at a low rate). The estimate is kept for the record."""
        instances = list(self.launcher.instances.values())
        found = [slo_capacity(getattr(inst, "real_calls", None) or [], self.cfg.slo_p99_ms) for inst in instances]
        if instances and all(c is not None for c in found):
            known = [c for c in found if c is not None]
            capacity = sum(c.qps for c in known)
            each = "; ".join(f"instance {inst.id}: {c.rows} row(s) a call in {c.call_ms:.3g} ms ({c.qps:.4g} QPS)"
                             for inst, c in zip(instances, known))
            self.outcome.capacity = {"qps": capacity, "share": qps_search.FIRST_SHARE, "basis": "real lengths",
                                     "per_instance": each}
            return float(f"{max(qps_search.FIRST_SHARE * capacity, 0.1):.3g}")
        mean = float(self.lengths.mean()) if len(self.lengths) else self.cfg.sequence_length
        capacity = sum(warm_capacity(inst.call_ns, inst.single_ns, self.cfg.server.max_batch, mean,
                                     self.cfg.sequence_length) for inst in instances)
        self.outcome.capacity = {"qps": capacity, "share": 0.5, "basis": "sequence_length calls", "per_instance": ""}
        return float(f"{max(capacity / 2, 0.1):.3g}")

    def _least_s(self, qps: float, queries: int) -> float:
        """The least a LoadGen test at `qps` takes: its minimum duration, or the time to issue its queries."""
        return max(self.cfg.duration, queries / qps)

    def _cut(self) -> None:
        """The search's bound ended the current test: every query still queued is answered at once."""
        self.cut = True

    def _issue(self, samples) -> None:
        assert self.batcher is not None, "LoadGen issues queries only during a test"
        self.batcher.put(samples)

    def _step(self, qps: float | None) -> StepResult:
        """One LoadGen test at `qps` (None: SingleStream); a test LoadGen could not decide (too few queries
        for early stopping) is run once more with the queries it asked for."""
        import mlperf_loadgen as lg

        sut = lg.ConstructSUT(self._issue, lambda: None)  # one SUT and QSL per test keep LoadGen's state apart
        qsl = lg.ConstructQSL(len(self.lengths), len(self.lengths), lambda i: None, lambda i: None)
        try:
            result = self._test(qps, sut, qsl, self.cfg.server.min_query_count)
            more = _queries_needed(result.early_stopping)
            if result.meets_slo is None and more and \
                    (qps is None or self._least_s(qps, result.queries + more + 16) <= self.bound.left()):
                result = self._test(qps, sut, qsl, result.queries + more + 16)
            return result
        finally:
            lg.DestroyQSL(qsl)
            lg.DestroySUT(sut)

    def _test(self, qps, sut, qsl, min_queries: int) -> StepResult:
        import mlperf_loadgen as lg

        if self.aborted:
            raise RuntimeError("the trial was stopped")
        self.tests += 1
        prefix = f"loadgen-{self.tests:02d}-"
        out = self.work_dir / "loadgen" / prefix
        out.mkdir(parents=True)
        settings = test_settings(self.cfg, qps, min_queries, self._expected_latency_ns())
        left = self.bound.left()
        if left < self.cfg.timeout / 2:  # LoadGen stops issuing at the search's bound, the rest is cut there
            settings.max_duration_ms = max(int(left * 1000), 1)
        cutter = threading.Timer(max(left, 0.0), self._cut) if left < float("inf") else None
        log = lg.LogSettings()
        log.log_output.outdir = str(out)
        log.log_output.copy_summary_to_stdout = False
        log.enable_trace = False
        self._open_test()
        usage, began = _cpu_seconds(), time.perf_counter()
        self.cut = False
        if cutter is not None:
            cutter.daemon = True
            cutter.start()
        lg.StartTestWithLogSettings(sut, qsl, settings, log)
        if cutter is not None:
            cutter.cancel()
        cut = self.cut
        self._close_test()
        wall, cpu = time.perf_counter() - began, _cpu_seconds() - usage
        for name in LOG_FILES:
            path = out / f"mlperf_log_{name}.txt"
            if path.is_file():
                self.outcome.logs[f"{prefix}{name}.txt"] = path.read_bytes()
        if self.aborted:
            raise RuntimeError("the trial was stopped")
        result = step_result(qps, read_detail(out / "mlperf_log_detail.txt"), wall, cpu, self.step_batches, prefix)
        if cut:  # answered at once, not served: its latencies say nothing of the rate
            result = dataclasses.replace(result, cut=True, validity="INVALID", meets_slo=False)
        return self._judged(result)

    def _open_test(self) -> None:
        """Before a LoadGen test: the one queue and each instance's dispatcher."""
        self.launcher.extend_deadline()
        self.batcher = batcher = Batcher(self.cfg, self.lengths)
        self.step_batches = []
        self.dispatchers = [threading.Thread(target=self._dispatch, args=(i, batcher), daemon=True,
                                             name=f"corescale-dispatch-{i}") for i in self.launcher.instances]
        for thread in self.dispatchers:
            thread.start()

    def _close_test(self) -> None:
        """LoadGen's test has ended (every query answered): the dispatchers finish."""
        assert self.batcher is not None, "a test was opened"
        self.batcher.close()
        for thread in self.dispatchers:
            thread.join()

    def _judged(self, result: StepResult) -> StepResult:
        """LoadGen's verdict on a test, with what this system under test adds to it."""
        return result

    def _expected_latency_ns(self) -> int:
        return max(inst.call_ns for inst in self.launcher.instances.values()) or 1_000_000

    def _dispatch(self, instance: int, batcher: Batcher) -> None:
        dispatch(batcher, LoadGenFeeder(self, instance))


@dataclass
class LoadGenFeeder:
    """One instance's side of a LoadGen test: its batches told by index, each answered query complete to LoadGen
    (at once when the trial was stopped), each batch a row of the trial's batches.csv."""

    server: LoadGenServer
    instance: int
    number: int = 0  # the batch sent last: numbered across the instances

    def idle(self) -> bool:
        return True  # the instance answers each batch before this feeder takes the next

    def send(self, batch: list[Waiting]) -> bool:
        if self.server.aborted or self.server.cut:
            return False
        with self.server.lock:
            self.server.batch_count += 1
            self.number = self.server.batch_count
        return self.server.launcher.tell(self.instance, Batch(self.number, tuple(w.sample.index for w in batch)))

    def reply(self) -> Served | None:
        return self.server.replies[self.instance].get()

    def unsent(self, batch: list[Waiting]) -> None:
        self.complete(batch, 0, None)

    def complete(self, batch: list[Waiting], taken_ns: int, reply: Served | None) -> None:
        import mlperf_loadgen as lg

        lg.QuerySamplesComplete([lg.QuerySampleResponse(w.sample.id, 0, 0) for w in batch])
        if reply is None:
            return
        done_ns = time.perf_counter_ns()
        outcome = self.server.outcome
        self.server.step_batches.append(len(batch))
        outcome.batch_rows.append((len(outcome.steps) + 1, self.instance, self.number, len(batch), reply.length,
                                   reply.real_tokens, batch[0].arrived_ns, taken_ns, reply.start_ns, reply.end_ns,
                                   done_ns))


def single_stream_expected_ns(cfg: BenchmarkConfig, estimate_ns: int) -> int:
    """The expected latency LoadGen is told: it pre-generates 2 x min_duration / expected single-stream queries and
    ends the test when they run out, INVALID (min_duration_met false) if before min_duration. An estimate from a
    warm-up slowed by a busy machine must not leave too few: 4x the estimate's count, at least SINGLE_STREAM_QUERIES
    (generating them takes milliseconds; the test still stops once min_duration and min_query_count are met)."""
    return max(1, min(estimate_ns // 4, int(2e9 * cfg.duration / SINGLE_STREAM_QUERIES)))


def test_settings(cfg: BenchmarkConfig, qps: float | None, min_queries: int, expected_latency_ns: int):
    import mlperf_loadgen as lg

    settings = lg.TestSettings()
    settings.mode = lg.TestMode.PerformanceOnly
    settings.min_duration_ms = int(cfg.duration * 1000)
    settings.min_query_count = int(min_queries)
    settings.max_duration_ms = int(cfg.timeout * 500)  # a test stops issuing at half the timeout (see floor_qps)
    settings.qsl_rng_seed = settings.sample_index_rng_seed = settings.schedule_rng_seed = cfg.seed
    if qps is None:
        settings.scenario = lg.TestScenario.SingleStream
        settings.single_stream_expected_latency_ns = single_stream_expected_ns(cfg, expected_latency_ns)
    else:
        settings.scenario = lg.TestScenario.Server
        settings.server_target_qps = float(qps)
        settings.server_target_latency_ns = int(cfg.slo_p99_ms * 1e6) if cfg.slo_p99_ms else NO_SLO_NS
        settings.server_target_latency_percentile = 0.99
    return settings


def read_detail(path: Path) -> dict:
    """LoadGen's detail log: one `:::MLLOG {json}` per line -> {key: value}."""
    found = {}
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(":::MLLOG"):
            try:
                entry = json.loads(line[len(":::MLLOG"):])
            except ValueError:
                continue
            found[entry.get("key")] = entry.get("value")
    return found


def _queries_needed(text: str) -> int | None:
    match = re.search(r"at least (\d+) more queries", text or "")
    return int(match.group(1)) if match else None


def step_result(qps, detail: dict, wall: float, cpu: float, batches: list[int], prefix: str) -> StepResult:
    checks = {name: bool(detail.get(f"result_{name}")) for name in
              ("perf_constraints_met", "min_duration_met", "min_queries_met")}
    checks["early_stopping_met"] = bool(detail.get("early_stopping_met"))
    validity = str(detail.get("result_validity", "INVALID"))
    early = str(detail.get("early_stopping_result", ""))
    verdict: bool | None
    if validity == "VALID":
        verdict = True
    elif not checks["perf_constraints_met"] or "Reduce target QPS" in early:
        verdict = False
    else:  # within the bound so far, but LoadGen wants more queries to be sure
        verdict = None if _queries_needed(early) else False
    latency = {f"p{p.rstrip('0').rstrip('.')}": detail[f"result_{p}_percentile_latency_ns"] / 1e6
               for p in PERCENTILES if f"result_{p}_percentile_latency_ns" in detail}
    for name in ("mean", "min", "max"):
        if f"result_{name}_latency_ns" in detail:
            latency[name] = detail[f"result_{name}_latency_ns"] / 1e6
    sizes = np.asarray(batches or [0])
    return StepResult(
        target_qps=qps, validity=validity, meets_slo=verdict, latency_ms=latency,
        scheduled_qps=detail.get("result_scheduled_samples_per_sec"),
        completed_qps=detail.get("result_completed_samples_per_sec"),
        queries=int(detail.get("result_query_count") or 0),
        overlatency_queries=detail.get("result_overlatency_query_count"), early_stopping=early, checks=checks,
        duration_s=wall, parent_cpu_s=cpu,
        batches={"count": len(batches), "mean_rows": float(sizes.mean()), "max_rows": int(sizes.max()),
                 "share_multi_row": float((sizes > 1).mean())},
        log_prefix=prefix)


def _cpu_seconds() -> float:
    """The parent's own CPU time (LoadGen, the queue and the dispatchers are all threads of it)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
