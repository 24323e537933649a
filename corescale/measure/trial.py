"""What one trial is and leaves before it is written: the prepared `Trial`, its first record, its
`UncommittedResult`, and the places it writes (checked before anything runs). Shared by the local instances'
trial (runner.py) and a server's measured over HTTP (http/trial.py)."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from corescale.backends import entry
from corescale.config import BenchmarkConfig
from corescale.machine.environment import HostEnvironment
from corescale.machine.placement import InstanceSpec, Plan, instance_specs
from corescale.measure.http.api import Query
from corescale.record.trial import TrialRecord
from corescale.workload.models import ModelSpec
from corescale.workload.samples import QuerySet

if TYPE_CHECKING:  # pandas costs ~0.5 s to import: `corescale serve` needs this module, not it
    import pandas as pd


@dataclass(frozen=True)
class Trial:
    cfg: BenchmarkConfig
    model: ModelSpec
    plan: Plan
    key: str  # the trial key resume looks up (config key + model identity)
    queries: QuerySet | None = None  # the queries' token ids, when they are not one fixed random batch
    quality: QuerySet | None = None  # the real text the task's quality is judged on (None: task=encode)
    texts: list[Query] | None = None  # endpoint=: the queries as they are sent (texts; rerank: query and texts)
    served: BenchmarkConfig | None = None  # endpoint=managed: the layout `corescale serve` runs, as a run's config

    def instance_specs(self, work_dir: Path | None = None) -> list[InstanceSpec]:
        return instance_specs(self.plan, self.cfg.threads, self.cfg.instance_batch_size, work_dir)


@dataclass
class UncommittedResult:
    """Everything a trial produced, before it is written anywhere (it may travel from another node)."""

    record: TrialRecord
    samples: pd.DataFrame | None
    logs: dict[str, bytes]
    interrupted: BaseException | None = None  # raised again once the record is committed


def new_record(trial: Trial, host: HostEnvironment | None, started: float) -> TrialRecord:
    return TrialRecord(config=trial.cfg, key=trial.cfg.key(), trial_key=trial.key, model=trial.model.identity(),
                       plan=trial.plan.to_dict(), environment=host or HostEnvironment(),
                       started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)))


def check_places(cfg: BenchmarkConfig, results: bool = True) -> None:
    """The results root (and the cache, where this trial writes one) can be written: refused before any
    measurement is made and lost."""
    from corescale.userfiles import check_writable

    if results:
        check_writable(cfg.results_root, "output_dir", directory=True)
    artifacts = [a for name in (cfg.backend.name, cfg.reference_backend) if name for a in entry(name).artifacts]
    if artifacts or cfg.calibrate:
        check_writable(cfg.cache_dir, "cache_dir", directory=True)
    if cfg.compiled_cache:
        check_writable(cfg.compiled_cache, "compiled_cache", directory=True)


@contextmanager
def housekeeping_cpus(specs: list[InstanceSpec]):
    """The parent (supervision, progress display) moves to CPUs no instance uses while they run, when the
    machine has any; otherwise it stays where it is and keeps quiet (the display redraws only on events)."""
    mine = os.sched_getaffinity(0)
    free = mine - {cpu for spec in specs for cpu in spec.cpus}
    if free and free != mine:
        move_every_thread(free)
    try:
        yield free or None
    finally:
        move_every_thread(mine)


def move_every_thread(cpus: set[int]) -> None:
    """Every thread of this process (the readers, dispatchers and keeper started before it, not only the calling
    one) onto `cpus`; threads started later inherit it from the one that starts them."""
    from corescale.machine.instance_env import thread_affinities

    for thread in [0, *thread_affinities()]:
        try:
            os.sched_setaffinity(thread, cpus)
        except OSError:
            continue  # the thread ended meanwhile
