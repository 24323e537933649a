"""A precision from outside the package (tests/toy_precision: fp16, with facts of its own) registered with one
line: the config accepts it on the toy backend that computes in it, and every stage reads its entry (the tuner
offers it only where its CPU facts say, tries it first by its rank and gates it on drift; the drift check applies
its tolerance; a bundle requires its CPU features; the peak, the memory traffic, the projection and the roofline
use its facts). Each assertion would fail on a stage that kept its own table of precisions. An incomplete or
malformed entry is refused at registration."""

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import LOOP, TOY_ENV, corescale

from corescale.errors import RegistrationError, UserError
from corescale.machine.precisions import PRECISIONS, REFERENCE, Precision, register_precision
from corescale.overrides import compose
from corescale.tune import space as spaces

FP16_CPU = {"avx2": True, "fma": True, "avx512f": True, "avx512_fp16": True}  # a CPU computing fp16 natively
AVX2_CPU = {"avx2": True, "fma": True}


def test_the_config_takes_it_on_a_backend_that_computes_in_it(toy):
    assert compose(["backend=toy", "precision=fp16"]).precision == "fp16"
    with pytest.raises(UserError, match="backend=pytorch does not compute in precision=fp16; allowed precisions: "
                                        "fp32, bf16, int8"):
        compose(["backend=pytorch", "precision=fp16"])


def test_unregistered_it_is_unknown():
    with pytest.raises(UserError, match="precision"):
        compose(["backend=pytorch", "precision=fp16"])


def test_the_tuner_offers_it_only_where_its_cpu_facts_say(toy):
    def space(isa):
        return spaces.derive(compose([]), [], {"backend": ["toy"]}, 2, isa, latency=False)

    without = space(AVX2_CPU)
    assert without.precisions["toy"] == ["fp32"]
    assert "precision fp16: this CPU has none of its instructions (x86_64: AVX512_FP16/AMX_FP16; aarch64: " \
           "ASIMDHP)" in without.notes
    assert space(FP16_CPU).precisions["toy"] == ["fp32", "fp16"]
    assert space({"asimd": True, "asimdhp": True}).precisions["toy"] == ["fp32", "fp16"]  # aarch64


def test_the_first_trials_take_it_by_its_rank(toy):
    space = spaces.derive(compose([]), [], {"backend": ["toy"]}, 2, FP16_CPU, latency=False)
    assert spaces.starting_points(space, latency=False)[0]["precision[toy]"] == "fp16"  # rank 1, fp32's is 2
    slower = dataclasses.replace(toy_fp16(), rank=PRECISIONS[REFERENCE].rank + 1)
    PRECISIONS["fp16"] = slower
    assert spaces.starting_points(space, latency=False)[0]["precision[toy]"] == "fp32"


def toy_fp16() -> Precision:
    from toy_precision import FP16

    return FP16


def test_the_tune_gates_it_on_drift_and_a_managed_service_leaves_it_out(toy, tmp_path):
    from corescale.tune.plan import Tune, served_precisions

    space = spaces.derive(compose([]), [], {"backend": ["toy"]}, 2, FP16_CPU, latency=False)
    tune = Tune(SimpleNamespace(max_drift=None), compose([]), space, tmp_path, 2, 1.0, base=["model=bert-tiny"],
                task="encode", reference="toy")
    assert "reference=toy" in tune.trial_overrides(["backend=toy", "precision=fp16"], 1.0)
    assert "reference=toy" not in tune.trial_overrides(["backend=toy", "precision=fp32"], 1.0)
    served_precisions(space)
    assert space.precisions["toy"] == ["fp32"]
    assert "fp16" in space.notes[-1].split(":")[0] and "not with endpoint=managed" in space.notes[-1]


def test_the_drift_check_applies_its_tolerance_and_cosine(fp16):
    from corescale.measure.drift import drift_metrics

    reference = np.random.default_rng(0).normal(size=(2, 8, 16)).astype(np.float32)
    close = drift_metrics(reference + 0.01, reference, "fp16")
    assert close["tolerance"] == fp16.drift_tolerance == 3e-2 and close["min_cosine"] == 0.9995
    assert close["within_tolerance"] and not drift_metrics(reference + 0.05, reference, "fp16")["within_tolerance"]


def test_a_bundle_requires_its_cpu_features(toy, tmp_path):
    from corescale.record.trial import TrialRecord
    from corescale.serve import bundle

    record = TrialRecord.from_json(json.loads(next((Path(__file__).parent / "data" / "schema2")
                                                   .glob("*pytorch*/result.json")).read_text()))
    cpu = dataclasses.replace(record.environment.cpu, isa={**FP16_CPU, "avx512_bf16": True, "amx_int8": False})
    measured = dataclasses.replace(record, config=compose(["model=bert-tiny", "backend=toy", "precision=fp16"]),
                                   environment=dataclasses.replace(record.environment, cpu=cpu))
    manifest = json.loads((bundle.write(tmp_path / "bundle", measured) / bundle.MANIFEST).read_text())
    assert manifest["precision"] == "fp16"
    assert manifest["requires"]["cpu_features"] == ["avx2", "fma", "avx512f", "avx512_fp16"]


