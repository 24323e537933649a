"""The machine catalog's checks, the projection (copies on physical cores, the memory cap, SMT, ISA tiers), the
price of the measured machine and the ranking of catalog kinds under an SLO."""

import math

import pandas as pd
import pytest

from corescale.analysis import catalog, pricing, projection, ranking
from corescale.analysis.catalog import Machine
from corescale.errors import UserError

SPR = frozenset({"avx2", "avx_vnni", "avx512", "avx512_vnni", "avx512_bf16", "amx"})
ICELAKE = frozenset({"avx2", "avx512", "avx512_vnni"})


SPR_MODEL = "Intel(R) Xeon(R) Platinum 8488C"  # the packaged catalog's Sapphire Rapids


def kind(name="k", cores=48, smt=2, isa=SPR, arch="x86_64", bandwidth=None, price=4.0, cpu_model="Intel Xeon X",
         family="Sapphire Rapids"):
    return Machine(name, price, cores * smt, cores, cpu_model=cpu_model, smt=smt, isa=isa, arch=arch,
                   bandwidth_gbps=bandwidth, family=family, date="2025-06", source="test")


def measured(per_instance=10.0, cores=1, precision="int8", isa=SPR, bytes_per_sample=None, threads=1, p99=50.0,
             cpu_model=SPR_MODEL, instances=1, efficiency=None):
    return projection.LayoutRate(per_instance, cores, threads, precision, isa, catalog.arch_of(isa), bytes_per_sample,
                                 p99, 128.0, cpu_model, instances, efficiency)


# --- the catalog ---------------------------------------------------------------------------------------------------

def test_packaged_catalog_covers_todays_kinds_with_a_date_and_source_on_every_row():
    known = catalog.load_catalog()
    families = {m.family for m in known.values()}
    assert {"Ice Lake", "Sapphire Rapids", "Emerald Rapids", "Granite Rapids", "Genoa (Zen 4)", "Turin (Zen 5)",
            "Graviton3", "Graviton4", "Axion", "Cobalt 100"} <= families
    assert {m.cloud for m in known.values()} == {"aws", "gcp", "azure"}
    assert all(m.date and m.source and m.isa and m.arch for m in known.values())
    assert all(m.vcpus == m.physical_cores * m.smt for m in known.values())
    assert known["c7a.2xlarge"].smt == 1 and known["c7a.2xlarge"].physical_cores == 8  # no SMT on c7a
    assert known["c7i.2xlarge"].physical_cores == 4  # 8 vCPUs are 4 cores
    assert "amx" in known["c7i.2xlarge"].isa and "sve2" in known["c8g.2xlarge"].isa
    # 8 channels of DDR5-4800 on a 48-core socket, 4 cores' share at the triad's 80 %
    assert known["c7i.2xlarge"].bandwidth_gbps == pytest.approx(8 * 4800 * 8 / 1e3 * 4 / 48 * 0.8)
    assert known["c4a-standard-8"].bandwidth_gbps is None  # not known: no cap, and it says so


ROW = "  m: {price_per_hour: 1.0, vcpus: 8, physical_cores: 4, date: 2025-06, source: page, isa: [avx2]}\n"


