"""The machine's real peak: every library measured in a pinned process, cached per machine + software, never a
"% of peak" above 100."""

import json

import pytest
from helpers import FAST, corescale

from corescale.machine import peak
from corescale.machine.environment import CpuInfo
from corescale.machine.placement import InstancePlacement, InstanceSpec
from corescale.measure.aggregate import percent_of_peak
from corescale.measure.calibrate import disturbed, store


def spec(cpus, threads):
    return InstanceSpec(InstancePlacement(0, tuple(cpus), (), len(cpus)), threads, 1)


def test_peak_precision_follows_the_isa():
    assert peak.peak_precision("fp32", {}) == "fp32"
    assert peak.peak_precision("bf16", {"avx512_bf16": False, "amx_bf16": False}) == "fp32"
    assert peak.peak_precision("bf16", {"amx_bf16": True}) == "bf16"
    assert peak.peak_precision("int8", {"avx_vnni": True}) == "int8"
    assert peak.peak_precision("int8", {"avx2": True}) == "fp32"


def test_measure_reports_every_library_and_the_best():
    entry = peak.gemm_peak(1, "fp32", ("torch_mm", "numpy"), min_seconds=0.05)
    assert set(entry["libraries"]) == {"torch_mm", "numpy"} and not entry["errors"]
    assert entry["library"] == max(entry["libraries"], key=entry["libraries"].get)
    assert entry["gflops"] == max(entry["libraries"].values()) > 0
    assert entry["detail"]["numpy"][0]["internal_api"]  # which BLAS numpy runs (threadpoolctl)


def test_a_library_that_cannot_run_is_reported_not_fatal(monkeypatch):
    def broken(n, threads, precision):
        raise RuntimeError("no such kernel here")

    monkeypatch.setitem(peak.MEASURES, "numpy", broken)
    entry = peak.gemm_peak(1, "fp32", ("torch_mm", "numpy"), min_seconds=0.05)
    assert entry["library"] == "torch_mm" and "no such kernel here" in entry["errors"]["numpy"]


def test_cache_is_per_cpus_threads_precision_and_fingerprint(tmp_path):
    cache = peak.PeakCache(tmp_path, machine="m1")
    entry = {"precision": "fp32", "gflops": 100.0, "library": "numpy", "method_version": peak.METHOD_VERSION}
    store(cache, spec((0, 1), 2), entry)
    assert cache.get((1, 0), 2, "fp32")["gflops"] == 100.0
    assert cache.get((0, 1), 1, "fp32") is None and cache.get((0, 1), 2, "bf16") is None
    assert peak.PeakCache(tmp_path, machine="m2").get((0, 1), 2, "fp32") is None  # another machine/software
    store(cache, spec((3,), 1), {"precision": "fp32", "gflops": None})  # a failed calibration is never cached
    assert cache.get((3,), 1, "fp32") is None
    stale = cache.path((0, 1), 2, "fp32")
    stale.write_text(json.dumps({**entry, "method_version": -1}))
    assert cache.get((0, 1), 2, "fp32") is None  # measured another way: measured again


def test_fingerprint_changes_with_the_machine():
    a = peak.fingerprint(CpuInfo(model="EPYC", isa={"avx2": True}), {"logical_cpus": 2})
    assert a == peak.fingerprint(CpuInfo(model="EPYC", isa={"avx2": True}), {"logical_cpus": 2})
    assert a != peak.fingerprint(CpuInfo(model="EPYC", isa={"avx512f": True}), {"logical_cpus": 2})
    assert a != peak.fingerprint(CpuInfo(model="EPYC", isa={"avx2": True}), {"logical_cpus": 96})


def test_percent_of_peak_is_never_above_100():
    assert percent_of_peak(50.0, [{"gflops": 100.0}]) == (100.0, 50.0, None)
    assert percent_of_peak(101.0, [{"gflops": 100.0}])[1] == 100.0  # calibration noise: capped
    total, percent, problem = percent_of_peak(207.0, [{"gflops": 50.0}, {"gflops": 50.0}])
    assert total == 100.0 and percent is None and "exceeds the measured GEMM peak" in problem
    assert percent_of_peak(10.0, [{"gflops": 50.0}, None]) == (None, None, None)  # one instance unknown


def test_analytic_peak_needs_a_clock():
    assert peak.analytic_gflops(CpuInfo(isa={"avx2": True}), 2) is None
    analytic = peak.analytic_gflops(CpuInfo(isa={"avx512f": True}, mhz=2000.0), 2)
    assert analytic["per_core"] == pytest.approx(2 * 16 * 2 * 2.0) and analytic["gflops"] == 2 * analytic["per_core"]


