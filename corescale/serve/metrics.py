"""`GET /metrics`: the service's Prometheus metrics (prometheus-client, its own registry)."""

from __future__ import annotations

import os
import resource
import threading
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

from corescale.measure.http.contract import FRONT_CPU_METRIC

SECONDS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
LENGTHS = (8, 16, 24, 32, 48, 64, 96, 128, 256, 384, 512)  # padded lengths (tokens)
WASTE = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # a call's share of padded tokens
OTHER = "other"  # the route label of every path the app does not serve


OTHERS_EVERY_S = 1.0  # with several fronts, each writes its metrics for the others this often (serve/fronts.py)

LOADED = time.monotonic()
SERVICE = os.getpid()  # imported before the fronts fork (serve/fronts.py): their ages count from the service's start


def process_age_s() -> float:
    """Seconds since the service's process started (Linux: its start time in /proc/PID/stat; elsewhere since this
    module was imported): cold start counts from the process, not from the service's first line of code."""
    try:
        ticks = int(Path(f"/proc/{SERVICE}/stat").read_text().rsplit(")", 1)[1].split()[19])
        return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic() - LOADED


def front_cpu_seconds() -> float:
    """The front's own CPU time: the HTTP server, tokenization, the queue and the dispatcher threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Metrics:
    def __init__(self) -> None:
        self.routes: frozenset[str] = frozenset()  # the app's paths (serve/app.py sets them)
        self.counters: dict[tuple[str, int], Counter] = {}  # bounded as the labels are: routes x statuses
        registry = self.registry = CollectorRegistry()
        ProcessCollector(registry=registry)
        self.started, self.cpu_at_start = time.monotonic(), front_cpu_seconds()
        self.requests = Counter("corescale_requests", "HTTP requests answered, by route and status",
                                ["route", "status"], registry=registry)
        self.inputs = Counter("corescale_inputs", "inputs (texts, pairs) computed", registry=registry)
        self.batch_rows = Histogram("corescale_batch_size", "inputs per instance call (dynamic batching)",
                                    buckets=ROWS, registry=registry)
        self.padded_length = Histogram("corescale_batch_padded_length", "the length (tokens) each instance call "
                                       "was padded to", buckets=LENGTHS, registry=registry)
        self.padding = Histogram("corescale_batch_padding_fraction", "the share of padding tokens in each "
                                 "instance call (1 - real ÷ rows x padded length)", buckets=WASTE, registry=registry)
        self.tokens = Counter("corescale_tokens", "tokens computed: real ones, and padded (rows x padded length)",
                              ["kind"], registry=registry)
        self.queue = Histogram("corescale_queue_seconds", "a request's wait for an instance", buckets=SECONDS,
                               registry=registry)
        self.inference = Histogram("corescale_inference_seconds", "one instance call", buckets=SECONDS,
                                   registry=registry)
        self.tokenization = Histogram("corescale_tokenization_seconds", "a request's tokenization",
                                      buckets=SECONDS, registry=registry)
        self.total = Histogram("corescale_request_seconds", "a request from arrival to answer", buckets=SECONDS,
                               registry=registry)
        self.restarts = Counter("corescale_instance_restarts", "instances started again after they died",
                                ["instance"], registry=registry)
        self.busy = Gauge("corescale_instance_busy_fraction", "the share of its time since it started that an "
                          "instance spent computing", ["instance"], registry=registry)
        self.queued = Gauge("corescale_queue_inputs", "inputs accepted and not yet answered", registry=registry)
        self.ready = Gauge("corescale_instances_ready", "instances loaded, warm and serving", registry=registry)
        front = Gauge(FRONT_CPU_METRIC, "the front's CPU time since the service started",
                      registry=registry)
        front.set_function(lambda: front_cpu_seconds() - self.cpu_at_start)
        cores = Gauge("corescale_front_cores_used", "the front's CPU time ÷ wall time since the service started",
                      registry=registry)
        cores.set_function(self.front_cores)
        self.shared: tuple[Path, int] | None = None  # (the folder, this front's index) with several fronts
        self.ready_s: float | None = None
        self.first_answer_s: float | None = None
        self.cold = Gauge("corescale_cold_start_seconds", "from the process's start to every instance ready (warm), "
                          "and to the first answered request (200)", ["until"], registry=registry)

    def ready_now(self) -> float:
        """Every instance is ready: the process's age now (time to ready)."""
        self.ready_s = process_age_s()
        self.cold.labels("ready").set(self.ready_s)
        return self.ready_s

    def front_cores(self) -> float:
        return (front_cpu_seconds() - self.cpu_at_start) / max(time.monotonic() - self.started, 1e-9)

    def watch(self, pool) -> None:
        """Gauges read from the pool when scraped."""
        for instance in pool.instances:
            self.busy.labels(str(instance.id)).set_function(instance.busy_fraction)
        self.queued.set_function(lambda: pool.pending)
        self.ready.set_function(pool.ready_count)

    def batch(self, rows: int, seconds: float, padded_length: int = 0, real_tokens: int = 0) -> None:
        self.batch_rows.observe(rows)
        self.inference.observe(seconds)
        self.inputs.inc(rows)
        if padded_length:
            padded = rows * padded_length
            self.padded_length.observe(padded_length)
            self.padding.observe(1 - real_tokens / padded)
            self.tokens.labels("real").inc(real_tokens)
            self.tokens.labels("padded").inc(padded)

    def restarted(self, instance: int) -> None:
        self.restarts.labels(str(instance)).inc()

    def answered(self, route: str, status: int, timings: dict[str, float] | None = None) -> None:
        """A request's answer, labelled by its route when the app has it, else `other` (labels are bounded: an
        unauthenticated client sending random paths must not grow the series)."""
        key = (route if route in self.routes else OTHER, status)
        counter = self.counters.get(key)
        if counter is None:  # each (route, status) child looked up once (labels() takes a lock and formats)
            counter = self.counters[key] = self.requests.labels(key[0], str(status))
        counter.inc()
        if status == 200 and self.first_answer_s is None and timings:
            self.first_answer_s = process_age_s()
            self.cold.labels("first_answer").set(self.first_answer_s)
        if timings:
            self.queue.observe(timings["queue"])
            self.tokenization.observe(timings["tokenization"])
            self.total.observe(timings["total"])

    def share(self, folder: Path, index: int) -> None:
        """One of several fronts (serve/fronts.py): its metrics written to `folder` every OTHERS_EVERY_S for the
        others, and text() answers every front's."""
        self.shared = (folder, index)
        threading.Thread(target=self.publish, daemon=True, name="corescale-serve-metrics").start()

    def publish(self) -> None:
        assert self.shared is not None
        folder, index = self.shared
        while True:
            written = folder / f".front-{index}.prom"
            try:
                written.write_bytes(generate_latest(self.registry))
                os.replace(written, folder / f"front-{index}.prom")  # whole or not at all for a reader
            except FileNotFoundError:  # the service's work folder is gone: it has stopped
                return
            except OSError:  # a full disk: the others show this front's last metrics
                pass
            time.sleep(OTHERS_EVERY_S)

    def text(self) -> bytes:
        """The exposition: this front's, or with several fronts every front's, each sample labelled with its front
        (this one's as of now, the others' as of their last write)."""
        own = generate_latest(self.registry)
        if self.shared is None:
            return own
        folder, index = self.shared
        texts = {index: own}
        for path in folder.glob("front-*.prom"):
            other = int(path.stem.split("-")[1])
            if other != index:
                try:
                    texts[other] = path.read_bytes()
                except OSError:  # replaced as it was opened: the next scrape reads it
                    pass
        return labelled_by_front(texts)


def labelled_by_front(texts: dict[int, bytes]) -> bytes:
    """Several fronts' expositions as one: each family once, with every front's samples labelled `front`."""
    from prometheus_client.metrics_core import Metric
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, Metric] = {}
    for index, text in sorted(texts.items()):
        for family in text_string_to_metric_families(text.decode()):
            merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type,
                                                             family.unit))
            merged.samples.extend(sample._replace(labels={**sample.labels, "front": str(index)})
                                  for sample in family.samples)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families(list(families.values())))
    return generate_latest(registry)


class Families:
    """A collector of ready-made metric families (labelled_by_front's)."""

    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self) -> list:
        return self.families
