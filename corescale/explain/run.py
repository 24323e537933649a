"""`corescale explain`'s measuring side: the trial's one instance, its peak and memory roof (from the cache, or
measured like a run's), then the explain worker pinned and configured exactly like a benchmark instance."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from corescale.errors import UserError
from corescale.machine import instance_env
from corescale.machine.lock import machine_lock
from corescale.machine.peak import PeakCache
from corescale.machine.scratch import scratch
from corescale.measure import protocol
from corescale.measure.calibrate import with_peaks


def profile(trial, isa: dict, on_lock_wait=None) -> dict:
    """The worker's JSON (measured latencies, profiled calls) plus the instance it ran as (with its roofs), under
    the machine lock (on_lock_wait: as machine_lock's on_wait)."""
    cfg = trial.cfg
    with machine_lock(on_wait=on_lock_wait), scratch("explain") as work:
        (spec,) = trial.instance_specs(Path(work))
        if cfg.calibrate:
            (spec,) = with_peaks([spec], cfg, isa, Path(work), PeakCache(cfg.cache_dir))
        (job,) = protocol.Job.each(cfg, trial.model, [spec])
        path, out = job.write(Path(work) / "job.json"), Path(work) / "profile.json"
        with instance_env.spawn(instance_env.Launch.of(cfg, spec), "corescale.explain.worker", str(path), str(out),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as process:
            try:
                _, err = process.communicate(timeout=cfg.timeout)
            except subprocess.TimeoutExpired:
                instance_env.kill(process)  # the worker and every process it started
                raise UserError(f"the explain worker did not finish within timeout={cfg.timeout:g} s (loading, "
                                "warm-up, the timed calls and the profiled ones); give a larger timeout=") from None
            except BaseException:  # an interrupt: the worker and all it started go, then raised
                instance_env.kill(process)
                raise
        try:
            result = json.loads(out.read_text())
        except (OSError, ValueError):
            tail = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {process.returncode}"]
            raise RuntimeError(f"explain worker failed: {tail[0][:300]}") from None
    message = answer(result)
    return {**message.profile, "instance": spec.to_json()}


def answer(result) -> protocol.Profiled:
    """The explain worker's profile, or its failure raised (UserError: bad input)."""
    try:
        message = protocol.from_fields(result)
    except protocol.ProtocolError as bad:
        raise RuntimeError(f"explain worker sent a malformed answer: {bad}") from None
    if isinstance(message, protocol.WorkerFailure):
        if message.kind == "user":
            raise UserError(message.message)
        raise RuntimeError(f"explain worker failed: {message.message}\n{message.traceback or ''}")
    if not isinstance(message, protocol.Profiled):
        raise RuntimeError(f"explain worker answered '{message.EVENT}', not its profile")
    return message
