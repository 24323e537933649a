"""Everything the user sees on the terminal: result tables and the live progress display."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.table import Table

from corescale.record.repeats import SPREAD
from corescale.record.stats import ms
from corescale.record.trial import TrialRecord
from corescale.report.loadgen_rows import quality_row, server_table

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig

console = Console(stderr=False, highlight=False)
errors = Console(stderr=True, highlight=False)


def print_wide(renderable) -> None:
    """Tables printed to a pipe or file are not wrapped at 80 columns."""
    (console if console.is_terminal else Console(highlight=False, width=220)).print(renderable)


def ms_text(seconds: float | None) -> str:
    return "-" if seconds is None else f"{ms(seconds):.2f}"


def _bytes(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f} MiB"


def result_table(record: TrialRecord) -> Table:
    cfg = record.config
    batch = f"batch {cfg.batch_size}" if cfg.scenario == "offline" else f"{cfg.scenario}"
    title = escape(f"{cfg.model} · {cfg.backend.name} · {cfg.precision} · {batch} · "
                   f"seq {cfg.sequence_length} · {cfg.instances} instance(s)")
    if cfg.endpoint:
        title = escape(f"{cfg.endpoint} · api {cfg.http_api} · {cfg.scenario}")
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("95 % CI / detail", justify="right")
    metrics = record.metrics
    if record.server is not None and (record.ok or record.valid):
        return server_table(table, record)
    if metrics is None:
        table.add_row("status", "[red]failed[/red]", escape(record.reason or ""))
        tail = (record.failure.stderr_tail if record.failure else "").strip().splitlines()[-3:]
        if tail:
            table.add_row("last stderr", "", escape("\n".join(tail)))
        if record.partial and record.partial.finished_instances:
            table.add_row("partial data", "kept, invalid", f"instance(s) {record.partial.finished_instances} finished")
        return table
    lat = metrics.latency_s
    table.add_row("latency mean (ms)", ms_text(lat.mean),
                  f"{ms_text(lat.mean_ci95_low)} – {ms_text(lat.mean_ci95_high)}")
    table.add_row("latency p50 (ms)", ms_text(lat.p50), f"{ms_text(lat.p50_ci95_low)} – {ms_text(lat.p50_ci95_high)}")
    table.add_row("latency p90 / p99 (ms)", f"{ms_text(lat.p90)} / {ms_text(lat.p99)}",
                  f"min {ms_text(lat.min)} · max {ms_text(lat.max)}")
    table.add_row("latency CV", f"{lat.cv:.1%}", f"{lat.count} calls · {lat.outliers} outliers (MAD)")
    if len(metrics.per_instance) > 1:
        table.add_row("max instance p50 (ms)", ms_text(metrics.max_instance_p50_s), "the study's 'latency = max'")
    table.add_row("throughput (samples/s)", f"{metrics.throughput_samples_per_s:.2f}",
                  f"{metrics.samples_in_window} samples in {metrics.window_s:.2f} s window")
    table.add_row("throughput (tokens/s)", f"{metrics.throughput_tokens_per_s:.0f}", "")
    table.add_row(*cost_cells(record))
    if metrics.gflops_per_s is None:
        table.add_row("GFLOP/s", "unknown", metrics.peak_problem or "the model's FLOPs are unknown")
    else:
        table.add_row("GFLOP/s", f"{metrics.gflops_per_s:.1f}", peak_text(metrics))
    if metrics.roofline:
        roof = metrics.roofline
        table.add_row("roofline", f"{roof.fraction_of_attainable:.0%}",
                      f"of attainable {roof.attainable_gflops:.0f} GFLOP/s ({roof.bound} bound: intensity "
                      f"{roof.intensity_flops_per_byte:.0f} FLOP/B, memory {roof.bandwidth_gbps:.1f} GB/s)")
    table.add_row("peak RSS", _bytes(metrics.peak_rss_bytes), "largest instance")
    table.add_row("CPU utilisation", f"{metrics.cpu_utilisation:.0%}", "CPU time ÷ (wall × threads)")
    stages = ", ".join(f"{k} {v:.2f} s" for k, v in metrics.per_instance[0].stage_seconds.items())
    table.add_row("load (s)", f"{metrics.load_seconds:.2f}", stages)
    if metrics.contaminated:
        table.add_row("[red]contaminated[/red]", f"{metrics.foreign_load:.0%}",
                      f"foreign load on pinned CPUs of instance(s) {metrics.contaminated_instances}")
    if not metrics.warmup_converged:
        table.add_row("[yellow]warm-up[/yellow]", "not stable", "an instance's latency still moved at the end "
                      "of warm-up (raise warmup.max_iterations)")
    if metrics.calls_outside_window:
        table.add_row("calls outside window", str(metrics.calls_outside_window),
                      "straddling its edges: throughput credits their share, latency leaves them out")
    if record.drift:
        d = record.drift
        table.add_row(f"drift vs {d.reference}", f"{d.max_abs_error:.2e}",
                      f"cos {d.cosine_similarity:.6f} · {'ok' if d.within_tolerance else 'OVER tolerance'}")
    quality_row(table, record)
    if not record.ok:
        table.add_row("status", "[red]failed[/red]", escape(record.reason or ""))
    return table


def cost_cells(record: TrialRecord) -> tuple[str, str, str]:
    """The US$ per 1M inferences, per 1M real tokens and the price's source (analysis/pricing.py)."""
    from corescale.analysis.pricing import record_cost

    inferences, tokens, source = record_cost(record)
    if inferences is None:
        return "US$ per 1M inferences", "-", "no throughput to price"
    per_token = f"US$ {tokens:.4g} per 1M tokens" if tokens else "tokens per sample not recorded"
    return "US$ per 1M inferences", f"{inferences:.4g}", escape(f"{per_token} · {source}")


