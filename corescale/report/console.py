"""Everything the user sees on the terminal: result tables and the live progress display."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

console = Console(stderr=False, highlight=False)
errors = Console(stderr=True, highlight=False)


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def _bytes(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f} MiB"


def result_table(record: dict) -> Table:
    cfg = record["config"]
    title = (f"{cfg['model']} · {cfg['backend']} · {cfg['precision']} · batch {cfg['batch_size']} · "
             f"seq {cfg['sequence_length']} · {cfg['instances']} instance(s)")
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("95 % CI / detail", justify="right")
    metrics = record.get("metrics")
    if record["status"] != "ok" and not metrics:
        table.add_row("status", "[red]failed[/red]", record.get("reason") or "")
        failure, partial = record.get("failure") or {}, record.get("partial") or {}
        tail = (failure.get("stderr_tail") or "").strip().splitlines()[-3:]
        if tail:
            table.add_row("last stderr", "", "\n".join(tail))
        if partial.get("finished_instances"):
            table.add_row("partial data", "kept, invalid", f"instance(s) {partial['finished_instances']} finished")
        return table
    lat = metrics["latency_s"]
    table.add_row("latency mean (ms)", ms(lat["mean"]), f"{ms(lat['mean_ci95_low'])} – {ms(lat['mean_ci95_high'])}")
    table.add_row("latency p50 (ms)", ms(lat["p50"]), f"{ms(lat['p50_ci95_low'])} – {ms(lat['p50_ci95_high'])}")
    table.add_row("latency p90 / p99 (ms)", f"{ms(lat['p90'])} / {ms(lat['p99'])}",
                  f"min {ms(lat['min'])} · max {ms(lat['max'])}")
    table.add_row("latency CV", f"{lat['cv']:.1%}", f"{lat['count']} calls · {lat['outliers']} outliers (MAD)")
    if len(metrics["instances"]) > 1:
        table.add_row("max instance p50 (ms)", ms(metrics["max_instance_p50_s"]), "the study's 'latency = max'")
    table.add_row("throughput (samples/s)", f"{metrics['throughput_samples_per_s']:.2f}",
                  f"{metrics['samples_in_window']} samples in {metrics['window_s']:.2f} s window")
    table.add_row("throughput (tokens/s)", f"{metrics['throughput_tokens_per_s']:.0f}", "")
    peak = metrics.get("sgemm_peak_gflops")
    table.add_row("GFLOP/s", f"{metrics['gflops_per_s']:.1f}",
                  f"{metrics['percent_of_peak']:.0f} % of SGEMM {peak:.0f}" if peak else "")
    table.add_row("peak RSS", _bytes(metrics["peak_rss_bytes"]), "largest instance")
    table.add_row("CPU utilisation", f"{metrics['cpu_utilisation']:.0%}", "CPU time ÷ (wall × threads)")
    load = metrics["instances"][0]
    stages = ", ".join(f"{k} {v:.2f} s" for k, v in load["stage_seconds"].items())
    table.add_row("load (s)", f"{metrics['load_seconds']:.2f}", stages)
    if metrics["contaminated"]:
        table.add_row("[red]contaminated[/red]", f"{metrics['foreign_load']:.0%}",
                      f"foreign load on pinned CPUs of instance(s) {metrics['contaminated_instances']}")
    if record.get("drift"):
        d = record["drift"]
        table.add_row(f"drift vs {d['reference']}", f"{d['max_abs_error']:.2e}",
                      f"cos {d['cosine_similarity']:.6f} · {'ok' if d['within_tolerance'] else 'OVER tolerance'}")
    if record["status"] != "ok":
        table.add_row("status", "[red]failed[/red]", record.get("reason") or "")
    return table


def instances_table(record: dict) -> Table | None:
    metrics = record.get("metrics")
    if not metrics or len(metrics["instances"]) < 2:
        return None
    table = Table(title="per instance", header_style="bold")
    for column in ("id", "cpus", "threads", "p50 ms", "p99 ms", "samples/s", "CPU util", "foreign load"):
        table.add_column(column, justify="right")
    for inst in metrics["instances"]:
        lat = inst["latency_s"]
        table.add_row(str(inst["id"]), ",".join(map(str, inst["cpus"])), str(inst["threads"]), ms(lat["p50"]),
                      ms(lat["p99"]), f"{inst['throughput_samples_per_s']:.2f}", f"{inst['cpu_utilisation']:.0%}",
                      f"{inst['foreign_load']:.0%}")
    return table


def print_result(record: dict, path=None) -> None:
    console.print(result_table(record))
    extra = instances_table(record)
    if extra is not None:
        console.print(extra)
    if record.get("metrics", {}) and record["metrics"].get("contaminated"):
        from corescale.measure.contamination import contamination_message

        errors.print(f"[yellow]warning:[/yellow] {contamination_message(record['metrics'])}")
    if path is not None:
        console.print(f"result: {path}")


class TrialProgress:
    """Live bars for loading/warmup and the timed window, refreshed at most 10 times a second."""

    def __init__(self, cfg, enabled: bool = True):
        self.cfg = cfg
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                                 TimeRemainingColumn(), refresh_per_second=10, transient=True, console=console,
                                 disable=not enabled)
        self.warmup = None
        self.timed = None
        self.started_at = None
        self.done: dict[int, int] = {}

    def __enter__(self):
        self.progress.__enter__()
        self.warmup = self.progress.add_task("load + warm up", total=self.cfg.warmup.max_iterations, info="loading")
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)

    def __call__(self, instance: int, event: dict) -> None:
        kind = event["event"]
        if kind == "warmup":
            self.progress.update(self.warmup, completed=event["done"], info=f"{event['done']} calls")
        elif kind == "ready":
            self.progress.update(self.warmup, info="ready")
        elif kind == "started":
            self.progress.update(self.warmup, completed=self.cfg.warmup.max_iterations, info="stable")
            self.started_at = time.monotonic()
            self.timed = self.progress.add_task("timed window", total=self.cfg.duration, info="")
        elif kind == "progress" and self.timed is not None:
            self.done[instance] = event["done"]
            elapsed = min(time.monotonic() - self.started_at, self.cfg.duration)
            self.progress.update(self.timed, completed=elapsed, info=f"{sum(self.done.values())} calls")
