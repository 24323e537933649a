"""The real CLI in fresh processes: a run writes a complete, consistent result; show re-prints it."""

import json
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers import FAST, assert_threads_honoured, corescale, needs_two_cpus, run_record

pytestmark = pytest.mark.slow  # every test here starts processes


@pytest.fixture
def result_dir(plain_run):
    return plain_run  # conftest.py's session run: FAST, batch 2, one thread


def test_result_record(result_dir):
    record = json.loads((result_dir / "result.json").read_text())
    assert record["schema_version"] == 3 and record["status"] == "ok" and record["valid"]
    assert record["failure"] is None and record["reason"] is None and record["trial_key"] and record["key"]
    (spec,) = record["specs"]  # the instance as it ran: the threads override applied, its batch
    assert spec["threads"] == 1 and spec["batch_size"] == 2 and spec["cpus"] == record["plan"]["instances"][0]["cpus"]
    assert record["config"]["batch_size"] == 2 and record["config"]["model"] == "bert-tiny"
    assert yaml.safe_load((result_dir / "config.yaml").read_text())["threads"] == 1
    m = record["metrics"]
    assert m["window_s"] >= 0.5
    # throughput is samples completed in the window ÷ window length, not 1 / mean latency
    assert m["throughput_samples_per_s"] == pytest.approx(m["samples_in_window"] / m["window_s"])
    assert m["samples_in_window"] % 2 == 0
    assert m["throughput_tokens_per_s"] == pytest.approx(m["throughput_samples_per_s"] * 32)
    assert m["gflops_per_s"] == pytest.approx(m["throughput_samples_per_s"] * m["flops_per_sample"] / 1e9)
    assert m["peak_rss_bytes"] > 50e6 and 0 < m["cpu_utilisation"] <= 1.1  # one thread (a busy machine: less)
    env = record["environment"]
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    flags = set(next(line for line in cpuinfo if line.startswith("flags")).split(":")[1].split())
    assert env["cpu"]["isa"]["avx2"] is ("avx2" in flags)  # what this CPU says of itself
    assert env["topology"]["logical_cpus"] == os.cpu_count()
    assert "torch" in env["libraries"] and env["corescale"]["version"]
    inst = record["instance_reports"][0]
    assert inst["framework"]["num_threads"] == 1
    assert "at::get_num_threads() : 1" in inst["framework"]["parallel_info"]


def test_raw_samples(result_dir):
    record = json.loads((result_dir / "result.json").read_text())
    samples = pd.read_parquet(result_dir / "samples.parquet")
    timed = samples[samples.phase == "timed"]
    assert len(timed) == record["metrics"]["latency_s"]["count"]
    assert (timed.end_ns > timed.start_ns).all()
    assert timed.latency_ms.median() == pytest.approx(record["metrics"]["latency_s"]["p50"] * 1e3)
    assert timed.in_window.sum() * 2 == record["metrics"]["samples_in_window"]
    assert (samples.phase == "warmup").sum() == record["instance_reports"][0]["warmup_iterations"]


def test_show_reprints(result_dir):
    proc = corescale("show", str(result_dir))
    assert proc.returncode == 0 and "latency p50" in proc.stdout
    as_json = json.loads(corescale("show", str(result_dir), "--json").stdout)
    assert as_json["key"]


@needs_two_cpus
def test_threads_honoured(tmp_path):
    """The threads override reaches PyTorch and the OS threads of the instance (how busy they keep its cores
    depends on the machine's other load: benchmarks/threads.py)."""
    records = {}
    for threads in (1, 2):
        records[threads] = run_record(tmp_path / f"t{threads}", "batch_size=4", f"threads={threads}",
                                      f"cores_per_instance={threads}")
        assert records[threads]["instance_reports"][0]["framework"]["num_threads"] == threads
    assert_threads_honoured(records[1], records[2])


def test_multirun_sweep(tmp_path):
    out = tmp_path / "sweep"
    proc = corescale("run", "-m", *FAST, "batch_size=1,2", f"output_dir={out}", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    batches = sorted(json.loads((p / "result.json").read_text())["config"]["batch_size"] for p in out.iterdir())
    assert batches == [1, 2]
