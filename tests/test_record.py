"""The typed record: schema-2 round trip, and real schema-1 results written by corescale 0.1.0 (tests/data/schema1,
made with bert-tiny) read by every command that reads results."""

import json
import shutil
from pathlib import Path

import pytest
from helpers import corescale

from corescale.analysis import store
from corescale.config import BenchmarkConfig
from corescale.record.files import iter_run_dirs, read_result
from corescale.record.index import ResultIndex
from corescale.record.trial import SCHEMA_VERSION, Failure, TrialRecord

SCHEMA1 = Path(__file__).parent / "data" / "schema1"
V1_RUNS = sorted(iter_run_dirs(SCHEMA1))  # 6 runs and sweeps, 2 trials of an instances study


def v1(name_part: str) -> Path:
    (found,) = [p for p in V1_RUNS if name_part in p.name]
    return found


@pytest.fixture
def root(tmp_path):
    """A copy of the schema-1 results (commands may write beside them)."""
    shutil.copytree(SCHEMA1, tmp_path / "v1")
    return tmp_path / "v1"


def test_every_schema1_result_migrates_and_round_trips():
    assert len(V1_RUNS) == 8
    for run in V1_RUNS:
        record = read_result(run)
        assert record.schema_migrated_from == 1 and isinstance(record.config, BenchmarkConfig)
        assert record.legacy_keys and record.trial_key not in record.legacy_keys  # new definition, old key kept
        assert record.key == record.config.key()
        again = TrialRecord.from_json(json.loads(json.dumps(record.to_json())))
        assert again == record and again.to_json()["schema_version"] == SCHEMA_VERSION


def test_flat_backend_options_move_into_the_backend_group():
    record = read_result(v1("onnxruntime-fp32-b1"))
    assert record.config.backend.name == "onnxruntime" and record.config.backend.fusion is True
    assert json.loads((v1("onnxruntime-fp32-b1") / "result.json").read_text())["config"]["ort_fusion"] is True
    hints = {read_result(p).config.backend.performance_hint for p in V1_RUNS if "openvino" in p.name}
    assert hints == {"LATENCY", "THROUGHPUT"}
    assert read_result(v1("pytorch-fp32-b1-s32-i1-c494")).config.backend.changed() == {}  # every option default


def test_schema1_failure_becomes_a_typed_failure():
    record = read_result(v1("b2bee2f0"))  # timeout=1: the instance never got to load
    assert record.status == "failed" and not record.valid and record.metrics is None
    assert record.failure == Failure("timeout", "timed out after 1 s (unfinished instances 0: starting)", 0,
                                     stderr_tail=record.failure.stderr_tail)
    assert record.reason == "instance 0: timed out after 1 s (unfinished instances 0: starting)"
    assert record.partial is not None and record.partial.finished_instances == []


def test_schema1_metrics_are_typed():
    record = read_result(v1("onnxruntime-fp32-b2"))
    m = record.metrics
    assert len(m.per_instance) == 2 and m.per_instance[1].cpus == [1] and m.per_instance[0].batch_size == 2
    assert m.throughput_samples_per_s == pytest.approx(sum(i.throughput_samples_per_s for i in m.per_instance), rel=0.2)


def test_schema2_names_of_the_instance_reports_and_metrics_read_as_schema3_ones():
    """Schema 2 stored both the workers' reports and the per-instance metrics as `instances`; schema 3 names them
    instance_reports and metrics.per_instance, and reads the old names."""
    run = next(r for r in sorted(iter_run_dirs(Path(__file__).parent / "data" / "schema2")) if "-i2-" in r.name)
    old = json.loads((run / "result.json").read_text())
    assert len(old["instances"]) == 2 and len(old["metrics"]["instances"]) == 2
    record = TrialRecord.from_json(old)
    assert [r.instance for r in record.instance_reports] == [0, 1] and len(record.metrics.per_instance) == 2
    new = record.to_json()
    assert "instances" not in new and "instances" not in new["metrics"]
    assert len(new["instance_reports"]) == 2 and len(new["metrics"]["per_instance"]) == 2
    again = TrialRecord.from_json(json.loads(json.dumps(new)))
    assert again.instance_reports == record.instance_reports and again.metrics == record.metrics