def peak_text(metrics) -> str:
    """'% of the machine's GEMM peak (which library set it)', or why there is none."""
    if metrics.peak_problem:
        return f"[red]{escape(metrics.peak_problem)}[/red]"
    if metrics.percent_of_peak is None or not metrics.peak_gflops:
        return "peak not measured (calibrate=false)"
    precision = f" {metrics.peak_precision}" if metrics.peak_precision else ""
    return (f"{metrics.percent_of_peak:.0f} % of the{precision} GEMM peak {metrics.peak_gflops:.0f} "
            f"({metrics.peak_library})")


def instances_table(record: TrialRecord) -> Table | None:
    metrics = record.metrics
    if not metrics or len(metrics.per_instance) < 2:
        return None
    table = Table(title="per instance", header_style="bold")
    for column in ("id", "cpus", "threads", "p50 ms", "p99 ms", "samples/s", "CPU util", "foreign load"):
        table.add_column(column, justify="right")
    for inst in metrics.per_instance:
        lat = inst.latency_s
        table.add_row(str(inst.id), ",".join(map(str, inst.cpus)), str(inst.threads), ms_text(lat.p50),
                      ms_text(lat.p99), f"{inst.throughput_samples_per_s:.2f}", f"{inst.cpu_utilisation:.0%}",
                      f"{inst.foreign_load:.0%}")
    return table


def shared_host_lines(record: TrialRecord) -> list[str]:
    """What the host took that the contamination check cannot see: steal above its threshold, a sentinel that
    moved (measure/sentinel.py)."""
    from corescale.record.sections import STEAL_THRESHOLD

    found = record.contamination
    if found is None:
        return []
    lines = []
    if found.stolen:
        worst = max(found.steal_by_cpu.items(), key=lambda kv: kv[1], default=("?", 0.0))
        lines.append(f"the hypervisor stole {found.steal_fraction:.1%} of the measured CPUs' window (CPU {worst[0]}: "
                     f"{worst[1]:.1%}; threshold {STEAL_THRESHOLD:.0%}): another guest ran on this host")
    if found.sentinel_moved:
        span = found.sentinel_range or (1.0, 1.0)
        last = found.sentinel[-1]
        parts = f" (GEMM {last.compute_ratio:.2f}x, triad {last.memory_ratio:.2f}x)" \
            if last.compute_ratio is not None and last.memory_ratio is not None else ""
        memory = "" if found.sentinel_memory_tolerance is None else \
            f", triad {found.sentinel_memory_tolerance:.0%} slower"
        lines.append(f"speed sentinel moved: {', '.join(f'{r.phase} {r.ratio:.2f}x' for r in found.sentinel)} its "
                     f"reference{parts} (range {span[0]:.2f}-{span[1]:.2f}x, tolerance "
                     f"GEMM {found.sentinel_tolerance or 0:.0%} slower{memory}): the CPUs got slower around this trial")
    return lines


