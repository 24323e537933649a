"""Options of the PyTorch family (`backend=pytorch|torchscript|torch_compile`).

`backend.linear=onednn` replaces every nn.Linear by one that keeps its weight prepacked in oneDNN's layout and
calls torch's own oneDNN linear (machine/onednn.py): on CPUs where torch's default fp32 GEMM (MKL) runs narrower
kernels than oneDNN (AMD), the model's GEMMs speed up. It composes with eager and TorchScript (the linears are
scripted, then traced with the model), at fp32. torch.compile is refused: inductor cannot lower a prepacked
oneDNN tensor, and does the same prepacking itself with `torch._inductor.config.freezing = True`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from corescale.backends.options import BackendEntry, BackendOptions, CheckedSettings, Profiler
from corescale.errors import UserError
from corescale.workload.tasks import HEADS

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
LINEARS = ("default", "onednn")
ONEDNN_PRECISIONS = ("fp32",)


@dataclass
class PyTorchOptions(BackendOptions):
    name: str = "pytorch"
    linear: str = "default"  # default: torch's nn.Linear (MKL for fp32 on x86); onednn: prepacked oneDNN linear
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"linear": LINEARS}
    PRECISION_BOUND: ClassVar[dict[tuple[str, str], tuple[str, ...]]] = {("linear", "onednn"): ONEDNN_PRECISIONS}

    def check(self, cfg: CheckedSettings) -> None:
        if self.linear != "onednn":
            return
        if cfg.precision not in ONEDNN_PRECISIONS:
            raise UserError(f"backend.linear=onednn supports precision {', '.join(ONEDNN_PRECISIONS)} (got "
                            f"{cfg.precision}); for {cfg.precision} leave backend.linear at default")
        import torch  # only for this option: which torch build is installed decides it

        if not torch.backends.mkldnn.is_available():
            raise UserError(f"backend.linear=onednn needs oneDNN (mkldnn), which this PyTorch build "
                            f"({torch.__version__}) lacks; leave backend.linear at default")


@dataclass
class TorchScriptOptions(PyTorchOptions):
    name: str = "torchscript"


@dataclass
class TorchCompileOptions(BackendOptions):
    name: str = "torch_compile"
    mode: str = "default"  # torch.compile mode
    linear: str = "default"  # only default: see the module's docstring
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"mode": COMPILE_MODES, "linear": LINEARS}
    RENAMED: ClassVar[dict[str, str]] = {"compile_mode": "mode"}
    # inductor's compile time, shortest first: default and reduce-overhead (no CUDA graphs on a CPU) compile once;
    # max-autotune benchmarks GEMM and kernel choices first (minutes for an encoder: docs/results-2026-12-xeon.md)
    BUILD_ORDER: ClassVar[dict[str, tuple[str, ...]]] = {"mode": ("default", "reduce-overhead",
                                                                  "max-autotune-no-cudagraphs", "max-autotune")}
    PRECISION_BOUND: ClassVar[dict[tuple[str, str], tuple[str, ...]]] = {("linear", "onednn"): ONEDNN_PRECISIONS}

    @classmethod
    def tune_values(cls) -> dict[str, list[str]]:
        """The tuner never draws linear=onednn here (check() refuses it)."""
        return {k: v for k, v in super().tune_values().items() if k != "linear"}

    def check(self, cfg: CheckedSettings) -> None:
        if self.linear == "onednn":
            raise UserError("backend.linear=onednn does not compose with torch_compile (inductor cannot lower a "
                            "prepacked oneDNN weight; it prepacks its own with torch._inductor.config.freezing); "
                            "allowed with backend=pytorch or backend=torchscript")


_BACKEND = "corescale.backends.pytorch.backend"
PYTORCH = BackendEntry(
    options=PyTorchOptions, backend=f"{_BACKEND}:EagerBackend", extra=None, requires=("torch",),
    precisions=("fp32", "bf16", "int8"), openmp=True, forkable=True,
    worker_modules=("torch", "transformers", "transformers.models.{model}.modeling_{model}", _BACKEND),
    artifacts=(), profiler=Profiler("torch.profiler", "corescale.backends.pytorch.profiler:TorchProfiler"),
    libraries=("torch", "transformers"), recorded=(), snippet="corescale.backends.pytorch.recipe:snippet",
    onednn_linear=True, heads=HEADS)
TORCHSCRIPT = dataclasses.replace(PYTORCH, options=TorchScriptOptions, backend=f"{_BACKEND}:TorchScriptBackend")
TORCH_COMPILE = dataclasses.replace(PYTORCH, options=TorchCompileOptions, backend=f"{_BACKEND}:CompileBackend")