@pytest.mark.slow
def test_results_table_reads_old_and_new_alike(root, tmp_path):
    table = store.load(root)
    assert len(table.frame) == 8 and not table.problems
    assert set(table.frame["backend"]) == {"pytorch", "onnxruntime", "openvino"}
    assert (table.frame["schema_migrated_from"] == 1).all()
    proc = corescale("results", str(root), "--where", "backend=onnxruntime", "--csv", "-")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 3 and "backend.fusion" in lines[0]


@pytest.mark.slow
def test_show_reads_a_schema1_result():
    proc = corescale("show", str(v1("onnxruntime-fp32-b1")))
    assert proc.returncode == 0, proc.stderr
    assert "onnxruntime" in proc.stdout and "throughput (samples/s)" in proc.stdout
    failed = corescale("show", "--json", str(v1("b2bee2f0")))
    assert failed.returncode == 1
    data = json.loads(failed.stdout)
    assert data["schema_version"] == SCHEMA_VERSION and data["failure"]["kind"] == "timeout"


@pytest.mark.slow
def test_report_cost_and_compare_read_schema1(root, tmp_path):
    report = corescale("report", str(root), "-o", str(tmp_path / "r.html"))
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "r.html").read_text().count("<section") >= 2
    cost = corescale("cost", str(root), "--price-per-hour", "0.1")
    assert cost.returncode == 0 and "per 1M inferences" in cost.stdout, cost.stderr
    same = corescale("compare", str(root), str(root))
    assert same.returncode == 0, same.stderr
    assert "7 matched trial(s)" in same.stdout  # every ok trial matches itself under the new key definition


def test_resume_finds_schema1_results_by_their_migrated_key(root):
    """A trial measured by 0.1.0 counts as done for today's sweep of the same configuration."""
    from corescale.overrides import compose
    from corescale.record.trial import spec_key
    from corescale.workload.models import resolve_model

    record = read_result(v1("onnxruntime-fp32-b1"))
    cfg = compose(["model=bert-tiny", "backend=onnxruntime", "backend.fusion=true", "batch_size=1",
                   "sequence_length=32", "duration=0.5", "min_iterations=5", "warmup.max_iterations=5",
                   "calibrate=false", "instances=2", "cores_per_instance=1", f"output_dir={root}"])
    key = spec_key(cfg, resolve_model("bert-tiny"))
    assert key == record.trial_key
    index = ResultIndex(root)
    assert index.find(key) is not None and index.find(record.legacy_keys[0]) is not None


# --- schema 2 (corescale 0.2 before the typed sections) and schema 3 ------------------------------------------------

SCHEMA2 = Path(__file__).parent / "data" / "schema2"
V2_RUNS = sorted(iter_run_dirs(SCHEMA2))  # offline 2 instances, an int8 drift check, a server max-QPS search


def v2(name_part: str) -> Path:
    (found,) = [p for p in V2_RUNS if name_part in p.name]
    return found


def test_every_schema2_result_reads_into_typed_sections_and_round_trips():
    from corescale.machine.placement import InstanceSpec
    from corescale.record.sections import HostEnvironment, InstanceReport, LatencySummary

    assert len(V2_RUNS) == 3
    for run in V2_RUNS:
        raw = json.loads((run / "result.json").read_text())
        assert raw["schema_version"] == 2
        record = read_result(run)
        assert record.schema_migrated_from is None and record.trial_key == raw["trial_key"]  # resume keys unchanged
        assert isinstance(record.environment, HostEnvironment) and record.environment.cpu.model
        assert record.environment.cpu.model == raw["environment"]["cpu"]["model"]
        assert all(isinstance(s, InstanceSpec) for s in record.specs) and len(record.specs) == len(raw["specs"])
        assert [list(s.cpus) for s in record.specs] == [s["cpus"] for s in raw["specs"]]
        assert all(isinstance(r, InstanceReport) for r in record.instance_reports)
        if record.metrics is not None:
            assert isinstance(record.metrics.latency_s, LatencySummary)
            assert record.metrics.latency_s.p99 == raw["metrics"]["latency_s"]["p99"]
        written = record.to_json()
        assert written["schema_version"] == SCHEMA_VERSION == 3
        renamed = {"instances": "instance_reports"}  # schema 3's name of the workers' reports
        for section in ("environment", "specs", "instances", "drift", "server"):  # same JSON shape as schema 2
            _same_shape(raw[section], written[renamed.get(section, section)], section)
        assert TrialRecord.from_json(json.loads(json.dumps(written))) == record


