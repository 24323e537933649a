"""`corescale cost` says what it cannot know (issue 34 item 4, audit M8 and L10): an Intel measurement projected onto
AMD and Arm kinds is a range with its reason, a large multiplication is flagged, a contaminated input is marked,
the 2021 study's prices are history (never ranked), every price has its date and age, the small ÷ large line is
not offered as a finding when both are projections. In process: the command's table comes from a results frame."""

import io
import math
from types import SimpleNamespace

import pandas as pd
import pytest

from corescale.analysis import catalog, cost, ranking
from corescale.cli import main
from corescale.commands import cost as cost_command

INTEL = "Intel(R) Xeon(R) Platinum 8488C"  # Sapphire Rapids, in the packaged catalog


def intel_frame(contaminated: bool = True) -> pd.DataFrame:
    """2 × 1 core fp32 on a 2-core Sapphire Rapids guest, its window under foreign load."""
    return pd.DataFrame([{
        "status": "ok", "valid": True, "model": "bert-base", "backend": "onnxruntime", "batch_size": 1,
        "instance_batch_size": 1, "sequence_length": 128, "use_logical_cores": False, "run": "r", "repeat": 0,
        "host_physical_cores": 2, "host_logical_cpus": 2, "cpu_model": INTEL, "precision": "fp32",
        "cpu_isa": "amx avx2 avx512 avx512_bf16 avx512_vnni avx_vnni", "roofline_bytes_per_call": None,
        "instances": 2, "cpus_per_instance": 1, "cpus_total": 2, "throughput_samples_per_s": 40.0,
        "throughput_tokens_per_s": 40.0 * 100, "latency_p99_ms": 60.0, "contaminated": contaminated,
        "foreign_load": 0.3 if contaminated else 0.0, "steal_fraction": 0.05, "sentinel_moved": False,
        "sentinel_low": 1.0, "sentinel_high": 1.1}])


@pytest.fixture
def ranked_csv(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cost_command, "load_table", lambda root, args: SimpleNamespace(frame=intel_frame()))
    assert main(["cost", str(tmp_path), "--csv", "-"]) == 0
    out = capsys.readouterr()
    return pd.read_csv(io.StringIO(out.out)).set_index("machine"), out.err


def test_an_intel_measurement_is_a_range_on_amd_and_arm_kinds_with_the_reason(ranked_csv):
    table, _ = ranked_csv
    for machine, reason in (("c7a.2xlarge", "another vendor"), ("c8a.2xlarge", "another vendor"),
                            ("c8g.2xlarge", "another architecture"), ("c7g.2xlarge", "another architecture"),
                            ("c4a-standard-8", "another architecture")):
        row = table.loc[machine]
        assert row["basis"] == "projected", machine
        low, high = row["machine_samples_per_s"], row["machine_samples_per_s_high"]
        assert high == pytest.approx(2 * low), machine  # at least ×0.5–×1 of the measured per-core rate
        assert reason in row["flags"] and "×0.5–×1" in row["flags"], machine
    same = table.loc["c7i.2xlarge"]  # the measured microarchitecture: one number
    assert same["machine_samples_per_s"] == pytest.approx(same["machine_samples_per_s_high"])


def test_a_multiplication_of_eight_or_more_is_flagged(ranked_csv):
    table, _ = ranked_csv
    assert "extrapolated ×48" in table.loc["c7i.48xlarge", "flags"]  # 96 copies from 2 measured instances
    assert "extrapolated" not in table.loc["c7i.2xlarge", "flags"]  # 4 copies from 2


def test_a_contaminated_input_is_marked_on_every_row_it_prices(ranked_csv):
    table, err = ranked_csv
    priced = table[table["cost_per_1m_usd"].notna()]
    assert len(priced) > 10
    assert priced["caution"].str.contains("contaminated \\(30% foreign load\\)").all()
    assert priced["caution"].str.contains("5% stolen").all()
    assert "its input is contaminated" in err


def test_study_prices_are_history_never_ranked_and_every_price_has_its_date(ranked_csv):
    table, err = ranked_csv
    for study in ("study-8-cores", "study-48-cores"):
        assert table.loc[study, "basis"] == "history" and math.isnan(table.loc[study, "rank"])
        assert "2021-04" in table.loc[study, "reason"] and "not on sale" in table.loc[study, "reason"]
    assert table["price_date"].notna().all() and table["price_age"].str.endswith("old").all()
    assert "price of 2025-06" in err and "months old at most" in err


def test_the_size_line_is_not_a_finding_when_both_kinds_are_projections():
    table = ranking.rank(intel_frame(False), catalog.load_catalog(), None)
    [line] = ranking.size_lines(table[table["rank"].notna()])
    assert "both are projections" in line and "core-hour prices" in line and "= 1.00x" not in line


def test_projections_are_shown_to_two_significant_digits():
    assert cost.money_range(0.123456, None, projected=True) == "$0.12"
    assert cost.money_range(0.123456) == "$0.1235"
    assert cost.two_digits(1234.5) == "1200" and cost.two_digits(3.456) == "3.5"
    assert catalog.price_age("2025-06", __import__("datetime").date(2026, 12, 3)) == "18 months old"
