"""The framework's own profiler, one call at a time, in the explain worker (explain/worker.py).

Each backend's registry entry names its profiler (corescale/backends/<framework>/profiler.py), e.g.:
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

from pathlib import Path

from corescale.backends import BACKENDS, Profiler, attribute, entry


def check_profiler(backend: str) -> Profiler:
    """The profiler of a backend, or one line saying there is none corescale reads."""
    from corescale.errors import UserError

    profiler = entry(backend).profiler
    if profiler is None:
        profiled = [name for name in BACKENDS if BACKENDS[name].profiler]
        raise UserError(f"explain cannot profile backend={backend}: it declares no profiler whose per-call op "
                        f"times corescale can add up; profiled backends: {', '.join(profiled)}")
    return profiler


def open_profiler(name: str, backend, prepared, work_dir: Path):
    """The backend's profiler on its loaded model (imports the framework's profiler module)."""
    return attribute(check_profiler(name).factory)(backend, prepared, work_dir)
