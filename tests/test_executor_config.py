"""The executor config group: `executor=local|ray`, its settings, keys, errors; the local trial loop."""

import subprocess
import sys

import pytest
from helpers import LOOP, ROOT, corescale

from corescale.config import BenchmarkConfig, ExecutorConfig, RayExecutorConfig
from corescale.errors import UserError
from corescale.measure.runner import prepare_trial
from corescale.overrides import compose, expand_sweep
from corescale.record.files import iter_run_dirs, read_result
from corescale.trials.local import Listener, Planned, run_trials

TINY = ["model=bert-tiny"]


def test_default_is_local_and_keeps_existing_keys():
    cfg = compose(TINY)
    assert cfg.executor == ExecutorConfig() and cfg.executor.name == "local"
    legacy = cfg.to_dict()
    legacy.pop("executor")  # a config written before executors existed means the same measurement
    assert BenchmarkConfig.from_dict(legacy) == cfg
    assert BenchmarkConfig.from_dict(legacy).key() == cfg.key()


def test_ray_settings_from_overrides():
    cfg = compose([*TINY, "executor=ray", "executor.address=10.0.0.5:6379", "executor.node_type=c6i.2xlarge",
                   "executor.max_retries=5"])
    assert cfg.executor == RayExecutorConfig(address="10.0.0.5:6379", node_type="c6i.2xlarge", max_retries=5)
    assert BenchmarkConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.to_dict()["executor"] == {"name": "ray", "address": "10.0.0.5:6379", "node_type": "c6i.2xlarge",
                                         "max_retries": 5}


def test_key_ignores_where_the_cluster_is_but_not_the_machine_kind():
    local = compose(TINY).key()
    ray_here = compose([*TINY, "executor=ray"]).key()
    ray_there = compose([*TINY, "executor=ray", "executor.address=10.0.0.5:6379", "executor.max_retries=0"]).key()
    c6i = compose([*TINY, "executor=ray", "executor.node_type=c6i.2xlarge"]).key()
    c5 = compose([*TINY, "executor=ray", "executor.node_type=c5.metal", "executor.address=h:1"]).key()
    assert local == ray_here == ray_there
    assert len({local, c6i, c5}) == 3
    assert c6i == compose([*TINY, "executor=ray", "executor.node_type=c6i.2xlarge", "executor.address=x:1"]).key()


def test_sweep_over_node_types():
    trials = expand_sweep([*TINY, "executor=ray", "executor.node_type=c6i.2xlarge,c5.metal", "batch_size=1,8"])
    configs = [compose(t) for t in trials]
    assert [(c.executor.node_type, c.batch_size) for c in configs] == [
        ("c6i.2xlarge", 1), ("c6i.2xlarge", 8), ("c5.metal", 1), ("c5.metal", 8)]
    assert len({c.key() for c in configs}) == 4
    mixed = [compose(t).executor.name for t in expand_sweep([*TINY, "executor=local,ray"])]
    assert mixed == ["local", "ray"]


@pytest.mark.parametrize("overrides,message", [
    (["executor=slurm"], "unknown executor 'slurm'; allowed: local, ray"),
    (["executor.address=h:6379"],
     "unknown key 'executor.address' for executor=local; executor settings: ray: address, node_type, max_retries"),
    (["executor=ray", "executor.colour=red"], "unknown key 'executor.colour' for executor=ray"),
    (["executor=ray", "executor.max_retries=two"], "executor.max_retries: expected integer, got 'two'"),
    (["executor=ray", "executor.max_retries=-1"], "executor.max_retries must be >= 0 (got -1)"),
    (["executor=ray", "batch_size=eight"], "batch_size: expected integer, got 'eight'"),
    (["executor.node_type=a", "executor=ray", "colour=red"], "unknown key 'colour'; allowed keys: model"),
])
def test_bad_executor_overrides_are_one_line(overrides, message):
    with pytest.raises(UserError) as info:
        compose([*TINY, *overrides])
    assert message in str(info.value) and "\n" not in str(info.value)


def test_from_dict_rejects_unknown_executor():
    with pytest.raises(UserError, match="unknown executor 'k8s'; allowed: local, ray"):
        BenchmarkConfig.from_dict({"executor": {"name": "k8s"}})


@pytest.mark.slow
def test_cli_unknown_executor(tmp_path):
    proc = corescale("run", *TINY, "executor=slurm", f"output_dir={tmp_path / 'out'}", "--no-progress")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["corescale: error: unknown executor 'slurm'; allowed: local, ray"]


@pytest.mark.slow
def test_missing_ray_names_the_extra():
    code = ("import sys; sys.modules['ray'] = None\n"  # this interpreter cannot import ray
            "from corescale.config import RayExecutorConfig\n"
            "from corescale.errors import UserError\n"
            "from corescale.trials.ray import import_ray\n"
            "try:\n    import_ray()\nexcept UserError as exc:\n    print(exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.stdout.strip() == "executor=ray needs Ray: pip install 'corescale[ray]'", proc.stderr


@pytest.mark.slow
def test_local_loop_runs_and_commits_each_trial(tmp_path, toy_everywhere):
    out = tmp_path / "out"  # the toy backend's trials (real workers): the subject is the loop, not a framework
    planned = [Planned(n, [f"batch_size={b}"], prepare_trial(compose([*LOOP, f"output_dir={out}", f"batch_size={b}"])))
               for n, b in enumerate((1, 2), 1)]
    seen = []

    class Recorder(Listener):
        def finished(self, item, outcome, state):
            seen.append((item, outcome))

    state = run_trials(planned, Recorder())
    assert [item for item, _ in seen] == planned and state.count("ok") == 2
    assert all(o.ok and o.path.is_dir() for _, o in seen)
    records = [read_result(d) for d in iter_run_dirs(out)]
    assert sorted(r.config.batch_size for r in records) == [1, 2]
    assert all(r.executor == {"name": "local"} and r.trial_key and r.finished_at for r in records)
    assert {r.trial_key for r in records} == {item.key for item in planned}
    again = run_trials(planned, Recorder())  # resume: both have a valid result now
    assert again.count("skipped") == 2 and len(seen) == 2 and len(list(iter_run_dirs(out))) == 2
