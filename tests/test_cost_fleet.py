"""`corescale cost ROOT --target-qps N --slo-p99-ms S`: the fleet plan per catalog kind, from the results folder the
cost tests use (tests/data/schema2: a LoadGen server search, 416 QPS at p99 28 ms under a 50 ms SLO, and two
offline results). In process: no worker, no other process."""

import io
import math
from pathlib import Path

import pandas as pd
import pytest

from corescale.analysis import fleet
from corescale.analysis.catalog import load_catalog
from corescale.cli import main

SCHEMA2 = Path(__file__).parent / "data" / "schema2"
TARGET, SLO = 5000.0, 60.0


def plan_csv(capsys, *more: str) -> tuple[pd.DataFrame, str, int]:
    code = main(["cost", str(SCHEMA2), "--target-qps", str(TARGET), "--slo-p99-ms", str(SLO), "--csv", "-", *more])
    out = capsys.readouterr()
    return pd.read_csv(io.StringIO(out.out)), out.err, code


ONE_KIND = ("--machine", "c7g.2xlarge")  # one kind: a plan in a fraction of the catalog's time


@pytest.mark.parametrize("utilisation", [None, 0.5])
def test_each_kind_gets_the_machines_that_carry_the_load_and_their_cost(capsys, utilisation):
    more = [] if utilisation is None else ["--utilisation", str(utilisation), *ONE_KIND]
    table, said, code = plan_csv(capsys, *more)
    share = fleet.UTILISATION if utilisation is None else utilisation
    assert code == 0
    planned = table[table["machines"].notna()]
    assert len(planned) >= (3 if utilisation is None else 1) and set(planned["basis"]) <= {"measured", "projected"}
    offered = {name for name, kind in load_catalog().items() if not kind.history}
    assert set(table["machine"]) == (offered if utilisation is None else {ONE_KIND[1]})  # past quotes left out
    for _, row in planned.iterrows():
        slow, fast = row["machine_samples_per_s"], row["machine_samples_per_s_high"]
        assert row["machines"] == math.ceil(TARGET / (slow * share) - 1e-9)  # the slow end: what it can promise
        assert row["machines_low"] == math.ceil(TARGET / (fast * share) - 1e-9) <= row["machines"]
        assert row["machines"] * slow * share >= TARGET > (row["machines"] - 1) * slow * share
        assert row["cost_per_hour_usd"] == pytest.approx(row["machines"] * row["price_per_hour"])
        assert row["cost_per_month_usd"] == pytest.approx(row["cost_per_hour_usd"] * fleet.HOURS_PER_MONTH)
        assert row["latency_p99_ms"] <= SLO
    assert list(planned["cost_per_hour_usd"]) == sorted(planned["cost_per_hour_usd"])  # cheapest first
    assert table["machines"].notna().iloc[:len(planned)].all()  # then the kinds without a fleet, with why
    assert all("no layout meets" in str(r) or "refused" in str(r) or r for r in table[table["machines"].isna()]
               ["reason"])
    assert f"{share:.0%} of the rate it sustains under the SLO" in said and "730 hours a month" in said
    assert "cheapest fleet for 5000 inferences/s under p99 <= 60 ms" in said


def test_a_tighter_load_needs_proportionally_more_machines(capsys):
    table, _, _ = plan_csv(capsys, *ONE_KIND)
    row = table[table["machines"].notna()].iloc[0]
    doubled = fleet.machines_for(2 * TARGET, row["machine_samples_per_s"], fleet.UTILISATION)
    assert row["machines"] <= doubled <= 2 * row["machines"]


def test_no_kind_meets_the_slo_is_said_and_exit_1(capsys):
    code = main(["cost", str(SCHEMA2), "--target-qps", "100", "--slo-p99-ms", "0.01", *ONE_KIND])
    out = capsys.readouterr()
    assert code == 1 and "no fleet to plan" in out.out


def test_one_kind_with_machine(capsys):
    table, _, code = plan_csv(capsys, "--machine", "c7g.2xlarge")
    assert code == 0 and list(table["machine"]) == ["c7g.2xlarge"]


@pytest.mark.parametrize("more, words", [
    (["--target-qps", "nan", "--slo-p99-ms", "50"], "expected a finite number"),
    (["--target-qps", "inf", "--slo-p99-ms", "50"], "expected a finite number"),
    (["--target-qps", "-5", "--slo-p99-ms", "50"], "must be > 0"),
    (["--target-qps", "0", "--slo-p99-ms", "50"], "must be > 0"),
    (["--target-qps", "many", "--slo-p99-ms", "50"], "expected a number"),
    (["--target-qps", "100"], "--target-qps needs --slo-p99-ms"),
    (["--target-qps", "100", "--slo-p99-ms", "nan"], "expected a finite number"),
    (["--target-qps", "100", "--slo-p99-ms", "60", "--utilisation", "1.5"], "at most 1"),
    (["--target-qps", "100", "--slo-p99-ms", "60", "--utilisation", "0"], "must be > 0"),
    (["--utilisation", "0.5", "--slo-p99-ms", "60"], "--utilisation goes with --target-qps"),
    (["--target-qps", "1e30", "--slo-p99-ms", "60", *ONE_KIND], "more than 1,000,000 machines"),
    (["--target-qps", "100", "--slo-p99-ms", "60", "--price-per-hour", "1"], "leave out --price-per-hour"),
    (["--target-qps", "100", "--slo-p99-ms", "60", "--machine", "no-such-kind"], "no-such-kind"),
])
def test_bad_numbers_are_one_line_exit_2_and_nothing_written(tmp_path, capsys, more, words):
    csv = tmp_path / "fleet.csv"
    assert main(["cost", str(SCHEMA2), *more, "--csv", str(csv)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("corescale: error: ") and words in err[0], err
    assert list(tmp_path.iterdir()) == []