def _same_shape(old, new, where: str) -> None:
    """Every value schema 2 wrote is written back (schema 3 may add fields with their defaults)."""
    if isinstance(old, dict):
        assert isinstance(new, dict), where
        for key, value in old.items():
            assert key in new, f"{where}.{key}"
            _same_shape(value, new[key], f"{where}.{key}")
    elif isinstance(old, list):
        assert isinstance(new, list) and len(new) == len(old), where
        for i, (a, b) in enumerate(zip(old, new)):
            _same_shape(a, b, f"{where}[{i}]")
    else:
        assert old == new, where


def test_schema2_server_and_drift_sections_are_typed():
    from corescale.record.sections import Drift, ServerSummary

    served = read_result(v2("pytorch-fp32-b1-s32-i1"))
    assert isinstance(served.server, ServerSummary) and served.server.searched
    assert served.server.max_valid_qps and served.server.max_valid_qps > 0
    assert served.server.steps[-1].queries > 0 and len(served.server.load_curve) >= 2
    assert served.server.batching.max_batch >= 1 and served.server.parent.cpus
    checked = read_result(v2("int8-b1-s32-i1"))
    assert isinstance(checked.drift, Drift) and checked.drift.reference == "pytorch"
    assert checked.drift.within_tolerance and checked.instance_reports[0].drift == checked.drift


def test_schema2_results_are_found_by_their_keys_and_tabled(tmp_path):
    shutil.copytree(SCHEMA2, tmp_path / "v2")
    index = ResultIndex(tmp_path / "v2")
    for run in V2_RUNS:
        assert index.find(read_result(run).trial_key) is not None
    table = store.load(tmp_path / "v2")
    assert len(table.frame) == 3 and not table.problems
    served = table.frame[table.frame["scenario"] == "server"].iloc[0]
    assert served["server_max_valid_qps"] > 0 and served["cpus_per_instance"] == 1


@pytest.mark.slow  # `corescale show` in a process
@pytest.mark.parametrize("section, path, value, where", [
    ("server", ("steps", 0, "queries"), "many", "server.steps[0].queries: expected an integer, got 'many'"),
    ("drift", ("within_tolerance",), "yes", "drift.within_tolerance: expected true or false, got 'yes'"),
    ("metrics", ("latency_s", "p99"), None, "metrics.latency_s.p99: expected a number, got None"),
    ("specs", (0, "cpus"), "0-1", "specs[0].cpus: expected a list, got '0-1'"),
    ("environment", ("cpu",), [], "environment.cpu: expected an object, got []"),
])
def test_a_malformed_section_is_one_clear_line(tmp_path, section, path, value, where):
    from corescale.errors import UserError

    run = v2("pytorch-fp32-b1-s32-i1") if section == "server" else v2("int8-b1-s32-i1")
    data = json.loads((run / "result.json").read_text())
    target = data[section]
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    (tmp_path / "result.json").write_text(json.dumps(data))
    with pytest.raises(UserError) as error:
        read_result(tmp_path)
    message = str(error.value)
    assert where in message and str(tmp_path) in message and "\n" not in message
    proc = corescale("show", str(tmp_path))
    assert proc.returncode == 2 and where in proc.stderr and "Traceback" not in proc.stderr
