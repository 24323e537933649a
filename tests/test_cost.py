"""Cost per 1M inferences: the arithmetic, the catalog, projections and the cheapest layout under an SLO."""

import io
import shutil
from pathlib import Path

import pandas as pd
import pytest
from helpers import FAST, corescale

from corescale.analysis import cost
from corescale.errors import UserError


def rows(**columns):
    """A results table as store.load builds it, with the columns cost reads."""
    base = {"status": "ok", "valid": True, "model": "bert-base", "backend": "pytorch", "batch_size": 1,
            "instance_batch_size": 1, "sequence_length": 128, "use_logical_cores": False, "contaminated": False,
            "run": "r", "host_physical_cores": 2, "host_logical_cpus": 2, "cpu_model": "AMD EPYC 7B13",
            "cpu_isa": "avx2 avx512 avx512_vnni", "precision": "fp32"}
    n = len(next(iter(columns.values())))
    return pd.DataFrame([{**base, **{k: v[i] for k, v in columns.items()}} for i in range(n)])


def test_cost_per_million_arithmetic():
    # $/h ÷ (samples/s × 3600) × 1e6
    assert cost.cost_per_million(3.6, 1.0) == pytest.approx(1000.0)
    assert cost.cost_per_million(4.848, 100) == pytest.approx(4.848 / 360000 * 1e6)
    assert cost.cost_per_million(1.0, 0) == float("inf")


def test_catalog_holds_the_study_figures_and_common_machines():
    catalog = cost.load_catalog()
    assert (catalog["study-48-cores"].price_per_hour, catalog["study-48-cores"].physical_cores) == (4.848, 48)
    assert (catalog["study-8-cores"].price_per_hour, catalog["study-8-cores"].physical_cores) == (0.808, 8)
    assert catalog["c5.metal"].physical_cores == 48 and "8275CL" in catalog["c5.metal"].cpu_model
    assert all(m.vcpus >= m.physical_cores > 0 and m.price_per_hour > 0 for m in catalog.values())
    with pytest.raises(UserError, match="unknown machine 'c9.huge'"):
        cost.find_machine("c9.huge", catalog)


def test_measured_price_and_cheapest_layout_under_slo():
    frame = rows(instances=[1, 2], cpus_per_instance=[2, 1], cpus_total=[2, 2],
                 throughput_samples_per_s=[10.0, 16.0], latency_p99_ms=[90.0, 140.0])
    here = cost.choose_machine(None, 0.36, None)
    table = cost.cost_table(frame, here, slo_p99_ms=100)
    assert list(table["basis"]) == ["measured", "measured"] and list(table["copies"]) == [1, 1]
    by_layout = table.set_index("layout")
    assert by_layout.loc["2 × 1 cores · pytorch · batch 1 each · seq 128", "cost_per_1m_usd"] == pytest.approx(6.25)
    assert by_layout.loc["1 × 2 cores · pytorch · batch 1 · seq 128", "cost_per_1m_usd"] == pytest.approx(10.0)
    best = cost.cheapest(table, 100)  # the cheaper layout misses the SLO
    assert best["layout"].startswith("1 × 2 cores") and best["meets_slo"]
    assert cost.cheapest(table, None)["layout"].startswith("2 × 1 cores")
    assert "cheapest measured layout that meets p99 ≤ 100 ms: 1 × 2 cores" in cost.answer(table, here, 100)
    assert cost.cheapest(table, 50) is None and "no measured layout" in cost.answer(table, here, 50)


def test_projection_to_a_bigger_machine_is_labelled_with_its_assumption():
    frame = rows(instances=[2], cpus_per_instance=[1], cpus_total=[2], throughput_samples_per_s=[16.0],
                 latency_p99_ms=[50.0])
    c5 = cost.find_machine("c5.metal", cost.load_catalog())
    [row] = cost.cost_table(frame, c5).to_dict(orient="records")
    assert row["basis"] == "projected" and row["copies"] == 48  # 48 physical cores ÷ 1 core per instance
    # per instance 16 ÷ 2; measured on AMD (Milan), projected to Intel (Cascade Lake): ×0.5–×1, priced at the slow end
    assert row["machine_samples_per_s"] == pytest.approx(8.0 * 48 * 0.5)
    assert row["machine_samples_per_s_high"] == pytest.approx(8.0 * 48)
    assert row["cost_per_1m_usd"] == pytest.approx(4.08 / (8.0 * 48 * 0.5 * 3600) * 1e6)
    assert "another vendor" in row["flags"] and "extrapolated ×24" in row["flags"]
    assert "no memory cap" in row["flags"]  # no roofline traffic in this row: said, not silently uncapped
    text = cost.assumption(c5, row["cpu_model"])
    assert "projection to c5.metal" in text and "physical cores" in text and "AMD EPYC 7B13" in text
    same = rows(instances=[1], cpus_per_instance=[48], cpus_total=[48], throughput_samples_per_s=[30.0],
                latency_p99_ms=[40.0], host_physical_cores=[48], cpu_model=["Intel(R) Xeon(R) Platinum 8275CL CPU"])
    assert cost.cost_table(same, c5)["basis"].tolist() == ["measured"]  # measured on that very machine type


