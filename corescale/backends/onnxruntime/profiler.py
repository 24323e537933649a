"""ONNX Runtime's profiler: a second session on the same model and options with `SessionOptions.enable_profiling`;
its trace's per-node kernel times, assigned to the call (`model_run`) they fall in."""

from __future__ import annotations

import time
from pathlib import Path


class OnnxRuntimeProfiler:
    WARM = 3  # the profiling session's own first runs (allocation, kernel selection) are left out

    def __init__(self, backend, prepared, work_dir: Path):
        import onnxruntime as ort

        from corescale.machine.instance_env import unbind_calling_thread

        source = backend.options
        options = ort.SessionOptions()
        for field in ("graph_optimization_level", "execution_mode", "intra_op_num_threads", "inter_op_num_threads"):
            setattr(options, field, getattr(source, field))
        options.enable_profiling = True
        options.profile_file_prefix = str(work_dir / "ort-profile")
        unbind_calling_thread()
        self.session = ort.InferenceSession(str(backend.model_path), options, providers=["CPUExecutionProvider"])
        self.prepared = prepared
        self.walls: list[float] = []
        for _ in range(self.WARM):
            self.session.run(None, prepared)

    def call(self) -> None:
        start = time.perf_counter_ns()
        self.session.run(None, self.prepared)
        self.walls.append((time.perf_counter_ns() - start) / 1e3)

    def finish(self) -> list[dict]:
        import json

        events = json.loads(Path(self.session.end_profiling()).read_text())
        runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"][self.WARM:]
        nodes = [e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")]
        calls = []
        for wall, run in zip(self.walls, runs):
            inside = [n for n in nodes if run["ts"] <= n["ts"] <= run["ts"] + run["dur"]]
            ops = [{"op": n["args"].get("op_name", ""), "name": n["name"].removesuffix("_kernel_time"),
                    "shapes": [next(iter(s.values())) for s in n["args"].get("input_type_shape", [])],
                    "us": float(n["dur"]), "count": 1} for n in inside]
            calls.append({"wall_us": wall, "ops": ops, "framework_run_us": float(run["dur"])})
        return calls