def print_result(record: TrialRecord, path=None) -> None:
    console.print(result_table(record))
    extra = instances_table(record)
    if extra is not None:
        console.print(extra)
    if record.metrics and record.metrics.contaminated:
        from corescale.measure.contamination import contamination_message

        errors.print(f"[yellow]warning:[/yellow] {escape(contamination_message(record.metrics))}")
    for line in shared_host_lines(record):
        errors.print(f"[yellow]warning:[/yellow] {escape(line)}")
    if record.metrics and not record.metrics.warmup_converged:
        errors.print("[yellow]warning:[/yellow] warm-up did not reach a stable latency in every instance")
    if path is not None:
        print_path("result", path)


def print_path(label: str, path) -> None:
    """Machine-readable lines are printed plain: never wrapped at the terminal width, never read as markup."""
    print(f"{label}: {path}", flush=True)


def print_note(text: str, lead: str = "", style: str = "yellow", stream: Console | None = None) -> None:
    """One line (stderr unless `stream`), never wrapped, its text never read as markup (a reason or a path may
    hold brackets): all of it in `style`, or only its `lead` ('skipped:', 'warning:')."""
    coloured = f"[{style}]{escape(lead or text)}[/{style}]"
    (stream or errors).print(f"{coloured} {escape(text)}" if lead else coloured, soft_wrap=True)


class TrialProgress:
    """Live bars (on stderr) for loading/warm-up and the timed window. No refresh thread: the display is redrawn
    only when an instance reports, at most twice a second, so the parent takes next to no CPU from the instances
    it is measuring (on a small machine it shares their cores)."""

    REDRAW_S = 0.5

    def __init__(self, cfg: BenchmarkConfig, enabled: bool = True):
        self.cfg = cfg
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                                 TimeRemainingColumn(), auto_refresh=False, transient=True, console=errors,
                                 disable=not enabled)
        self.drawn = 0.0
        self.warmup: TaskID | None = None  # added on entering
        self.timed: TaskID | None = None
        self.started_at = 0.0
        self.done: dict[int, int] = {}

    def __enter__(self):
        self.progress.__enter__()
        self.warmup = self.progress.add_task("load + warm up", total=self.cfg.warmup.max_iterations, info="loading")
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)

    def __call__(self, instance: int, event: dict) -> None:
        kind = event["event"]
        if self.warmup is None:
            return  # not entered: nothing is drawn
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
        if time.monotonic() - self.drawn >= self.REDRAW_S or kind in ("ready", "started"):
            self.progress.refresh()
            self.drawn = time.monotonic()


class SweepProgress(TrialProgress):
    """The trial's bars plus one over the whole loop."""

    def __init__(self, cfg: BenchmarkConfig, enabled: bool, done: int, total: int, eta: str):
        super().__init__(cfg, enabled)
        self.sweep = (done, total, eta)

    def __enter__(self):
        super().__enter__()
        done, total, eta = self.sweep
        self.progress.add_task(f"trials {done}/{total}", total=total, completed=done, info=eta)
        return self


def eta_text(state, remaining: int) -> str:
    seconds = state.eta_seconds(remaining)
    return "ETA after first trial" if seconds is None else f"ETA {time.strftime('%H:%M:%S', time.gmtime(seconds))}"