@pytest.mark.parametrize("row, message", [
    ("  m: {price_per_hour: 0, vcpus: 8, physical_cores: 4, date: 2025-06, source: page}", "price_per_hour=0"),
    ("  m: {price_per_hour: .nan, vcpus: 8, physical_cores: 4, date: 2025-06, source: page}", "not a finite"),
    ("  m: {price_per_hour: .inf, vcpus: 8, physical_cores: 4, date: 2025-06, source: page}", "not a finite"),
    ("  m: {price_per_hour: -1, vcpus: 8, physical_cores: 4, date: 2025-06, source: page}", "price_per_hour=-1"),
    ("  m: {price_per_hour: 1, vcpus: 8, physical_cores: 2.5, date: 2025-06, source: page}", "physical_cores=2.5"),
    ("  m: {price_per_hour: 1, vcpus: 8, physical_cores: 4, date: 2025-06, source: page, isa: [avx1024]}",
     "unknown ISA name(s) avx1024"),
    ("  m: {price_per_hour: 1, vcpus: 8, physical_cores: 4, source: page}", "no date"),
    ("  m: {price_per_hour: 1, vcpus: 8, physical_cores: 4, date: 2025-06}", "no source"),
    ("  m: {price_per_hour: 1, vcpus: 8, physical_cores: 4, smt: 1, date: 2025-06, source: page}", "smt=1"),
    ("  m: {price_per_hour: 1, vcpus: 4, physical_cores: 8, date: 2025-06, source: page}", "more physical_cores"),
    ("  m: {price_per_hour: 1, vcpus: 8, physical_cores: 4, date: 2025-06, source: page, cpu: nope}",
     "names cpu 'nope'"),
    ("  m: {price_per_hour: 1, vcpus: 8, physical_cores: 4, date: 2025-06, source: page, colour: red}",
     "unknown field 'colour'"),
])
def test_a_bad_catalog_row_is_one_line_naming_the_row(tmp_path, row, message):
    path = tmp_path / "catalog.yaml"
    path.write_text("machines:\n" + ROW + row + "\n")
    with pytest.raises(UserError, match="machine 'm' in machine catalog") as error:
        catalog.load_catalog(path)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_row_with_several_problems_names_every_one():
    problems = catalog.row_problems({"price_per_hour": "cheap", "vcpus": 0, "physical_cores": 1.5, "isa": ["x"]})
    text = "; ".join(problems)
    for part in ("price_per_hour='cheap'", "vcpus=0", "physical_cores=1.5", "no date", "no source", "unknown ISA"):
        assert part in text


def test_a_user_catalog_reuses_cpu_facts_and_is_read_by_one_function():
    text = ("cpus:\n  x: {model: Intel Xeon 8488C, family: SPR, arch: x86_64, isa: [avx512, amx],"
            " memory: {channels: 8, mts: 4800, socket_cores: 48}}\nmachines:\n"
            "  a: {cpu: x, price_per_hour: 2.0, vcpus: 16, physical_cores: 8, date: 2026-01, source: invoice}\n")
    [machine] = catalog.parse_catalog(text, "test").values()
    assert (machine.family, machine.smt, machine.core_hour) == ("SPR", 2, 0.25)
    assert machine.bandwidth_gbps == pytest.approx(307.2 * 8 / 48 * 0.8)
    with pytest.raises(UserError, match="holds no machines"):
        catalog.parse_catalog("machines: {}", "test")


# --- the projection ------------------------------------------------------------------------------------------------

def test_copies_fill_the_physical_cores_not_the_vcpus():
    found = projection.project(measured(10.0, cores=2), kind(cores=48, smt=2))
    assert found.basis == "projected" and found.copies == 24 and not found.is_range
    assert found.low == found.high == pytest.approx(240.0)
    arm_like = projection.project(measured(10.0, cores=2, isa=SPR), kind(cores=8, smt=1))
    assert arm_like.copies == 4 and any("no SMT" in f for f in arm_like.flags)
    assert projection.project(measured(10.0, cores=16), kind(cores=8)).copies == 0  # does not fit, and says so


def test_a_layout_on_smt_siblings_is_refused_on_a_kind_without_smt():
    found = projection.project(measured(threads=2), kind(smt=1))
    assert found.basis == "refused" and "SMT" in found.reason


def test_memory_bandwidth_caps_the_projection_and_stretches_latency():
    # 100 samples/s per copy × 48 copies = 4800/s; 50 MB a sample → 240 GB/s wanted, the kind has 100 GB/s
    found = projection.project(measured(100.0, bytes_per_sample=50e6, p99=10.0), kind(cores=48, bandwidth=100.0))
    assert found.high == found.low == pytest.approx(100e9 / 50e6)  # 2000 samples/s
    assert any("memory-bound" in f for f in found.flags)
    assert found.p99_high_ms == pytest.approx(10.0 * 4800 / 2000)
    roomy = projection.project(measured(100.0, bytes_per_sample=50e6), kind(cores=48, bandwidth=1000.0))
    assert roomy.low == pytest.approx(4800.0) and not any("memory-bound" in f for f in roomy.flags)


