"""Options of the PyTorch family (`backend=pytorch|torchscript|torch_compile`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from corescale.backends.options import BackendOptions, without_options

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

PyTorchOptions = without_options("pytorch", "PyTorchOptions", __name__)
TorchScriptOptions = without_options("torchscript", "TorchScriptOptions", __name__)


@dataclass
class TorchCompileOptions(BackendOptions):
    name: str = "torch_compile"
    mode: str = "default"  # torch.compile mode
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"mode": COMPILE_MODES}
