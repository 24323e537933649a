"""Raw per-instance samples -> one set of run metrics (common window throughput, pooled latency)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from corescale.machine.placement import InstanceSpec
from corescale.measure.contamination import CONTAMINATION_THRESHOLD, foreign_fraction
from corescale.record.stats import Measurement, in_window, window_throughput
from corescale.record.trial import InstanceMetrics, RunMetrics

if TYPE_CHECKING:  # pandas (~0.4 s) is imported where a frame is made: `corescale plan` and serve never need it
    import pandas as pd


@dataclass
class InstanceSamples:
    id: int
    cpus: list[int]
    threads: int
    batch_size: int
    starts_ns: np.ndarray
    ends_ns: np.ndarray
    warmup_ns: np.ndarray
    report: dict  # what the worker sent with its result
    peak: dict | None = None  # the GEMM peak on its CPUs (InstanceSpec.peak)

    @classmethod
    def load(cls, spec: InstanceSpec, report: dict) -> InstanceSamples:
        with np.load(spec.samples_path) as data:
            return cls(spec.id, list(spec.cpus), spec.threads, spec.batch_size,
                       data["starts_ns"], data["ends_ns"], data["warmup_ns"], report, spec.peak)

    def window_latencies_ns(self, window: tuple[int, int]) -> np.ndarray:
        """Durations of the calls inside the window (every call if none is: a window shorter than one call)."""
        inside = in_window(self.starts_ns, self.ends_ns, *window)
        durations = self.ends_ns - self.starts_ns
        return durations[inside] if inside.any() else durations


def common_window(instances: list[InstanceSamples], start_ns: int) -> tuple[int, int]:
    """From the common start to the earliest last completion: every instance is busy throughout."""
    return start_ns, int(min(inst.ends_ns[-1] for inst in instances))


def samples_frame(instances: list[InstanceSamples], window: tuple[int, int]) -> pd.DataFrame:
    """Every warmup and timed call of every instance, one row each (the Parquet file)."""
    import pandas as pd

    frames = []
    for inst in instances:
        durations = inst.ends_ns - inst.starts_ns
        frames.append(pd.DataFrame({
            "instance": inst.id, "phase": "timed", "iteration": np.arange(len(durations)),
            "start_ns": inst.starts_ns, "end_ns": inst.ends_ns, "latency_ms": durations / 1e6,
            "in_window": in_window(inst.starts_ns, inst.ends_ns, *window),
        }))
        frames.append(pd.DataFrame({
            "instance": inst.id, "phase": "warmup", "iteration": np.arange(len(inst.warmup_ns)),
            "start_ns": pd.array([None] * len(inst.warmup_ns), dtype="Int64"),
            "end_ns": pd.array([None] * len(inst.warmup_ns), dtype="Int64"),
            "latency_ms": inst.warmup_ns / 1e6, "in_window": False,
        }))
    return pd.concat(frames, ignore_index=True)


def instance_metrics(inst: InstanceSamples, window: tuple[int, int], sequence_length: float) -> InstanceMetrics:
    """One instance's figures; `start_skew_ms` is how late its first timed call began after the common start.
    Latency is taken from the calls inside the common window (when siblings ran too); throughput credits the
    calls straddling its edges by the fraction inside."""
    latency = Measurement.from_ns(inst.window_latencies_ns(window))
    samples, rate = window_throughput(inst.starts_ns, inst.ends_ns, *window, inst.batch_size)
    wall = inst.report["wall_seconds"]
    foreign = inst.report.get("foreign_load")
    if foreign is None:  # a worker that reports only seconds: spread over its CPUs
        foreign = foreign_fraction(inst.report["foreign_cpu_seconds"], wall, len(inst.cpus))
    tokens = inst.report.get("real_tokens_per_sample") or sequence_length
    return InstanceMetrics(
        id=inst.id,
        cpus=list(inst.cpus),
        threads=inst.threads,
        batch_size=inst.batch_size,
        start_skew_ms=(int(inst.starts_ns[0]) - window[0]) / 1e6,
        latency_s=latency.summary(),
        samples_in_window=samples,
        throughput_samples_per_s=rate,
        throughput_tokens_per_s=rate * tokens,
        cpu_utilisation=inst.report["cpu_seconds"] / (wall * inst.threads) if wall > 0 else 0.0,
        foreign_load=foreign,
        contaminated=foreign > CONTAMINATION_THRESHOLD,
        peak_rss_bytes=inst.report["peak_rss_bytes"],
        peak_gflops=(inst.peak or {}).get("gflops"),
        load_seconds=inst.report["load_seconds"],
        stage_seconds=inst.report["stage_seconds"],
        warmup_iterations=inst.report["warmup_iterations"],
        warmup_converged=inst.report["warmup_converged"],
        peak_library=(inst.peak or {}).get("library"),
        calls_outside_window=int((~in_window(inst.starts_ns, inst.ends_ns, *window)).sum()),
        rss_bytes=inst.report.get("rss_bytes"),
    )


def run_metrics(instances: list[InstanceSamples], start_ns: int, sequence_length: float,
                flops_per_sample: float | None) -> RunMetrics:
    """flops_per_sample None: the model's sizes are unknown (a model file without config.json), so are GFLOP/s."""
    window = common_window(instances, start_ns)
    per_instance = [instance_metrics(inst, window, sequence_length) for inst in instances]
    pooled = Measurement.from_ns(np.concatenate([inst.window_latencies_ns(window) for inst in instances]))
    length_s = (window[1] - window[0]) / 1e9
    samples = sum(m.samples_in_window for m in per_instance)
    throughput = samples / length_s if length_s > 0 else 0.0
    gflops = throughput * flops_per_sample / 1e9 if flops_per_sample is not None else None
    peak, percent, problem = percent_of_peak(gflops, [inst.peak for inst in instances]) if gflops is not None else \
        (None, None, "the model's FLOPs are unknown (a model file without config.json)")
    contaminated = [m.id for m in per_instance if m.contaminated]
    tokens = sum(m.throughput_tokens_per_s for m in per_instance)
    return RunMetrics(
        window_s=length_s,
        window_start_ns=window[0],
        window_end_ns=window[1],
        max_start_skew_ms=max(m.start_skew_ms for m in per_instance),
        samples_in_window=samples,
        throughput_samples_per_s=throughput,
        throughput_tokens_per_s=tokens,
        latency_s=pooled.summary(),
        max_instance_p50_s=max(m.latency_s.p50 for m in per_instance),
        gflops_per_s=gflops,
        peak_gflops=peak,
        percent_of_peak=percent,
        flops_per_sample=flops_per_sample,
        peak_rss_bytes=max(m.peak_rss_bytes for m in per_instance),
        cpu_utilisation=float(np.mean([m.cpu_utilisation for m in per_instance])),
        foreign_load=max(m.foreign_load for m in per_instance),
        contaminated=bool(contaminated),
        contaminated_instances=contaminated,
        load_seconds=max(m.load_seconds for m in per_instance),
        per_instance=per_instance,
        peak_library="+".join(sorted({m.peak_library for m in per_instance if m.peak_library})) or None,
        peak_precision=next((p.get("precision") for p in (inst.peak for inst in instances) if p), None),
        peak_problem=problem,
        calls_outside_window=sum(m.calls_outside_window for m in per_instance),
        padded_tokens_per_s=throughput * sequence_length,
        warmup_converged=all(m.warmup_converged for m in per_instance),
    )


PEAK_SLACK = 1.02  # a rate this close above the peak is timing noise of the calibration, reported as 100 %


def percent_of_peak(gflops: float, peaks: list[dict | None]) -> tuple[float | None, float | None, str | None]:
    """(peak GFLOP/s, % of it, problem): never above 100 % — a rate above the best measured GEMM means the
    yardstick or the FLOP count is wrong, and is flagged as that instead of printed as a result."""
    rates = [(p or {}).get("gflops") for p in peaks]
    if not rates or any(r is None for r in rates):
        return None, None, None
    peak = float(sum(float(r) for r in rates if r is not None))
    percent = 100 * gflops / peak
    if percent > 100 * PEAK_SLACK:
        return peak, None, (f"{gflops:.1f} GFLOP/s exceeds the measured GEMM peak {peak:.1f} GFLOP/s: the peak "
                            "or the model's FLOP count is off (corescale info --peak measures it again)")
    return peak, min(percent, 100.0), None
