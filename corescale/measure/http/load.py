"""`scenario=server endpoint=URL api=openai|tei`: LoadGen drives a running server over HTTP.

The same LoadGen tests, search and validity as the in-process server scenario (measure/loadgen.py), with the system
under test swapped: each query LoadGen issues becomes one POST carrying that query's text, sent by one async HTTP
client (aiohttp) on its own event-loop thread; LoadGen's issue callback hands the queries to that loop thread-safely,
and the query is reported complete to LoadGen the moment its answer is read (LoadGen counts latency from the query's
scheduled issue). Every request's outcome is kept: a non-2xx answer, a reset or refused connection, a timeout or an
answer without its embedding is an error, counted by kind, and a test with any error is not valid. The server's
timing headers (queue, tokenization, inference, total), where it sends them, give each test's breakdown.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from corescale.measure.http.api import TIMING_HEADERS, BadAnswer, api_of, headers, timings
from corescale.measure.http.endpoint import Warm
from corescale.measure.loadgen import LoadGenServer, StepResult

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig

MAX_CONNECTIONS = 1024  # open loop: a query never waits for another's connection below this many in flight
# an idle connection is dropped here before servers drop theirs (uvicorn after 5 s): a request sent on a connection
# the server is closing fails with "Server disconnected", the client's race, not the server's error
KEEPALIVE_S = 2.0
ERROR_EXAMPLES = 3
REQUEST_COLUMNS = ("step", "query", "issued_ns", "sent_ns", "done_ns", "status", "error", *TIMING_HEADERS)


@dataclass
class StepLog:
    """Every request of one LoadGen test."""

    rows: list[tuple] = field(default_factory=list)  # REQUEST_COLUMNS, without the step
    errors: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0

    def failed(self, kind: str, message: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        if len(self.examples) < ERROR_EXAMPLES:
            self.examples.append(f"{kind}: {message}"[:200])

    def summary(self) -> dict:
        """The record's `http` of a step (sections.HttpStep)."""
        rows = np.array([r[1:4] for r in self.rows] or np.zeros((0, 3)), dtype=np.int64)
        client = {"wait": (rows[:, 1] - rows[:, 0]) / 1e6, "response": (rows[:, 2] - rows[:, 1]) / 1e6}
        server = {name: np.array([r[6 + i] for r in self.rows if r[6 + i] is not None], dtype=float)
                  for i, name in enumerate(TIMING_HEADERS)}
        return {"requests": len(self.rows), "errors": dict(self.errors), "max_in_flight": self.max_in_flight,
                "client_ms": {k: stats(v) for k, v in client.items() if len(v)},
                "server_ms": {k: stats(v) for k, v in server.items() if len(v)},
                "error_examples": list(self.examples)}


def stats(values: np.ndarray) -> dict:
    return {"count": int(len(values)), "mean": float(values.mean()), "p50": float(np.percentile(values, 50)),
            "p99": float(np.percentile(values, 99)), "max": float(values.max())}


