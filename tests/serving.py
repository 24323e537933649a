"""What the serve tests share: the trained all-MiniLM-L6-v2 folder, a measured bundle of it, and a real
`corescale serve` on loopback (a free port, read from its ready line).

A test that only calls a service's routes takes conftest's session fixture `tiny_service` (one bert-tiny service
per task, started on first use: `tiny_service("rerank").url`) instead of starting its own: each start costs a
measured bundle and a worker's imports (seconds on 2 cores, paid by every `make test`). A test that stops, signals,
overloads or restarts a service, or reads counters that must start at zero, starts its own `Service` (from
conftest's session `tiny_bundle(task)` when a bert-tiny bundle will do: one measurement per task for the whole
session; a test that changes a bundle copies it first)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

from helpers import ROOT, corescale

from corescale.measure.http.contract import url_in
from corescale.measure.http.managed import wait_ready


def minilm_folder() -> Path:
    """sentence-transformers/all-MiniLM-L6-v2 (trained weights, tokenizer, pooling) from its registry package."""
    from corescale.workload.models import resolve_model

    return Path(str(resolve_model("all-minilm-l6-v2").path))


def measure_bundle(model: str, where: Path, *overrides: str) -> Path:
    """`corescale run ... --bundle`: one short ONNX Runtime measurement of the model, its bundle."""
    bundle = where / "bundle"
    where.mkdir(parents=True, exist_ok=True)  # a bundle's folder goes into an existing one
    proc = corescale("run", "--no-progress", f"model={model}", "backend=onnxruntime", "duration=0.5",
                     "min_iterations=5", "calibrate=false", "warmup.max_iterations=5", "sequence_length=64",
                     "batch_size=4", f"output_dir={where / 'results'}", *overrides,
                     "--bundle", str(bundle))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return bundle


class Service:
    """`corescale serve BUNDLE --port 0 OPTIONS` in its own process, its stderr in a file (`command`: another
    command that serves a bundle and prints the same ready line, `("deploy", "--target", "ray")`)."""

    def __init__(self, bundle: Path | str, log: Path, *options: str, env: dict | None = None,
                 command: tuple[str, ...] = ("serve",)):
        """`bundle`: a folder, or overrides in one string (`model=bert-tiny backend=onnxruntime`)."""
        self.log, self.bundle = log, bundle
        source = str(bundle).split() if "=" in str(bundle) else [str(bundle)]
        with open(log, "wb") as stderr:
            self.process = subprocess.Popen([sys.executable, "-m", "corescale.cli", command[0], *source,
                                             *command[1:], "--port", "0", *options], stdout=subprocess.PIPE,
                                            stderr=stderr, text=True, cwd=ROOT, env=dict(os.environ, **(env or {})))
        try:
            self.ready = wait_ready(self.process, log, 180)
            self.url = url_in(self.ready)
        except RuntimeError:
            self.stop()
            raise

    def terminate(self, timeout: float = 120) -> tuple[int, str]:
        """SIGTERM, then its exit status and the rest of its output."""
        self.process.send_signal(signal.SIGTERM)
        out, _ = self.process.communicate(timeout=timeout)
        return self.process.returncode, out

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate(timeout=30)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