@pytest.mark.slow
def test_cost_command_end_to_end(tmp_path, plain_run):
    out = tmp_path / "outputs"
    shutil.copytree(plain_run, out / plain_run.name)  # a real run (conftest.py's, shared)
    proc = corescale("cost", str(out), "--machine", "c5.metal", "--slo-p99-ms", "10000")
    assert proc.returncode == 0, proc.stderr
    assert "projection to c5.metal" in proc.stdout and "cheapest measured layout that meets p99" in proc.stdout
    assert "per 1M tokens" in proc.stdout
    here = corescale("cost", str(out), "--price-per-hour", "0.5", "--csv", "-")
    [row] = pd.read_csv(io.StringIO(here.stdout)).to_dict(orient="records")  # the answer goes to stderr
    assert "cheapest measured layout" in here.stderr
    assert row["basis"] == "measured"
    assert row["cost_per_1m_usd"] == pytest.approx(0.5 / (row["machine_samples_per_s"] * 3600) * 1e6, rel=1e-6)
    assert corescale("cost", "--list-machines").stdout.count("study-") == 2
    ranked = corescale("cost", str(out), "--slo-p99-ms", "10000")  # the seed's question: the catalog ranked
    assert ranked.returncode == 0, ranked.stderr
    assert "which machine" in ranked.stdout and "this machine, measured" in ranked.stdout
    table = corescale("cost", str(out), "--slo-p99-ms", "10000", "--csv", "-")  # the same ranking, row by row
    rows = pd.read_csv(io.StringIO(table.stdout)).to_dict(orient="records")
    assert len(rows) >= 10 and {r["basis"] for r in rows} <= {"measured", "projected", "refused", "history"}, rows
    for r in rows:  # a projection is a range of prices; a refusal, or a kind without a price, says why
        if r["basis"] == "history":  # the 2021 study's quotes: shown, never ranked as buyable
            assert pd.isna(r["rank"]), r
        elif r["basis"] == "projected" and not pd.isna(r["cost_per_1m_usd"]):
            assert r["cost_per_1m_low_usd"] <= r["cost_per_1m_usd"], r
        else:
            assert r["basis"] == "measured" or (isinstance(r["reason"], str) and r["reason"]), r


@pytest.mark.parametrize("args, message", [
    (["{root}", "--machine", "c9.huge"], "unknown machine 'c9.huge'"),
    (["{root}"], "no results under"),
    (["{root}", "--this-machine", "c9.huge"], "unknown machine 'c9.huge'"),
    (["{root}", "--price-per-hour", "-1"], "must be > 0"),
])
@pytest.mark.slow
def test_cost_bad_input_is_one_line(tmp_path, args, message):
    proc = corescale("cost", *[a.format(root=tmp_path) for a in args])
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and message in proc.stderr


SCHEMA2 = Path(__file__).parent / "data" / "schema2"


def table_text(record) -> str:
    from rich.console import Console

    from corescale.report.console import result_table

    console = Console(width=300, record=True, file=io.StringIO())
    console.print(result_table(record))
    return console.export_text()


def test_runs_table_shows_the_cost_and_where_its_price_comes_from():
    import dataclasses

    from corescale.config import CostConfig
    from corescale.record.files import read_result

    record = read_result(next(SCHEMA2.glob("*onnxruntime-int8-b1-s32-i2-*")))
    rate = record.metrics.throughput_samples_per_s
    text = table_text(record)  # no price: the nearest catalog kind's core-hour rate, named
    assert "US$ per 1M inferences" in text and "core-hour" in text and "per 1M tokens" in text
    priced = dataclasses.replace(record, config=dataclasses.replace(record.config, cost=CostConfig(price_per_hour=0.5)))
    text = table_text(priced)
    assert "this machine at the given US$0.5/h" in text and f"{0.5 / (rate * 3600) * 1e6:.4g}" in text
    tokens = rate / record.metrics.throughput_tokens_per_s
    assert f"{0.5 / (rate * 3600) * 1e6 * tokens:.4g} per 1M tokens" in text


@pytest.mark.slow
def test_run_refuses_a_catalog_kind_that_is_not_this_machine(tmp_path):
    out = tmp_path / "out"
    proc = corescale("run", *FAST, f"output_dir={out}", "cost.machine=c7i.48xlarge", "--no-progress")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "is not the measured machine" in proc.stderr and not out.exists()  # before any worker, nothing written