def test_a_kind_without_the_measured_isa_tier_gets_a_range_never_one_number():
    # int8 measured with AMX, projected to Ice Lake (VNNI only): anything from 1/8 to the same rate
    found = projection.project(measured(10.0, precision="int8", isa=SPR), kind(cores=4, isa=ICELAKE))
    assert found.is_range and found.low == pytest.approx(40.0 / 8) and found.high == pytest.approx(40.0)
    assert any("ISA differs" in f and "amx" in f and "avx512_vnni" in f for f in found.flags)
    assert found.p99_high_ms == pytest.approx(50.0 * 8)
    # fp32 uses AVX-512 on both: one number
    same = projection.project(measured(10.0, precision="fp32", isa=SPR), kind(cores=4, isa=ICELAKE))
    assert not same.is_range and not any("ISA" in f for f in same.flags)
    # measured without VNNI (AVX2 only): VNNI there may be faster, never slower
    faster = projection.project(measured(10.0, precision="int8", isa=frozenset({"avx2"})), kind(cores=4, isa=ICELAKE))
    assert faster.low == pytest.approx(40.0) and faster.high == pytest.approx(40.0 * 6)


def test_what_the_model_cannot_know_is_a_range_with_its_reason():
    # Intel AVX-512 (Sapphire Rapids, fp32) onto Zen 4, Arm and another Intel generation: ×0.5–×1, never one number
    zen4 = kind(cores=4, smt=1, isa=frozenset({"avx2", "avx512", "avx512_vnni", "avx512_bf16"}),
                cpu_model="AMD EPYC 9R14", family="Genoa (Zen 4)")
    arm = kind(cores=4, smt=1, isa=frozenset({"neon", "sve", "i8mm", "bf16"}), arch="aarch64",
               cpu_model="AWS Graviton3 (Neoverse V1)", family="Graviton3")
    ice = kind(cores=4, isa=ICELAKE, family="Ice Lake")
    for other, words in ((zen4, "another vendor"), (arm, "another architecture"), (ice, "another microarchitecture")):
        found = projection.project(measured(10.0, precision="fp32"), other)
        assert found.basis == "projected" and found.is_range, other.family
        assert found.low == pytest.approx(40.0 * 0.5) and found.high == pytest.approx(40.0), other.family
        assert any(words in f and "×0.5–×1" in f for f in found.flags), found.flags
    # a CPU the catalog does not know: its microarchitecture is not known either
    unknown = projection.project(measured(10.0, precision="fp32", cpu_model="Intel Xeon Processor"), kind(cores=4))
    assert unknown.is_range and any("not in the catalog" in f for f in unknown.flags)
    # ... unless the kind is that very CPU (benchmarks/projection.py describes the machine it measures)
    itself = projection.project(measured(10.0, precision="fp32", cpu_model="Intel Xeon Processor"),
                                kind(cores=4, cpu_model="Intel Xeon Processor"))
    assert not itself.is_range and itself.high == pytest.approx(40.0)
    # the same microarchitecture: one number
    assert not projection.project(measured(10.0, precision="fp32"), kind(cores=4)).is_range


def test_a_large_multiplication_is_flagged_and_capped_by_the_measured_scaling():
    small = projection.project(measured(10.0, cores=1, instances=2), kind(cores=8))
    assert not any("extrapolated" in f for f in small.flags)  # ×4 of what was measured
    found = projection.project(measured(10.0, cores=1, instances=2), kind(cores=96))
    assert any("extrapolated ×48" in f and "not measured" in f for f in found.flags)
    assert found.low == found.high == pytest.approx(960.0)
    capped = projection.project(measured(10.0, cores=1, instances=2, efficiency=0.8), kind(cores=96))
    assert capped.low == pytest.approx(960.0 * 0.8) and capped.high == pytest.approx(960.0)
    assert any("scaling efficiency 0.8" in f for f in capped.flags)


def test_an_unknown_isa_is_refused():
    assert projection.project(measured(isa=frozenset()), kind()).basis == "refused"
    assert projection.project(measured(), kind(isa=frozenset(), arch="")).basis == "refused"


def test_the_environment_flags_become_catalog_isa_names():
    flags = {"avx2": True, "avx512f": True, "avx512_vnni": True, "amx_tile": True, "amx_int8": True, "fma": True,
             "avx512_bf16": False}
    assert catalog.catalog_isa(flags) == {"avx2", "avx512", "avx512_vnni", "amx"}
    assert catalog.arch_of(frozenset({"neon", "sve"})) == "aarch64"


# --- the measured machine's price, and the ranking -----------------------------------------------------------------

def rows(**columns):
    base = {"status": "ok", "valid": True, "model": "bert-base", "backend": "onnxruntime", "batch_size": 1,
            "instance_batch_size": 1, "sequence_length": 128, "use_logical_cores": False, "contaminated": False,
            "run": "r", "host_physical_cores": 2, "host_logical_cpus": 2, "cpu_model": SPR_MODEL,
            "cpu_isa": " ".join(sorted(SPR)), "precision": "int8", "roofline_bytes_per_call": None}
    n = len(next(iter(columns.values())))
    return pd.DataFrame([{**base, **{k: v[i] for k, v in columns.items()}} for i in range(n)])