@pytest.mark.slow
def test_run_records_the_peak_and_reuses_it(tmp_path):
    cache = tmp_path / "cache"
    args = ["run", *[o for o in FAST if o != "calibrate=false"], f"cache_dir={cache}"]
    first = corescale(*args, f"output_dir={tmp_path / 'a'}", "--no-progress")
    assert first.returncode == 0, first.stderr
    (run,) = (tmp_path / "a").iterdir()
    record = json.loads((run / "result.json").read_text())
    m = record["metrics"]
    assert m["peak_gflops"] > 0 and m["peak_library"] in peak.LIBRARIES and m["peak_precision"] == "fp32"
    assert 0 < m["percent_of_peak"] <= 100 and m["peak_problem"] is None
    spec_peak = record["specs"][0]["peak"]
    assert spec_peak["cached"] is False and set(spec_peak["libraries"]) >= {"torch_mm", "numpy"}
    assert "GEMM peak" in first.stdout
    assert corescale(*args, f"output_dir={tmp_path / 'b'}", "--no-progress").returncode == 0
    (run,) = (tmp_path / "b").iterdir()
    again = json.loads((run / "result.json").read_text())
    # reused, unless other processes used its CPUs while it was measured (a busy machine): then measured again
    assert again["specs"][0]["peak"]["cached"] is (disturbed(spec_peak) is None)
    assert (again["metrics"]["peak_gflops"] == m["peak_gflops"]) is (disturbed(spec_peak) is None)
    # the memory roof is measured beside the peak, cached with it, and places the run on the roofline
    assert spec_peak["bandwidth"]["cached"] is False
    assert again["specs"][0]["peak"]["bandwidth"]["cached"] is (disturbed(spec_peak["bandwidth"]) is None)
    roof = m["roofline"]
    assert roof["bandwidth_gbps"] == spec_peak["bandwidth"]["gbps"] and roof["peak_gflops"] == m["peak_gflops"]
    assert roof["bound"] in ("compute", "memory") and roof["attainable_gflops"] <= m["peak_gflops"]
    assert roof["fraction_of_attainable"] == pytest.approx(m["gflops_per_s"] / roof["attainable_gflops"])
    assert "roofline" in first.stdout


@pytest.mark.slow
def test_info_peak_shows_every_library(tmp_path):
    proc = corescale("info", "--peak", "--libraries", "torch_mm,numpy", "--precisions", "fp32", "--cache-dir",
                     str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["peak"]
    assert {row["precision"] for row in rows} == {"fp32"}
    assert {row["threads"] for row in rows} >= {1} and all(set(row["libraries"]) == {"torch_mm", "numpy"}
                                                           for row in rows)
    assert all(row["bandwidth"]["gbps"] > 0 and row["bandwidth"]["library"] == "torch_triad" for row in rows)


@pytest.mark.parametrize("args, message", [
    (["info", "--peak", "--libraries", "cublas"], "unknown peak library cublas; allowed: torch_mm"),
    (["info", "--libraries", "numpy"], "--libraries needs --peak"),
    (["info", "--precisions", "fp32"], "--precisions needs --peak"),
    (["info", "--peak", "--precisions", "fp64"], "--precisions 'fp64': this CPU's GEMM peaks are measured in fp32"),
])
@pytest.mark.slow
def test_bad_peak_requests_are_one_line(args, message):
    proc = corescale(*args)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("corescale: error: ")
    assert message in lines[0]


@pytest.mark.parametrize("foreign, cached", [(None, True), (0.0, True), (0.08, True), (0.11, False), (0.9, False),
                                             ("0.9", True)])
def test_a_peak_measured_while_other_processes_used_its_cpus_is_not_cached(tmp_path, foreign, cached):
    """What another trial or a foreign load left of the CPUs is not the machine's peak: used by the run that
    measured it, never handed to later runs by the cache."""
    cache = peak.PeakCache(tmp_path)
    spec = InstanceSpec(InstancePlacement(0, (0,), (), 1), 1, 1)
    entry = {"precision": "fp32", "gflops": 50.0, "library": "numpy", "method_version": peak.METHOD_VERSION,
             **({} if foreign is None else {"foreign_load": foreign})}
    store(cache, spec, entry)
    assert (cache.get((0,), 1, "fp32") is not None) == cached
    assert (disturbed(entry) is None) == cached
    if not cached:
        assert f"{foreign:.0%} of its CPUs" in disturbed(entry)


@pytest.mark.slow
def test_the_foreign_load_of_a_calibration_is_measured(tmp_path):
    """A busy process on the calibration's one CPU: measured_alone sees it take a large share."""
    import os
    import subprocess
    import sys
    import time

    from corescale.measure.calibrate import measured_alone

    cpu = sorted(os.sched_getaffinity(0))[0]
    before = os.sched_getaffinity(0)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    os.sched_setaffinity(0, {cpu})
    try:
        time.sleep(0.3)
        entry = measured_alone(lambda: (time.sleep(1.0), {"gflops": 1.0})[1])  # idle itself: the CPU was theirs
    finally:
        os.sched_setaffinity(0, before)
        busy.kill()
        busy.wait()
    assert entry["gflops"] == 1.0 and entry["foreign_load"] > 0.5


@pytest.mark.parametrize("name, changes", [("MKL_ENABLE_INSTRUCTIONS", True), ("LD_PRELOAD", True),
                                           ("OMP_WAIT_POLICY", True), ("OMP_NUM_THREADS", False)])
def test_the_peak_cache_is_per_inherited_environment_too(monkeypatch, name, changes):
    """A calibration runs under the inherited environment: a variable that changes its GEMMs (MKL's ISA, a
    preloaded library) gives another cache; what every instance sets for itself does not."""
    monkeypatch.delenv(name, raising=False)
    before = peak.host_fingerprint()
    monkeypatch.setenv(name, "AVX2")
    assert (peak.host_fingerprint() != before) is changes
