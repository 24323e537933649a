"""Options of `backend=openvino`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from corescale.backends.options import BackendOptions

PERFORMANCE_HINTS = ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT")


@dataclass
class OpenVinoOptions(BackendOptions):
    name: str = "openvino"
    performance_hint: str = "LATENCY"
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"performance_hint": PERFORMANCE_HINTS}
