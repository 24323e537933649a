"""What a process imports before it does its work (issue 31's cold start): a CLI call registers only its own command,
so `corescale serve` does not import the config's stack, the record's statistics or pandas to parse its line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def imported_after(code: str) -> list[str]:
    """The modules a fresh interpreter holds after running `code` (from this checkout)."""
    script = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.slow  # a fresh interpreter (~0.1 s)
def test_a_command_registers_alone():
    found = imported_after("from corescale.cli import parse; parse(['serve', 'BUNDLE'])")
    assert [m for m in found if m.startswith("corescale.commands.")] == ["corescale.commands.serve"]
    assert not {"numpy", "omegaconf", "pandas", "fastapi", "corescale.config"} & set(found)


def test_the_tour_and_an_unknown_command_still_list_every_command():
    from corescale.cli import build_parser, tour

    assert "corescale serve" in tour(build_parser()) and "corescale study" in tour(build_parser())
    assert "corescale run" in tour(build_parser("no-such-command"))


class Counting:
    """A backend that records the shape of every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def prepare(self, inputs):
        return inputs["input_ids"].shape

    def forward(self, shape):
        self.calls.append(shape)


def test_a_served_instance_warms_every_shape_twice_and_no_more():
    from corescale.config import BenchmarkConfig
    from corescale.measure.warm_calls import warm_shapes
    from corescale.workload.models import resolve_model

    cfg = BenchmarkConfig(model="bert-tiny", sequence_length=32)
    backend = Counting()
    single_ns, at_max = warm_shapes(backend, resolve_model("bert-tiny"), cfg, 3, single_calls=2)
    assert backend.calls == [(1, 32)] * 2 + [(2, 32)] * 2 + [(3, 32)] * 2
    assert len(at_max) == 2 and single_ns is not None  # the deadline's unit: the calls at the max batch
    once = Counting()
    _, at_max = warm_shapes(once, resolve_model("bert-tiny"), cfg, 3, 1, 1)  # a backend warm after one call
    assert once.calls == [(1, 32), (2, 32), (3, 32)] and len(at_max) == 1
    measured = Counting()
    warm_shapes(measured, resolve_model("bert-tiny"), cfg, 3)  # measurement's: one query four times
    assert measured.calls.count((1, 32)) == 4