class HttpServer(LoadGenServer):
    """The server scenario against a running server: `run()` returns once every LoadGen test is done."""

    def __init__(self, cfg: BenchmarkConfig, bodies: list[bytes], warm: Warm, work_dir: Path, instances: int = 1):
        super().__init__(cfg, np.ones(len(bodies), dtype=np.int64), work_dir)  # lengths: only their count (the QSL)
        self.api, self.bodies, self.warm = api_of(cfg), bodies, warm
        self.instances = max(instances, 1)  # what the server says it runs side by side (1: it does not say)
        assert cfg.endpoint, "a config measured over HTTP names its endpoint"
        self.url = cfg.endpoint.rstrip("/") + self.api.path
        self.loop = asyncio.new_event_loop()
        self.tasks: set[asyncio.Task] = set()
        self.posting: set[asyncio.Task] = set()  # requests sent and not answered (a task not started yet is not)
        self.log = StepLog()
        self.request_rows: list[tuple] = []  # every step's, for http-requests.csv

    def run(self) -> None:
        """Every LoadGen test (search or one rate) on a thread of their own while this one waits: Ctrl-C (or
        SIGTERM through the trial loop) reaches here, answers what is in flight and ends the test."""
        loop_thread = threading.Thread(target=self.loop.run_forever, name="corescale-http", daemon=True)
        loop_thread.start()
        self.session = asyncio.run_coroutine_threadsafe(self._open_session(), self.loop).result()
        control = threading.Thread(target=self._control, args=(time.perf_counter_ns(),), daemon=True,
                                   name="corescale-loadgen")
        try:
            control.start()
            while not self.finished.wait(0.2):
                pass
        except KeyboardInterrupt:
            self.abort()
            raise
        finally:
            asyncio.run_coroutine_threadsafe(self.session.close(), self.loop).result(timeout=10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            loop_thread.join(timeout=10)

    async def _open_session(self):
        """aiohttp's client (a C parser, a pool that stays cheap with many connections), made on the loop."""
        import aiohttp

        connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS, limit_per_host=MAX_CONNECTIONS,
                                         keepalive_timeout=KEEPALIVE_S)
        return aiohttp.ClientSession(headers=headers(), connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=self.cfg.request_timeout))

    def abort(self) -> None:
        self.aborted = True  # a request not started yet sees it when it starts (_cut)
        self.loop.call_soon_threadsafe(lambda: [task.cancel() for task in list(self.posting)])
        self.finished.wait(self.cfg.duration + 10)  # past that LoadGen's thread is left running (a daemon)

    def _stop(self) -> None:
        """Nothing was started here: the server keeps running."""

    def _cut(self) -> None:
        """The search's bound ended the test: the requests in flight are given up (answered to LoadGen at once);
        one not started yet sees `cut` when it starts (a task cancelled before it starts would never run its body,
        and LoadGen would wait for its query forever)."""
        self.cut = True
        self.loop.call_soon_threadsafe(lambda: [task.cancel() for task in list(self.posting)])

    # --- LoadGen's side ---
    def _issue(self, samples) -> None:
        """LoadGen's issue thread: the queries go to the event loop."""
        issued = time.perf_counter_ns()
        self.loop.call_soon_threadsafe(self._start, samples, issued)

    def _start(self, samples, issued_ns: int) -> None:
        for sample in samples:
            task = self.loop.create_task(self._send(sample, issued_ns))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _send(self, sample, issued_ns: int) -> None:
        """One query: POST its text; complete it to LoadGen as soon as the answer is read; log the outcome."""
        import aiohttp
        import mlperf_loadgen as lg

        log = self.log
        log.in_flight += 1
        log.max_in_flight = max(log.max_in_flight, log.in_flight)
        sent = time.perf_counter_ns()
        status, kind, message, content, answered = None, "", "", b"", {}
        posting = asyncio.current_task()
        try:
            if self.aborted or self.cut:
                raise asyncio.CancelledError
            if posting is not None:
                self.posting.add(posting)
            async with self.session.post(self.url, data=self.bodies[sample.index], allow_redirects=False) as answer:
                content = await answer.read()
                status, answered = answer.status, answer.headers
        except TimeoutError:
            kind, message = "timeout", f"no answer within request_timeout={self.cfg.request_timeout:g} s"
        except aiohttp.ClientConnectorError as exc:
            kind, message = "connect", str(exc)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError) as exc:
            kind, message = "reset", f"{type(exc).__name__}: {exc}"
        except aiohttp.ClientError as exc:
            kind, message = type(exc).__name__, str(exc)
        except asyncio.CancelledError:
            kind, message = ("cut", "the search's bound (server.max_search_s) ended the test") if self.cut and \
                not self.aborted else ("aborted", "the trial was stopped")
        if posting is not None:
            self.posting.discard(posting)
        done = time.perf_counter_ns()
        lg.QuerySamplesComplete([lg.QuerySampleResponse(sample.id, 0, 0)])
        log.in_flight -= 1
        times: dict[str, float] = {}
        if status is not None and not 200 <= status < 300:
            kind, message = f"http_{status}", content[:120].decode(errors="replace")
        elif status is not None:
            times = timings(answered)
            try:
                self.api.check(content)
            except BadAnswer as exc:
                kind, message = "bad_answer", str(exc)
            except Exception as exc:  # any answer the check cannot read (deep nesting, ...) is counted, not lost
                kind, message = "bad_answer", f"{type(exc).__name__}: {str(exc)[:120]}"
        if kind:
            log.failed(kind, message)
        log.rows.append((sample.index, issued_ns, sent, done, status, kind, *(times.get(n) for n in TIMING_HEADERS)))

    # --- the tests ---
    def _open_test(self) -> None:
        self.log = StepLog()

    def _close_test(self) -> None:
        """LoadGen saw every query answered; the loop finishes logging them."""
        async def drained() -> None:
            await asyncio.gather(*self.tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(drained(), self.loop).result()

    def _judged(self, result: StepResult) -> StepResult:
        """A test with any failed request is not valid, whatever its latencies."""
        http = self.log.summary()
        step = len(self.outcome.steps) + 1
        self.request_rows.extend((step, *row) for row in self.log.rows)
        errors = sum(count for kind, count in http["errors"].items() if kind != "cut")  # given up: not the server's
        broken = errors >= max(result.queries, 1) and not http["errors"].get("timeout") and not result.cut
        judged = dataclasses.replace(result, errors=errors, http=http, batches={}, broken=broken)
        if errors:
            judged = dataclasses.replace(judged, validity="INVALID", meets_slo=False)
        return judged

    def _unreachable(self) -> str | None:
        """Why no rate can meet the SLO: even the fastest request alone, warm, took longer."""
        slo = self.cfg.slo_p99_ms
        if slo is None or not self.warm.durations_ms or min(self.warm.durations_ms) <= slo:
            return None
        return (f"one request alone takes {min(self.warm.durations_ms):.1f} ms at the fastest (warm-up, "
                f"{len(self.warm.durations_ms)} requests), over the SLO of {slo:g} ms: no "
                "arrival rate can meet it")

    def _single_ms(self) -> float:
        recent = self.warm.durations_ms[-self.cfg.warmup.window:]
        return float(np.median(recent)) if recent else 10.0

    def _first_guess(self) -> float:
        """What one request at a time on each instance the server says it runs would sustain (a server that
        batches sustains more): the bracket corrects it either way, and a low first guess costs the longest test
        (min_query_count at a low rate)."""
        single = self._single_ms()
        capacity = self.instances * 1000 / single
        self.outcome.capacity = {"qps": capacity, "share": 1.0, "basis": "one warm request at a time",
                                 "per_instance": f"{self.instances} instance(s) at {single:.3g} ms a request"}
        return float(f"{max(capacity, 0.1):.3g}")

    def _expected_latency_ns(self) -> int:
        return int(self._single_ms() * 1e6)


def requests_csv(rows: list[tuple]) -> bytes:
    def cell(value) -> str:
        return "" if value is None else str(value)

    return (",".join(REQUEST_COLUMNS) + "\n" + "".join(",".join(map(cell, r)) + "\n" for r in rows)).encode()