def test_the_machine_reads_its_cpu_flags_and_measures_its_peak_where_they_are(fp16):
    from corescale.machine.environment import cpuinfo
    from corescale.machine.peak import peak_precision

    assert {"avx512_fp16", "amx_fp16", "asimdhp"} <= set(cpuinfo().isa)  # recorded with every result
    assert peak_precision("fp16", FP16_CPU) == "fp16" and peak_precision("fp16", AVX2_CPU) == REFERENCE


def test_its_peak_gemm_computes_in_its_type(fp16):
    torch = pytest.importorskip("torch")
    from corescale.machine.peak import _torch_operands

    assert _torch_operands(4, "fp16")[0].dtype == torch.float16


def test_memory_traffic_projection_and_roofline_read_its_entry(fp16):
    from corescale.analysis.projection import tier
    from corescale.report.roofline import marker, run_label
    from corescale.workload.memory import encoder_parameter_count, traffic_bytes
    from corescale.workload.models import resolve_model

    spec = resolve_model("bert-tiny")
    assert traffic_bytes(spec, 1, 32, REFERENCE) - traffic_bytes(spec, 1, 32, "fp16") == \
        2 * encoder_parameter_count(spec)  # 2 bytes a weight, not fp32's 4
    assert tier(frozenset({"amx", "avx512"}), "x86_64", "fp16") == ("amx", 4.0)  # its tiers, not fp32's ladder
    assert tier(frozenset({"neon"}), "aarch64", "fp16") == ("neon", 1.0)
    assert marker("fp16") not in {marker(p) for p in PRECISIONS if p != "fp16"}
    assert run_label({"backend": "toy", "precision": "fp16", "instance_batch_size": 1, "sequence_length": 8}) \
        == "toy fp16 bs1 s8"


def test_an_incomplete_entry_is_refused_at_registration():
    with pytest.raises(RegistrationError, match="precision 'fp8' is incomplete: computes missing, requires missing"):
        register_precision("fp8", Precision(bytes=1))
    assert "fp8" not in PRECISIONS


@pytest.mark.parametrize("change, message", [
    ({"bytes": 0}, "bytes is not a number > 0"),
    ({"computes": {"riscv": ("v",)}}, "computes is not a mapping of x86_64 or aarch64"),
    ({"requires": {"x86_64": "avx2"}}, "requires is not a mapping"),
    ({"tiers": {"x86_64": (("amx", "fast"),)}}, "tiers is not a mapping"),
    ({"min_cosine": 1.5}, "min_cosine in (0, 1]"),
    ({"reduced": "yes"}, "reduced is not True or False"),
    ({"rank": 1.5}, "rank is not a whole number"),
    ({"peak_libraries": ()}, "peak_libraries is not a tuple of library names"),
])
def test_a_malformed_entry_is_refused_at_registration(change, message):
    with pytest.raises(RegistrationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        register_precision("fp8", dataclasses.replace(toy_fp16(), **change))
    assert "fp8" not in PRECISIONS


def test_a_name_is_registered_once_and_the_reference_is_not_reduced(fp16):
    with pytest.raises(RegistrationError, match="precision 'fp16' is registered already"):
        register_precision("fp16", PRECISIONS["bf16"])
    assert register_precision("fp16", fp16) is fp16  # the same entry again (a module imported twice) is no error
    with pytest.raises(RegistrationError, match="fp32 is the reference: it cannot be reduced"):
        dataclasses.replace(PRECISIONS[REFERENCE], reduced=True).check(REFERENCE)
    assert not PRECISIONS[REFERENCE].reduced


@pytest.mark.slow
def test_a_run_at_it_computes_in_it_and_passes_its_drift_check(tmp_path):
    """In real workers (TOY_ENV registers the toy precision there too): the toy's float16 matmul against its fp32
    reference, judged by fp16's tolerance."""
    out = tmp_path / "out"
    proc = corescale("run", *LOOP, "--no-progress", "precision=fp16", "reference=toy", f"output_dir={out}",
                     env=TOY_ENV)
    assert proc.returncode == 0, proc.stderr
    (record,) = [json.loads(p.read_text()) for p in out.rglob("result.json")]
    drift = record["drift"]
    assert record["config"]["precision"] == "fp16" and drift["within_tolerance"], drift
    assert drift["tolerance"] == 3e-2 and drift["min_cosine"] == 0.9995
    assert drift["max_abs_error"] > 1e-5, drift  # it really computed in float16