FRAME = rows(instances=[2, 1], cpus_per_instance=[1, 2], cpus_total=[2, 2], throughput_samples_per_s=[20.0, 12.0],
             throughput_tokens_per_s=[2560.0, 1536.0], latency_p99_ms=[150.0, 90.0])


def test_the_measured_machine_is_priced_from_the_first_source_that_applies():
    known = catalog.load_catalog()
    row = FRAME.iloc[0].to_dict()
    given = pricing.price_here(row, known, given=0.5)
    assert (given.kind, given.per_hour) == ("given", 0.5)
    rate = pricing.price_here(row, known)  # no kind has this generic model name: the nearest kind's core-hour
    assert rate.kind == "core-hour rate" and "2 physical core(s)" in rate.source
    nearest = pricing.nearest_rate(known, SPR, row["cpu_model"])
    assert "amx" in nearest.isa and rate.per_hour == pytest.approx(2 * nearest.core_hour)
    assert nearest.name in rate.source and nearest.date in rate.source
    inferences, tokens = rate.per_million(20.0, 128.0)
    assert inferences == pytest.approx(rate.per_hour / (20 * 3600) * 1e6) and tokens == pytest.approx(inferences / 128)
    matched = pricing.price_here({**row, "cpu_model": "Intel Xeon Platinum 8488C", "host_physical_cores": 4}, known)
    assert matched.kind == "catalog kind" and "c7i.2xlarge" in matched.source and "matched" in matched.source
    with pytest.raises(UserError, match="is not the measured machine"):  # a price that is not this CPU's
        pricing.price_here(row, known, kind_name="c7i.2xlarge")


def test_ranking_under_an_slo_picks_each_kinds_cheapest_layout_that_meets_it():
    known = catalog.load_catalog()
    table = ranking.rank(FRAME, known, slo_p99_ms=100.0)
    top = table.iloc[0]
    assert top["rank"] == 1 and top["layout"].startswith("1 × 2 cores")  # the 2 × 1 layout misses 100 ms
    amx = table[table["machine"] == "c7i.48xlarge"].iloc[0]
    assert amx["basis"] == "projected" and amx["copies"] == 48 and amx["cost_per_1m_tokens_usd"] > 0
    arm = table[table["machine"] == "c8g.2xlarge"].iloc[0]  # another architecture: ×0.5, p99 up to 180 ms
    assert math.isnan(arm["rank"]) and "no layout meets" in arm["reason"]
    vnni = table[table["machine"] == "c6i.2xlarge"].iloc[0]  # no AMX: int8 p99 up to 8 × 90 ms: misses the SLO
    assert math.isnan(vnni["rank"]) and "no layout meets" in vnni["reason"]
    costs = table["cost_per_1m_usd"].dropna().tolist()
    assert costs == sorted(costs)
    loose = ranking.rank(FRAME, known, slo_p99_ms=None)
    ice = loose[loose["machine"] == "c6i.2xlarge"].iloc[0]
    assert ice["cost_per_1m_low_usd"] < ice["cost_per_1m_usd"]  # a range, ranked by its expensive end
    here = ranking.this_machine(FRAME, lambda row: pricing.price_here(row, known, given=0.36), 100.0)
    assert here["layout"].startswith("1 × 2 cores") and here["cost_per_1m_usd"] == pytest.approx(0.36 / 12 / 3600 * 1e6)
    lines = ranking.summary(table, here, 100.0)
    assert lines[0].startswith("this machine, measured") and lines[1].startswith("cheapest under p99 <= 100 ms")


def test_each_workload_is_ranked_on_its_own():
    mixed = pd.concat([FRAME, rows(instances=[1], cpus_per_instance=[2], cpus_total=[2], model=["bert-tiny"],
                                   throughput_samples_per_s=[900.0], throughput_tokens_per_s=[115200.0],
                                   latency_p99_ms=[3.0])], ignore_index=True)
    groups = ranking.workloads(mixed)
    assert [name for name, _ in groups] == ["bert-base, sequence 128", "bert-tiny, sequence 128"]
    assert set(groups[0][1]["model"]) == {"bert-base"}  # bert-tiny's cheap inferences never price bert-base