def brief(record: TrialRecord) -> str:
    """One line: the headline figures of an ok trial, or why it failed."""
    m = record.metrics
    if record.ok and record.server is not None:
        s = record.server
        if s.target_qps == "auto":
            if s.unestablished:
                return f"max valid QPS {s.unestablished}"
            bounded = f" (search bounded after {len(s.steps)} LoadGen test(s): best so far)" if s.bounded else ""
            return f"max valid QPS {s.max_valid_qps or 0:.4g} at p99 <= {s.slo_p99_ms:g} ms{bounded}"
        return f"LoadGen {s.validity}, p99 {s.latency_ms.get('p99', float('nan')):.2f} ms"
    if not record.ok or m is None:
        return f"failed: {record.reason}"
    flag = " (contaminated)" if m.contaminated else ""
    return (f"p50 {m.latency_s.p50 * 1e3:.2f} ms, p99 {m.latency_s.p99 * 1e3:.2f} ms, "
            f"{m.throughput_samples_per_s:.2f} samples/s{flag}")


class ConsoleListener:
    """Draws a trial loop (trials/local.py's Listener): a heading per trial, live bars while it runs, then the
    full result table (one trial, or with live progress) or one line. Use as a context manager: bars left
    open by an error are closed on the way out."""

    def __init__(self, what: str = "trial", progress: bool = True, tables: bool = True, extra=None):
        self.what = what  # "trial", "cores study", ...
        self.progress = progress
        self.tables = tables  # the full result table after each trial (else one line)
        self.extra = extra  # extra(instance, event) also sees every worker event (benchmarks time stages)
        self.bars: TrialProgress | None = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._close(*exc)

    def _close(self, *exc) -> None:
        if self.bars is not None:
            self.bars.__exit__(*(exc or (None, None, None)))
            self.bars = None

    def _where(self, item, state) -> tuple[int, str]:
        """(the loop position, the trial's label with its repeat when it has several)."""
        repeats = item.trial.cfg.repeats
        label = item.label + (f" [repeat {state.repeat + 1}/{repeats}]" if repeats > 1 else "")
        return state.position or item.number, label

    def skipped(self, item, existing, state) -> None:
        self._close()  # skipped after it started: another process measured it while this one waited
        number, label = self._where(item, state)
        console.print(escape(f"{self.what} {number}/{state.total} skipped (valid result exists: {existing}): "
                             f"{label}"), soft_wrap=True)

    def starting(self, item, state) -> None:
        self._close()  # a Ray loop starts several trials at once: the bars follow the latest
        number, label = self._where(item, state)
        eta = eta_text(state, state.total - number + 1)
        if state.total > 1:
            console.print(f"[bold]{escape(self.what)} {number}/{state.total}[/bold] ({eta}): {escape(label)}",
                          soft_wrap=True)
        bars = SweepProgress(item.trial.cfg, self.progress, number - 1, state.total, eta) if state.total > 1 \
            else TrialProgress(item.trial.cfg, self.progress)
        self.bars = bars.__enter__()

    def worker_event(self, item, instance, event) -> None:
        if self.bars is not None:
            self.bars(instance, event)
        if self.extra is not None:
            self.extra(item, instance, event)

    def rerunning(self, item, outcome, state) -> None:
        number, label = self._where(item, state)
        errors.print(escape(f"{self.what} {number}/{state.total} ({label}): the speed sentinel moved around it; "
                            "measuring it once more (the new result counts)"))

    def slow_host(self, item, state) -> None:
        errors.print(escape(f"{self.what} ({self._where(item, state)[1]}): its re-run's sentinel moved too; the host "
                            "stays slow, so later trials whose sentinel moves are flagged, not re-run"))

    def finished(self, item, outcome, state) -> None:
        self._close()
        record = outcome.record
        where = f" on {record.node.get('hostname', '?')}" if record.node and record.node.get("hostname") else ""
        if self.tables:
            print_result(record, outcome.path)
        else:
            if outcome.ok:  # a failure's line is the one below, on stderr: said once
                console.print(escape(f"  {self.what} {self._where(item, state)[0]}/{state.total}{where}: "
                                     f"{brief(record)}"),
                              soft_wrap=True)
            print_path("  result", outcome.path)
        if not outcome.ok:
            errors.print(f"[red]{escape(self.what)} {self._where(item, state)[0]}/{state.total}{escape(where)} "
                         "failed:[/red] "
                         f"{escape(str(record.reason))}",
                         soft_wrap=True)


