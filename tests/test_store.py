"""The results table: one row per run, latest per key, filters, CSV, corrupted files skipped, bad input."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from helpers import LOOP, TOY_ENV, corescale

from corescale.analysis import store
from corescale.errors import UserError
from corescale.overrides import compose
from corescale.record.trial import spec_key
from corescale.workload.models import resolve_model


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """One real run (the toy backend: the subject is the table, not a framework), plus a later attempt of the same
    trial and a corrupted copy. The tests that read it know the toy too (toy_everywhere)."""
    out = tmp_path_factory.mktemp("store") / "outputs"
    proc = corescale("run", *LOOP, "batch_size=2", f"output_dir={out}", "--no-progress", env=TOY_ENV)
    assert proc.returncode == 0, proc.stderr
    (run,) = list(out.iterdir())
    later = out / f"{run.name}-again"
    shutil.copytree(run, later)
    record = json.loads((later / "result.json").read_text())
    record.update(finished_at=record["finished_at"] + 60, status="failed", reason="a later, failed attempt")
    (later / "result.json").write_text(json.dumps(record))
    broken = out / "broken-run"
    shutil.copytree(run, broken)
    (broken / "result.json").write_text('{"schema_version": 1, "config": ')  # cut short
    (out / ".tmp-unfinished").mkdir()  # a run that was killed before it committed
    return out


@pytest.mark.slow
@pytest.mark.usefixtures("toy_everywhere")
def test_latest_attempt_per_key_and_every_attempt(root):
    table = store.load(root)
    assert len(table.frame) == 1 and table.frame.loc[0, "status"] == "failed"  # the later attempt wins
    assert table.unfinished == 1
    [(path, reason)] = table.problems
    assert path.name == "broken-run" and "corrupted" in reason
    every = store.load(root, latest=False).frame
    assert len(every) == 2 and every["key"].nunique() == 1
    row = every[every["status"] == "ok"].iloc[0]
    assert row["model"] == "bert-tiny" and row["batch_size"] == 2 and row["sequence_length"] == 32
    assert row["warmup.max_iterations"] == 5 and row["cpus_total"] >= 1 and row["batch_total"] == 2
    assert row["throughput_samples_per_s"] > 0 and row["latency_p99_ms"] >= row["latency_p50_ms"] > 0


def test_filters():
    frame = pd.DataFrame({"backend": ["pytorch", "onnxruntime", "torchscript"], "batch_size": [1, 8, 32],
                          "threads": [None, 2.0, None]})
    assert list(store.filter_frame(frame, ["backend=onnxruntime"])["batch_size"]) == [8]
    assert list(store.filter_frame(frame, ["backend=pytorch,torchscript"])["batch_size"]) == [1, 32]
    assert list(store.filter_frame(frame, ["batch_size>=8", "backend!=torchscript"])["backend"]) == ["onnxruntime"]
    assert list(store.filter_frame(frame, ["threads=None"])["batch_size"]) == [1, 32]
    for bad, message in (("colour=red", "unknown column 'colour'"), ("batch_size>x", "not a number"),
                         ("batch_size", "cannot parse filter")):
        with pytest.raises(UserError, match=message):
            store.filter_frame(frame, [bad])


@pytest.mark.slow
@pytest.mark.usefixtures("toy_everywhere")
def test_results_command_lists_filters_and_exports(root, tmp_path):
    proc = corescale("results", str(root), "--all")
    assert proc.returncode == 0
    assert "bert-tiny" in proc.stdout and "2 result(s)" in proc.stdout
    assert "skipped" in proc.stderr and "broken-run" in proc.stderr and "unfinished" in proc.stderr
    csv = tmp_path / "all.csv"
    assert corescale("results", str(root), "--all", "--csv", str(csv)).returncode == 0
    exported = pd.read_csv(csv)
    assert len(exported) == 2 and {"key", "status", "latency_p50_ms", "path"} <= set(exported.columns)
    only_ok = corescale("results", str(root), "--all", "--where", "status=ok", "--csv", "-")
    assert len(only_ok.stdout.strip().splitlines()) == 2  # header + one row
    none = corescale("results", str(root), "--where", "backend=onnxruntime")
    assert none.returncode == 0 and "0 result(s)" in none.stdout


@pytest.mark.parametrize("args, message", [
    (["{missing}"], "does not exist"),
    (["{empty}"], "no results under"),
    (["{root}", "--where", "colour=red"], "unknown column 'colour'"),
    (["{root}", "--sort", "colour"], "unknown sort column 'colour'"),
])
@pytest.mark.slow
@pytest.mark.usefixtures("toy_everywhere")
def test_bad_input_is_one_line(root, tmp_path, args, message):
    (tmp_path / "empty").mkdir()
    paths = {"missing": tmp_path / "missing", "empty": tmp_path / "empty", "root": root}
    proc = corescale("results", *[a.format(**paths) for a in args])
    assert proc.returncode == 2
    [error] = [line for line in proc.stderr.splitlines() if line.startswith("corescale: error:")]
    assert message in error and proc.stderr.strip().endswith(error)  # notes on skipped files may come first


def test_local_model_files_change_the_key(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    (model_dir / "model.safetensors").write_bytes(b"weights v1")
    cfg = compose([f"model={model_dir}"])
    before = spec_key(cfg, resolve_model(cfg.model))
    assert spec_key(cfg, resolve_model(cfg.model)) == before  # stable
    (model_dir / "model.safetensors").write_bytes(b"weights v2, retrained")
    assert spec_key(cfg, resolve_model(cfg.model)) != before
    preset = compose(["model=bert-tiny"])
    assert spec_key(preset, resolve_model("bert-tiny")) != spec_key(
        compose(["model=bert-tiny", "batch_size=2"]), resolve_model("bert-tiny"))


@pytest.mark.slow
@pytest.mark.usefixtures("toy_everywhere")
def test_csv_to_an_unwritable_place_is_one_line(root, tmp_path):
    proc = corescale("results", str(root), "--csv", str(tmp_path / "no" / "such" / "dir" / "x.csv"))
    assert proc.returncode == 2 and "cannot write --csv" in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("corescale: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr and not (tmp_path / "no").exists()


def test_the_summary_shows_the_settings_that_differ_and_a_servers_max_qps(tmp_path):
    """Real results (tests/data/schema2): a LoadGen server search among two closed-loop runs, and the same search
    again at another max batch. The summary shows the setting that tells the searches apart (not the server
    settings that only the searches measure) and their max QPS with its latencies, which the closed-loop columns
    leave blank."""
    data = Path(__file__).parent / "data" / "schema2"
    shutil.copytree(data, tmp_path / "outputs")
    search = next((tmp_path / "outputs").glob("*pytorch*"))
    record = json.loads((search / "result.json").read_text())
    record["config"]["server"]["max_batch"], record["key"], record["trial_key"] = 2, "another", "another"
    record["server"]["max_valid_qps"] = 380.0
    shutil.copytree(search, tmp_path / "outputs" / "again")
    (tmp_path / "outputs" / "again" / "result.json").write_text(json.dumps(record))
    frame = store.load(tmp_path / "outputs").frame
    columns = store.summary_columns(frame)
    assert "server.max_batch" in columns and columns.index("server.max_batch") < columns.index("latency_p50_ms")
    assert "server.min_query_count" not in columns and "output_dir" not in columns
    assert {"server_max_valid_qps", "server_p50_ms", "server_p99_ms"} <= set(columns)
    searches = frame[frame["scenario"] == "server"].sort_values("server.max_batch")
    assert list(searches["server_max_valid_qps"]) == [380.0, 416.0]
    assert searches["throughput_samples_per_s"].isna().all()
    offline = store.summary_columns(frame[frame["scenario"] != "server"])
    assert "server_max_valid_qps" not in offline and "server.max_batch" not in offline
