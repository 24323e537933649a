"""torch.profiler around each call: every op's exclusive (self) CPU time, with input shapes (explain/worker.py
builds it through the registry entry's Profiler)."""

from __future__ import annotations

import time
from pathlib import Path


class TorchProfiler:
    def __init__(self, backend, prepared, work_dir: Path):
        self.backend, self.prepared = backend, prepared
        self.calls: list[dict] = []

    def call(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            start = time.perf_counter_ns()
            self.backend.forward(self.prepared)
            wall = time.perf_counter_ns() - start
        ops = [{"op": e.key, "name": e.key, "shapes": [list(s) for s in e.input_shapes], "us": e.self_cpu_time_total,
                "count": e.count} for e in prof.key_averages(group_by_input_shape=True) if e.self_cpu_time_total > 0]
        self.calls.append({"wall_us": wall / 1e3, "ops": ops})

    def finish(self) -> list[dict]:
        return self.calls
