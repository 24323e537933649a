"""PyTorch family: eager (inference_mode), TorchScript (trace + freeze), torch.compile (inductor)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from corescale.backends.base import TimedStages
from corescale.backends.options import options_as
from corescale.backends.pytorch.options import TorchCompileOptions
from corescale.backends.pytorch.task import task_module
from corescale.errors import UserError
from corescale.machine.preload_links import loader_path

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig


def set_torch_threads(threads: int, interop_threads: int) -> None:
    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):  # interop threads can only be set once, before any parallel work
        torch.set_num_interop_threads(interop_threads)


class EagerBackend(TimedStages):
    name = "pytorch"
    scripts_linears = False  # backend.linear=onednn: TorchScript compiles the replaced linears before tracing

    def load(self, spec, cfg: BenchmarkConfig, threads, inputs) -> None:
        set_torch_threads(threads, cfg.interop_threads)
        self.precision = cfg.precision
        with self.stage("build_model"):
            self.module = task_module(spec, cfg, inputs)
        if cfg.precision == "int8":
            with self.stage("quantize"):
                self.module = torch.ao.quantization.quantize_dynamic(self.module, {torch.nn.Linear}, torch.qint8)
        if cfg.precision == "bf16" and not torch.backends.mkldnn.is_available():
            raise UserError("precision=bf16 needs oneDNN (mkldnn), which this PyTorch build lacks")
        self.linear = getattr(cfg.backend, "linear", "default")
        if self.linear == "onednn":
            self.use_onednn_linear(inputs)
        self.optimize(inputs)

    def use_onednn_linear(self, inputs) -> None:
        """backend.linear=onednn: the weights reordered once for the call's rows (batch x sequence)."""
        from corescale.backends.pytorch.onednn_linear import replace_linears

        rows = int(np.prod(next(iter(inputs.values())).shape))
        with self.stage("onednn_prepack"):
            self.onednn_linears = replace_linears(self.module, rows, script=self.scripts_linears)

    def optimize(self, inputs) -> None:
        """Hook for subclasses: turn self.module into the thing forward() calls."""

    def prepare(self, inputs):
        return {name: torch.from_numpy(array) for name, array in inputs.items()}

    def autocast(self):
        if self.precision == "bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def forward(self, prepared):
        with torch.inference_mode(), self.autocast():
            return self.module(**prepared)

    def to_numpy(self, output) -> np.ndarray:
        return output.float().numpy()

    def info(self) -> dict:
        return {
            "framework": "torch",
            "version": torch.__version__,
            "num_threads": torch.get_num_threads(),
            "num_interop_threads": torch.get_num_interop_threads(),
            "parallel_info": torch.__config__.parallel_info(),
            "mkldnn": torch.backends.mkldnn.is_available(),
            "linear": self.linear,
            **({"onednn_linears": self.onednn_linears} if self.linear == "onednn" else {}),
        }


class TorchScriptBackend(EagerBackend):
    name = "torchscript"
    scripts_linears = True

    def optimize(self, inputs) -> None:
        example = self.prepare(inputs)
        self.module.requires_grad_(False)  # else autocast's bf16 weight copies need grad: untraceable constants
        with self.stage("trace"), torch.no_grad(), self.autocast():
            traced = torch.jit.trace(self.module, example_kwarg_inputs=example, strict=False)
            self.module = torch.jit.freeze(traced.eval())

    def forward(self, prepared):
        with torch.no_grad(), self.autocast():  # frozen TorchScript modules run under no_grad
            return self.module(**prepared)


class CompileBackend(EagerBackend):
    name = "torch_compile"

    def load(self, spec, cfg: BenchmarkConfig, threads, inputs) -> None:
        self.mode = options_as(cfg.backend, TorchCompileOptions).mode
        super().load(spec, cfg, threads, inputs)

    def optimize(self, inputs) -> None:
        space_free_torch_lib()
        # torch.compile of a Module returns an OptimizedModule (a Module); its stubs say a bare callable
        self.module = torch.compile(  # type: ignore[assignment]
            self.module, mode=None if self.mode == "default" else self.mode)
        with self.stage("compile"):  # inductor compiles on the first call at these shapes
            self.forward(self.prepare(inputs))


def space_free_torch_lib() -> None:
    """Inductor quotes its -I folders but not its -L ones (torch 2.13, _inductor/cpp_builder.py), so its link fails
    where torch lies under a path with a space: it links through a space-free link of torch's lib folder (the link
    folder this process owns and removes, as for LD_PRELOAD). Inductor reads the module attribute on every build."""
    from torch.utils import cpp_extension

    cpp_extension.TORCH_LIB_PATH = loader_path(Path(cpp_extension.TORCH_LIB_PATH))
