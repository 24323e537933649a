"""A trial's quality gate: instance 0's check judged by min_quality (or the task's defaults), after the window, or,
for a served trial, before its QPS search (the fp32 reference computed first in a process of its own), so that an
artifact that misses the gate runs no LoadGen test."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from corescale.record.sections import Quality
from corescale.record.trial import Failure, TrialRecord

if TYPE_CHECKING:
    from corescale.machine.placement import InstanceSpec
    from corescale.measure.protocol import TrialFiles
    from corescale.measure.trial import Trial


def judge_quality(record: TrialRecord, trial: Trial) -> None:
    """Instance 0's quality check, judged by min_quality (or the task's defaults): a configuration that misses it
    keeps its (valid) figures and fails as withheld (quality)."""
    checked = [r.quality for r in record.instance_reports if r.quality is not None]
    if not checked:
        return
    record.quality = gated(checked[0], trial)
    if record.quality.failed and record.ok:
        record.fail(Failure("quality", record.quality.failure_message()), valid=True)


def missed_gate(report: dict, trial: Trial) -> str | None:
    """A served trial's instance 0 checked quality before the search (its `checked` event): why it misses the gate
    (None: it meets it, or cannot be judged), so that no LoadGen test runs."""
    found = gated(Quality.from_dict(report, "instance 0's quality check"), trial)
    return found.failure_message() if found.failed else None


def gated(found: Quality, trial: Trial) -> Quality:
    """A quality check with the gate applied: min_quality, or the task's defaults (unknown: as it is)."""
    from corescale.machine.precisions import PRECISIONS
    from corescale.workload.quality import Bound, parse_gate
    from corescale.workload.tasks import BATCH_CHANGE

    gate = parse_gate(trial.cfg.min_quality, trial.model.task, (found.evaluation or {}).get("kind"))
    if found.unknown is not None:  # nothing to judge against: said, neither passed nor failed
        return found
    values = found.values()
    if found.batch_change is not None and trial.model.head.entry.head == "pooled" and \
            all(b.metric != BATCH_CHANGE for b in gate):  # by default a vector may move between batchings as far
        gate.append(Bound(BATCH_CHANGE, "<=", round(1 - PRECISIONS[trial.cfg.precision].min_cosine, 6)))  # as the
        # precision may move it from fp32
    failed = [b.text() for b in gate if not b.holds(values.get(b.metric, float("nan")))]
    return dataclasses.replace(found, gate=[b.text() for b in gate], failed=failed, passed=not failed)


def reference_first(trial: Trial, first: InstanceSpec, files: TrialFiles, work: Path) -> None:
    """A served trial's instance 0 checks quality during its warm-up (worker.Instance.check_first), before the
    search: the fp32 reference's outputs on the quality set are computed here first, in a short process of their
    own on that instance's CPUs and threads (measure/quality.py's main), into the cache the check reads. The
    reference's library, threads and memory then never enter the measured process (they did after the window
    before, and would now be there through the search). Nothing to do when the cache holds them already; a
    failure here leaves the worker to compute them itself, as before."""
    import subprocess
    import sys

    from corescale.measure import quality
    from corescale.measure.protocol import Job

    assert trial.quality is not None, "a judged trial has its quality set"
    if quality.unknown_quality(trial.cfg, trial.model) is not None or \
            quality.reference_file(trial.cfg, trial.model, trial.quality).is_file():
        return
    job = Job.each(trial.cfg, trial.model, [first], files)[0].write(work / "reference.json")
    try:
        subprocess.run([sys.executable, "-m", "corescale.measure.quality", str(job)], check=False,
                       timeout=trial.cfg.timeout, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pass
