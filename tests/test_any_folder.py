"""Everything that crosses a process boundary works from a folder as users have them: spaces, non-ASCII letters,
200+ characters. The dynamic loader splits LD_PRELOAD on spaces as well as colons, so a preloaded library under such
a path is reached through a link in a private space-free folder the run owns and removes (machine/preload_links.py);
the record keeps the library's real path. The slow test runs a real trial with its preloaded libraries, its model
and its output in such a folder, then replays its recipe.sh and writes its Kubernetes manifests from there."""

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FAST, ROOT, raw_record
from serving import minilm_folder

from corescale.config import BenchmarkConfig
from corescale.errors import UserError
from corescale.machine import environment, instance_env, preload_links
from corescale.machine.placement import InstancePlacement, InstanceSpec

ODD = "a long folder name as users have it — ünïcødé/and another level"


def odd_folder(root: Path) -> Path:
    where = root / ODD / ("x" * 120) / "corescale çé"
    where.mkdir(parents=True)
    assert len(str(where)) > 200
    return where


def elf(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF, enough for the check: never loaded here")
    return path


SPEC = InstanceSpec(InstancePlacement(0, (0,), (0,), 1), threads=1, batch_size=1)


@pytest.mark.parametrize("path, safe", [("/usr/lib/libjemalloc.so.2", True), ("/a b/lib.so", False),
                                        ("/a:b/lib.so", False), ("/tab\there/lib.so", False), ("", False),
                                        ("/ünïcødé/lib.so", True)])
def test_what_ld_so_reads_whole(path, safe):
    assert preload_links.loader_safe(path) is safe


def test_a_library_under_a_spaced_path_is_preloaded_through_a_link_and_recorded_as_itself(tmp_path, monkeypatch):
    odd = odd_folder(tmp_path)
    monkeypatch.setenv(instance_env.LIB_PATH_ENV, str(odd / "lib dir"))
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    jemalloc, iomp = elf(odd / "lib dir" / "libjemalloc.so.2"), elf(odd / "lib dir" / "libiomp5.so")
    config = BenchmarkConfig(allocator="jemalloc", openmp="intel")
    launch = instance_env.Launch.of(config, SPEC)
    assert launch.variables["LD_PRELOAD"] == f"{jemalloc}:{iomp}"  # what the record keeps: the libraries that ran
    seen = launch.env["LD_PRELOAD"].split(":")
    assert all(preload_links.loader_safe(entry) for entry in seen) and len(seen) == 2
    assert [Path(entry).name for entry in seen] == ["libjemalloc.so.2", "libiomp5.so"]
    assert [Path(entry).resolve() for entry in seen] == [jemalloc.resolve(), iomp.resolve()]
    again = instance_env.Launch.of(config, SPEC)
    assert again.env["LD_PRELOAD"] == launch.env["LD_PRELOAD"]  # one link per library, however many instances
    replayed = instance_env.Launch.from_recorded(config, SPEC, launch.recorded())  # a bundle's launch, here
    assert replayed.env["LD_PRELOAD"] == launch.env["LD_PRELOAD"]


def test_a_safe_path_is_preloaded_as_it_is(tmp_path, monkeypatch):
    monkeypatch.setenv(instance_env.LIB_PATH_ENV, str(tmp_path))
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    jemalloc = elf(tmp_path / "libjemalloc.so.2")
    launch = instance_env.Launch.of(BenchmarkConfig(allocator="jemalloc"), SPEC)
    assert launch.env["LD_PRELOAD"] == launch.variables["LD_PRELOAD"] == str(jemalloc)


def test_no_space_free_temporary_folder_is_one_line(tmp_path, monkeypatch):
    odd = odd_folder(tmp_path)
    library = elf(odd / "libjemalloc.so.2")
    monkeypatch.setattr(preload_links, "candidate_bases", lambda: [odd])
    preload_links.link_folder.cache_clear()
    try:
        with pytest.raises(UserError) as err:
            preload_links.loader_path(library)
    finally:
        preload_links.link_folder.cache_clear()
    assert "TMPDIR" in str(err.value) and "\n" not in str(err.value)


def test_a_preload_that_is_no_elf_library_is_refused_by_name(tmp_path, monkeypatch):
    odd = odd_folder(tmp_path)
    (odd / "libjemalloc.so.2").write_text("#!/bin/sh\necho not a library\n")
    monkeypatch.setenv(instance_env.LIB_PATH_ENV, str(odd))
    with pytest.raises(UserError) as err:
        instance_env.preload_paths(BenchmarkConfig(allocator="jemalloc"))
    message = str(err.value)
    assert "not an ELF shared library" in message and "libjemalloc.so.2" in message and "\n" not in message


def test_a_dead_runs_link_folder_is_removed_and_a_live_ones_kept(tmp_path):
    dead = tmp_path / f"{preload_links.PREFIX}{2 ** 22 + 12345}-abc"  # above pid_max's default: no such process
    live = tmp_path / f"{preload_links.PREFIX}{os.getpid()}-def"
    other = tmp_path / "corescale-preload-unrelated"
    for folder in (dead, live, other):
        folder.mkdir()
    preload_links.remove_stale(tmp_path)
    assert not dead.exists() and live.exists() and other.exists()


def test_mapped_libraries_keep_a_path_with_spaces_whole():
    maps = ("7f0000000000-7f0000001000 r-xp 00000000 08:01 1234   /opt/a folder/with spaces/libjemalloc.so.2\n"
            "7f0000002000-7f0000003000 r-xp 00000000 08:01 99     /usr/lib/x86_64-linux-gnu/libgomp.so.1\n"
            "7f0000004000-7f0000005000 rw-p 00000000 00:00 0 \n")
    assert environment.mapped_libraries(maps) == {"jemalloc": "/opt/a folder/with spaces/libjemalloc.so.2",
                                                  "gnu-openmp": "/usr/lib/x86_64-linux-gnu/libgomp.so.1"}


def test_inductor_links_torch_under_a_spaced_path_through_a_space_free_link(tmp_path, monkeypatch):
    """torch 2.13's inductor passes -L unquoted: torch.compile under a spaced virtualenv linked nothing."""
    from torch.utils import cpp_extension

    from corescale.backends.pytorch.backend import space_free_torch_lib

    real = odd_folder(tmp_path) / "site-packages" / "torch" / "lib"
    real.mkdir(parents=True)
    monkeypatch.setattr(cpp_extension, "TORCH_LIB_PATH", str(real))
    space_free_torch_lib()
    seen = cpp_extension.TORCH_LIB_PATH
    assert preload_links.loader_safe(seen) and Path(seen).name == "lib" and Path(seen).resolve() == real.resolve()
    space_free_torch_lib()  # a second build: the same link, none added
    assert seen == cpp_extension.TORCH_LIB_PATH


# ---- a real trial from such a folder -----------------------------------------------------------------------------

@pytest.mark.parametrize("python", ["/opt/venv/bin/python", "/home/a long folder/ünï/.venv/bin/python"])
def test_ray_workers_start_the_job_python_quoted_where_it_needs_quoting(python, monkeypatch):
    from corescale.trials import ray as on_ray

    monkeypatch.setattr(sys, "executable", python)
    named = on_ray.python_of_workers()
    if " " not in python:
        assert named == {}  # Ray starts such workers as it does by default
    else:  # what Ray's `bash -c` reads back as one word: this Python
        assert shlex.split(named["py_executable"]) == [python]


@pytest.mark.slow  # a real PyTorch trial (~20 s on 2 cores), its recipe replayed, its manifests written
def test_a_trial_its_recipe_and_its_manifests_from_a_folder_with_spaces_and_non_ascii_letters(tmp_path):
    odd = odd_folder(tmp_path)
    libs = odd / "preloaded libs"
    libs.mkdir()
    for name in ("libjemalloc.so.2", "libiomp5.so"):  # the real libraries, copied under the odd path
        source = instance_env.find_library(next(lib for lib in [*instance_env.ALLOCATORS.values(),
                                                                instance_env.INTEL_OPENMP] if name in lib.files))
        shutil.copy(source, libs / name)
    model = odd / "my model"
    shutil.copytree(minilm_folder(), model)
    temp = tmp_path / "tmp"  # the run's own temporary folder: its links must be gone when it ends
    temp.mkdir()
    env = {**os.environ, instance_env.LIB_PATH_ENV: str(libs), "TMPDIR": str(temp)}
    out, bundle = odd / "out put", odd / "the bundle"
    proc = subprocess.run([sys.executable, "-m", "corescale.cli", "run", *FAST[1:], f"model='{model}'",
                           "backend=pytorch", "allocator=jemalloc", "openmp=intel", "quality_samples=32",
                           f"output_dir='{out}'", "--no-progress", "--bundle", str(bundle)],
                          cwd=odd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (result,) = [p.parent for p in out.glob("*/result.json")]
    record = raw_record(result)
    assert record["status"] == "ok", record.get("failure")
    report = record["instance_reports"][0]
    assert Path(report["mapped_libraries"]["jemalloc"]).resolve() == (libs / "libjemalloc.so.2").resolve()
    assert Path(report["mapped_libraries"]["intel-openmp"]).resolve() == (libs / "libiomp5.so").resolve()
    assert report["launch"]["env"]["LD_PRELOAD"].startswith(str(libs / "libjemalloc.so.2"))
    assert not list(temp.glob(f"{preload_links.PREFIX}*")), "the run removes its links when it ends"

    from corescale.record.files import read_result
    from corescale.tune import recipe

    written = recipe.write(odd / "re cipe", read_result(result), ["backend=pytorch"], "a recipe from an odd folder")
    probe = ("import json; from corescale.machine.environment import mapped_libraries; "
             "print(json.dumps(mapped_libraries()))")
    before = set(Path("/tmp").glob("corescale-preload.*"))
    replay = subprocess.run(["bash", str(written[recipe.RECIPE]), "--", sys.executable, "-c", probe], cwd=odd,
                            env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert replay.returncode == 0, replay.stderr[-3000:]
    mapped = json.loads(replay.stdout.splitlines()[-1])
    assert Path(mapped["jemalloc"]).resolve() == (libs / "libjemalloc.so.2").resolve(), replay.stderr
    assert Path(mapped["intel-openmp"]).resolve() == (libs / "libiomp5.so").resolve(), replay.stderr
    assert "cannot be preloaded" not in replay.stderr
    assert set(Path("/tmp").glob("corescale-preload.*")) <= before, "recipe.sh removes its links"

    manifests = odd / "k8s out"
    deployed = subprocess.run([sys.executable, "-m", "corescale.cli", "deploy", str(bundle), "--target",
                               "kubernetes", "--out", str(manifests)], cwd=odd, env=env, capture_output=True,
                              text=True, timeout=120)
    assert deployed.returncode == 0, deployed.stderr[-3000:]
    command = deployed.stdout.split("build the image first: ", 1)[1].strip()
    assert shlex.split(command)[-1] == str(bundle)  # the printed command names the bundle as one word


@pytest.mark.parametrize("value", ["/home/josé/out", "/tmp/a long folder ünï/corescale çé", "~/données"])
def test_a_value_with_letters_outside_ascii_is_taken_as_written(value):
    """Hydra's grammar refuses such a value unquoted, and it can mean nothing else: it is quoted for the user."""
    from corescale.overrides import compose

    assert compose([f"output_dir={value}", "model=bert-tiny"]).output_dir == value


def test_a_value_that_holds_the_grammar_is_still_the_users_to_quote():
    from corescale.errors import UserError
    from corescale.overrides import parse_overrides, shorthand

    assert shorthand(["output_dir=/a/b"]) == ["output_dir=/a/b"]
    with pytest.raises(UserError, match="quote a value that holds brackets"):
        parse_overrides(shorthand(["output_dir=/données/a(b)"]))
