"""OpenVINO's per-layer counters: a second compiled model with `PERF_COUNT`; `infer_request.profiling_info`
(executed layers only: a fused layer's time is reported once, on the layer that ran)."""

from __future__ import annotations

import time
from pathlib import Path


class OpenVinoProfiler:
    """OpenVINO's CPU counters are running averages over every call of the compiled model (PERF_COUNT keeps a
    total and a count per layer), so one call's layers are not readable alone: the profiled calls' mean per layer
    is recovered exactly as (mean after all x all - mean after warm-up x warm-up calls) / profiled calls, and
    compared with the mean wall time of those same calls (one aggregate call)."""

    WARM = 3

    def __init__(self, backend, prepared, work_dir: Path):
        import openvino as ov

        from corescale.machine.instance_env import unbind_calling_thread

        unbind_calling_thread()
        config = {**backend.compile_config, "PERF_COUNT": True}
        self.request = ov.Core().compile_model(backend.network, "CPU", config).create_infer_request()
        self.prepared = prepared
        self.walls: list[float] = []
        for _ in range(self.WARM):
            self.request.infer(prepared, share_inputs=True, share_outputs=True)
        self.warm = self.layers()

    def layers(self) -> dict:
        return {p.node_name: (p.node_type, p.exec_type, p.real_time.total_seconds() * 1e6)
                for p in self.request.profiling_info if str(p.status).endswith("EXECUTED")}

    def call(self) -> None:
        start = time.perf_counter_ns()
        self.request.infer(self.prepared, share_inputs=True, share_outputs=True)
        self.walls.append((time.perf_counter_ns() - start) / 1e3)

    def finish(self) -> list[dict]:
        if not self.walls:
            return []
        n, total = len(self.walls), self.WARM + len(self.walls)
        ops = []
        for name, (kind, kernel, mean_all) in self.layers().items():
            before = self.warm.get(name, (kind, kernel, 0.0))[2]
            us = max(0.0, (mean_all * total - before * self.WARM) / n)
            if us > 0:
                ops.append({"op": kind, "name": name, "shapes": None, "us": us, "count": 1, "kernel": kernel})
        return [{"wall_us": sum(self.walls) / n, "ops": ops, "aggregate_of_calls": n}]
