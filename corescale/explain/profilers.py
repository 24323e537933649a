"""The framework's own profiler, one call at a time, in the explain worker (explain/worker.py).

- PyTorch family: torch.profiler around each call; every op's exclusive (self) CPU time, with input shapes.
- ONNX Runtime: a second session on the same model and options with `SessionOptions.enable_profiling`; its
  trace's per-node kernel times, assigned to the call (`model_run`) they fall in.
- OpenVINO: a second compiled model with `PERF_COUNT`; `infer_request.profiling_info` (executed layers only: a
  fused layer's time is reported once, on the layer that ran). Its counters are running means over the model's
  calls: the profiled calls' mean per layer is recovered from them, against those calls' mean wall time.
The measured (unprofiled) calls run on the backend exactly as a benchmark runs it; profiled calls never mix into
them. Importing this module imports no framework.
"""

from __future__ import annotations

import time
from pathlib import Path

PROFILERS = {"pytorch": "torch.profiler", "torchscript": "torch.profiler", "torch_compile": "torch.profiler",
             "onnxruntime": "ONNX Runtime profiling (SessionOptions.enable_profiling)",
             "openvino": "OpenVINO per-layer performance counters (PERF_COUNT)"}


def check_profiler(backend: str) -> str:
    """The profiler of a backend, or one line saying there is none corescale reads."""
    from corescale.errors import UserError

    if backend not in PROFILERS:
        raise UserError(f"explain cannot profile backend={backend}: TensorFlow's profiler writes TensorBoard traces "
                        "without per-call op times corescale can add up; profiled backends: "
                        f"{', '.join(PROFILERS)}")
    return PROFILERS[backend]


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


def open_profiler(name: str, backend, prepared, work_dir: Path):
    if name == "onnxruntime":
        return OnnxRuntimeProfiler(backend, prepared, work_dir)
    if name == "openvino":
        return OpenVinoProfiler(backend, prepared, work_dir)
    return TorchProfiler(backend, prepared, work_dir)
