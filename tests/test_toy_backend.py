"""A backend from outside the package (tests/toy_backend: pure numpy, one matmul as the model) registered with one
line: run, sweep and tune measure it, explain and a precision it does not compute in are refused in one line; an
incomplete or malformed entry is refused at registration."""

import dataclasses
import json
from pathlib import Path

import pytest
from helpers import FAST, LOOP, TOY_ENV, corescale

from corescale.backends import BACKENDS, OPTIONS, BackendEntry, RegistrationError, register
from corescale.errors import UserError

TOY_RUN = [*LOOP, "--no-progress"]


def _results(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.rglob("result.json"))]


# --- in this process ----------------------------------------------------------------------------------------------

def test_every_stage_reads_the_toys_entry(toy):
    from corescale.explain.profilers import check_profiler
    from corescale.measure.forkserver import server_modules
    from corescale.overrides import compose
    from corescale.record.trial import measuring_libraries
    from corescale.tune import space as spaces

    cfg = compose(["backend=toy", "backend.activation=relu"])
    assert cfg.backend.name == "toy" and cfg.backend.activation == "relu"
    assert server_modules("toy", "bert")[-1] == "toy_backend.backend"
    assert "numpy" in measuring_libraries() and "toy" not in measuring_libraries()
    space = spaces.derive(compose([]), [], {"backend": ["toy"]}, 2, {"avx2": True}, latency=False)
    assert space.backends == ["toy"] and space.precisions["toy"] == ["fp32"]
    assert space.options["toy"] == {"activation": ["tanh", "relu"]}
    with pytest.raises(UserError, match="explain cannot profile backend=toy"):
        check_profiler("toy")


@pytest.mark.parametrize("overrides, message", [
    (["backend=toy", "precision=int8"],
     "backend=toy does not compute in precision=int8; allowed precisions: fp32, fp16"),
    (["backend=toy", "openmp=intel"], "openmp=intel applies to the backends that run on OpenMP threads"),
    (["backend=toy", "backend.activation=gelu"], "unknown backend.activation 'gelu' for backend=toy"),
])
def test_the_toys_facts_are_checked_before_any_worker(toy, overrides, message):
    from corescale.overrides import compose

    with pytest.raises(UserError) as info:
        compose(overrides)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_an_incomplete_entry_is_refused_at_registration(toy):
    with pytest.raises(RegistrationError, match="backend 'half' is incomplete: extra missing, requires missing"):
        register("half", BackendEntry(options=toy.options, backend="toy_backend.backend:ToyBackend"))
    assert "half" not in BACKENDS and "half" not in OPTIONS


@pytest.mark.parametrize("change, message", [
    ({"precisions": ("fp64",)}, "precisions must be some of fp32, bf16, int8"),
    ({"precisions": ()}, "precisions must be some of"),
    ({"snippet": "toy_backend.recipe.snippet"}, "snippet is not 'module:attribute'"),
    ({"openmp": "yes"}, "openmp is not True or False"),
    ({"worker_modules": "toy_backend.backend"}, "worker_modules is not a tuple of names"),
    ({"profiler": "numpy"}, "profiler is not a Profiler or None"),
])
def test_a_malformed_entry_is_refused_at_registration(toy, change, message):
    with pytest.raises(RegistrationError, match=message):
        register("toy2", dataclasses.replace(toy, **change))
    assert "toy2" not in BACKENDS


def test_an_artifact_with_one_hook_is_refused_at_registration(toy):
    (artifact,) = toy.artifacts
    for hooks in ({"install": None}, {"collect": "toy_backend.artifact.collect"}):
        with pytest.raises(RegistrationError, match="toy weights (install|collect) is not 'module:attribute'"):
            register("toy2", dataclasses.replace(toy, artifacts=(dataclasses.replace(artifact, **hooks),)))
    assert "toy2" not in BACKENDS


def test_a_name_is_registered_once_and_must_be_the_options_name(toy):
    with pytest.raises(RegistrationError, match="backend 'toy' is registered already"):
        register("toy", BACKENDS["pytorch"])
    with pytest.raises(RegistrationError, match="options' name default is 'toy', not 'other'"):
        register("other", toy)
    assert register("toy", toy) is toy  # the same entry again (a module imported twice) is no error


@pytest.mark.slow
def test_a_plugin_module_that_cannot_be_imported_stops_the_tool(tmp_path):
    proc = corescale("run", *FAST, f"output_dir={tmp_path / 'out'}",
                     env={**TOY_ENV, "CORESCALE_BACKENDS": "toy_backend,no_such_backend_module"})
    assert proc.returncode == 2 and proc.stderr.startswith("corescale: error: CORESCALE_BACKENDS names "
                                                          "'no_such_backend_module', which cannot be imported")
    assert proc.stderr.count("\n") == 1  # one line, no traceback
    assert not (tmp_path / "out").exists()


# --- in real processes: the CLI and its workers register the toy from CORESCALE_BACKENDS ------------------------