def loop_table(state, title: str = "sweep") -> Table:
    """Every trial of a loop: number, label, status, headline figures or where the result already was."""
    table = Table(title=title, header_style="bold")
    for column in ("#", "trial", "status", "result"):
        table.add_column(column)
    for row in state.rows:
        colour = {"ok": "green", "failed": "red"}.get(row.status, "dim")
        detail = brief(row.record) if row.record else str(row.path)
        label = row.item.label + (f" [repeat {row.repeat + 1}]" if row.item.trial.cfg.repeats > 1 else "")
        table.add_row(str(row.item.number), escape(label), f"[{colour}]{row.status}[/{colour}]",
                      escape(detail))
    return table


def loop_summary(state) -> str:
    not_run = state.total - len(state.rows)
    return (f"{state.total} trials: {state.count('ok')} measured ok, {state.count('failed')} failed, "
            f"{state.count('skipped')} skipped (already done)" + (f", {not_run} not run" if not_run else ""))


STUDY_COLUMNS = {  # what the printed study table shows, per study: (column, header, format)
    "cores": [("cores", "cores", "{:.0f}"), ("latency_p50_ms", "p50 ms", "{:.2f}"),
              ("latency_p99_ms", "p99 ms", "{:.2f}"), ("speedup", "speedup", "{:.2f}x"),
              ("efficiency", "efficiency", "{:.0%}")],
    "instances": [("instances", "instances", "{:.0f}"), ("cores_per_instance", "cores each", "{:.0f}"),
                  ("throughput_samples_per_s", "samples/s", "{:.2f}"),
                  ("ideal_throughput_samples_per_s", "ideal samples/s", "{:.2f}"),
                  ("efficiency", "efficiency", "{:.0%}"), ("max_instance_p50_ms", "max p50 ms", "{:.2f}")],
    "batch": [("instances", "instances", "{:.0f}"), ("cores_per_instance", "cores each", "{:.0f}"),
              ("batch_size", "batch each", "{:.0f}"), ("max_instance_p50_ms", "max p50 ms", "{:.2f}"),
              ("throughput_samples_per_s", "samples/s", "{:.2f}"), ("throughput_gain", "gain", "{:.2f}x")],
}


def study_table(kind: str, frame) -> Table:
    import pandas as pd

    table = Table(title=f"{kind} study", header_style="bold")
    columns = [c for c in STUDY_COLUMNS[kind] if c[0] in frame]
    show_group = frame["group"].astype(bool).any()
    if show_group:
        table.add_column("group")
    for _, header, _ in columns:
        table.add_column(header, justify="right")
    table.add_column("status")
    for _, row in frame.iterrows():
        cells = [fmt.format(row[col]) if pd.notna(row[col]) else "-" for col, _, fmt in columns]
        status = "contaminated" if row["status"] == "ok" and row["contaminated"] else row["status"]
        table.add_row(*([escape(row["group"])] if show_group else []), *cells, status)
    return table


def print_repeats(state, planned) -> None:
    """Per trial, the headline figures with their interval across repeats (the unit of uncertainty)."""
    from corescale.record.repeats import across_repeats

    summaries = [across_repeats(state.records_of(item)) for item in planned]
    units = sorted({s.unit for s in summaries if s.unit}) or ["samples/s"]
    table = Table(title="across repeats (fresh processes each; 95 % Student-t intervals where usable, else the "
                        "repeats, a p50 with its within-run interval)", header_style="bold")
    for column in ("#", "trial", "repeats", " · ".join(units), SPREAD, "p50 ms", SPREAD, "p99 ms"):
        table.add_column(column, justify="left" if column == "trial" else "right")
    for item, summary in zip(planned, summaries):
        notes = "".join(f" ({n} {what})" for n, what in ((summary.failed, "failed"), (summary.unmet, "met no rate"))
                        if n)
        label = item.label if len(planned) > 1 else "this configuration"
        tput, p50 = summary.throughput, summary.p50_ms
        table.add_row(str(item.number), escape(label), f"{summary.repeats}{notes}", f"{tput.mean:.2f}",
                      escape(tput.bounds()), f"{p50.mean:.2f}", escape(p50.bounds()), f"{summary.p99_ms.mean:.2f}")
    print_wide(table)
    console.print("the intervals in each run's own table are over that run's calls; these are over repeats",
                  soft_wrap=True)