@pytest.mark.slow
def test_run_and_sweep_measure_the_toy(tmp_path):
    out = tmp_path / "out"
    proc = corescale("run", *TOY_RUN, f"output_dir={out}", env=TOY_ENV)
    assert proc.returncode == 0, proc.stderr
    swept = corescale("run", "-m", *TOY_RUN, "batch_size=1,2", "backend.activation=relu", f"output_dir={out}",
                      env=TOY_ENV)
    assert swept.returncode == 0, swept.stderr
    records = _results(out)
    assert len(records) == 3 and all(r["status"] == "ok" for r in records)
    assert {r["config"]["backend"]["name"] for r in records} == {"toy"}
    assert sorted(r["config"]["batch_size"] for r in records) == [1, 1, 2]
    framework = records[0]["instance_reports"][0]["framework"]
    assert framework["framework"] == "numpy" and records[0]["metrics"]["throughput_samples_per_s"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("argv, message", [
    (["run", *TOY_RUN, "precision=bf16"],
     "backend=toy does not compute in precision=bf16; allowed precisions: fp32, fp16"),
    (["run", "-m", *TOY_RUN, "precision=fp32,int8"], "allowed precisions: fp32, fp16"),
    (["explain", *FAST, "backend=toy"], "explain cannot profile backend=toy"),
    (["tune", *TOY_RUN, "precision=int8"], "backend=toy does not compute in precision=int8"),
])
def test_what_the_toy_cannot_do_is_refused_in_one_line(argv, message, tmp_path):
    out = tmp_path / "out"
    proc = corescale(*argv, f"output_dir={out}", env=TOY_ENV)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and message in proc.stderr and proc.stdout == ""
    assert not out.exists()


@pytest.mark.slow
def test_tune_searches_the_toys_options_and_writes_its_snippet(tmp_path):
    out = tmp_path / "out"
    proc = corescale("tune", *TOY_RUN, "duration=0.6", "tune.screen=0.3", "trials=1", "tune.top_k=1",
                     "tune.repeats=2", "space.backend=[toy]", "space.batch_size=[1]", "space.precision=[fp32]",
                     f"output_dir={out}", env=TOY_ENV, timeout=600)  # fp32: on a CPU with AVX512_FP16 the toy
    # precision would be drawn too, and judged against PyTorch's model, which the toy is not
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (tune_dir,) = out.glob("tune-*")
    backends = {r["config"]["backend"]["name"] for r in _results(tune_dir)}
    assert backends == {"toy", "pytorch"}  # the searched backend and the out-of-box baseline
    doc = json.loads((tune_dir / "tune.json").read_text())
    assert doc["space"]["backends"] == ["toy"] and doc["space"]["options"]["toy"] == {"activation": ["tanh", "relu"]}
    assert "the toy model" in (tune_dir / "recipe" / "snippet.py").read_text()


@pytest.mark.slow
def test_the_toys_own_artifact_is_bundled_and_served_through_its_hooks(tmp_path):
    """backend.weights=file: the toy runs a weights file its entry's Artifact builds; `--bundle` copies it with the
    artifact's collect hook and `corescale serve` loads the bundle's copy through its install hook (a new artifact
    kind needs no edit in serve/), answering what the bundled weights compute."""
    import httpx
    import numpy as np
    from serving import Service
    from tokenizers import Tokenizer

    bundle = tmp_path / "bundle"
    proc = corescale("run", *TOY_RUN, "backend.weights=file", f"cache_dir={tmp_path / 'cache'}",
                     f"output_dir={tmp_path / 'out'}", "--bundle", str(bundle), env=TOY_ENV)
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["format"] == 2 and manifest["artifact"]["kind"] == "toy" and "artifact/weights.npz" in \
        manifest["files"]
    with Service(bundle, tmp_path / "serve.log", env=TOY_ENV) as service:
        (instance,) = httpx.get(f"{service.url}/info").json()["corescale"]["layout"]["instances"]
        loaded = Path(instance["artifact"]).resolve()  # the service's verified copy of the bundle (serve/opened.py)
        assert loaded.parts[-3:] == ("bundle", "artifact", "weights.npz") and not loaded.is_relative_to(tmp_path)
        assert loaded.read_bytes() == (bundle / "artifact" / "weights.npz").read_bytes()
        answer = httpx.post(f"{service.url}/embed_all", json={"inputs": "a toy"}, timeout=60)
    assert answer.status_code == 200, answer.text
    tokenizer = Tokenizer.from_file(str(bundle / manifest["config"]["workload"]["tokenizer"] / "tokenizer.json"))
    tokenizer.no_padding()
    ids = tokenizer.encode("a toy").ids
    with np.load(bundle / "artifact" / "weights.npz") as saved:
        expected = np.tanh(saved["embedding"][ids] @ saved["weight"])
    np.testing.assert_allclose(np.array(answer.json()[0]), expected, rtol=1e-4, atol=1e-5)
