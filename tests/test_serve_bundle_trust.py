"""A bundle is untrusted input (issue 29 item 1, audit H1, L1, L2, L11): every tampering of a real bundle is refused
in one line before any worker starts, and nothing is planted outside the bundle and the service's work folder.
Most refusals are checked in process (open_bundle is what `corescale serve BUNDLE` runs first); a few through
the real CLI (exit 2); one through a real service (a worker restarted after the bundle changed in place)."""

import hashlib
import json
import os
import shutil
import signal
import time
import uuid
from pathlib import Path

import httpx
import pytest
from helpers import corescale, processes_with_env
from serving import Service

from corescale.errors import UserError
from corescale.serve.opened import Trust, open_bundle

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bundle(tiny_bundle):
    """The session's bert-tiny embed bundle (a preset: its tokenizer folder, its export; pooled), shared with the
    other serve tests: every test here changes only a copy of it (tampered)."""
    return tiny_bundle("embed")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tampered(bundle: Path, where: Path, edit=None, files: dict[str, bytes] | None = None,
             symlinks: dict[str, Path] | None = None, listed: bool = True) -> Path:
    """A copy of the bundle with `files` written (listed in the manifest with their sha256 when `listed`),
    `symlinks` made, then the manifest passed through `edit` (a function that changes the dict in place)."""
    copy = where / "bundle"
    shutil.copytree(bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    for name, data in (files or {}).items():
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        (copy / name).write_bytes(data)
        if listed:
            manifest["files"][name] = sha256(copy / name)
    for name, target in (symlinks or {}).items():
        (copy / name).unlink(missing_ok=True)
        (copy / name).symlink_to(target)
        manifest["files"][name] = sha256(copy / name)
    if edit is not None:
        edit(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def refused(copy: Path, *words: str, trust: Trust | None = None) -> str:
    """open_bundle refuses it in one line naming `words`; nothing is written beside the bundle but the work
    folder, and the work folder holds no link out of it."""
    work = copy.parent / "work"
    work.mkdir()
    before = sorted(p.name for p in copy.parent.iterdir())
    with pytest.raises(UserError) as info:
        open_bundle(copy, work, trust) if trust else open_bundle(copy, work)
    message = str(info.value)
    assert "\n" not in message and all(w in message for w in words), message
    assert sorted(p.name for p in copy.parent.iterdir()) == before
    for path in work.rglob("*"):
        assert not path.is_symlink() or work in path.resolve().parents, path
    return message


def instance(manifest: dict) -> dict:
    return manifest["layout"]["instances"][0]


# ---- the launch: derived here, never taken from the manifest (H1 fix 1) ----

def test_a_command_prefix_other_than_numactl_is_refused(bundle, tmp_path):
    planted = tmp_path / "planted"
    copy = tampered(bundle, tmp_path, lambda m: instance(m).update(
        command_prefix=["/bin/sh", "-c", f"touch {planted}; exec \"$@\"", "sh"]))
    refused(copy, "instance 0", "/bin/sh", "numactl")
    assert not planted.exists()


def test_a_recorded_numactl_path_is_not_what_runs(bundle, tmp_path):
    """A prefix of the right shape with another program named numactl: the launch uses this machine's numactl
    (or none), never the recorded path (also L1: a numactl missing here is no FileNotFoundError)."""
    cpus, nodes = instance(json.loads((bundle / "manifest.json").read_text()))["command_prefix"][1:] or \
        ["--physcpubind=0", "--membind=0"]
    fake = str(tmp_path / "bin" / "numactl")
    copy = tampered(bundle, tmp_path, lambda m: instance(m).update(command_prefix=[fake, cpus, nodes]))
    (tmp_path / "work").mkdir()
    opened = open_bundle(copy, tmp_path / "work")
    assert all(fake not in launch.prefix for launch in opened.launches)
    assert all(not launch.prefix or launch.prefix[0] == shutil.which("numactl") for launch in opened.launches)


@pytest.mark.parametrize("name, value", [("PYTHONPATH", "{bundle}/model"), ("CORESCALE_PLUGINS", "evil"),
                                         ("LD_LIBRARY_PATH", "{bundle}"), ("OMP_TOOL_LIBRARIES", "{bundle}/x.so")])
def test_an_environment_variable_corescale_never_sets_is_refused(bundle, tmp_path, name, value):
    copy = tampered(bundle, tmp_path, lambda m: instance(m)["env"].update({name: value.format(bundle=tmp_path)}))
    refused(copy, "instance 0", f"sets {name}", "never sets")


def test_ld_preload_of_a_file_in_the_bundle_is_refused(bundle, tmp_path):
    library = tmp_path / "bundle" / "lib" / "evil.so"
    copy = tampered(bundle, tmp_path, lambda m: instance(m)["env"].update(LD_PRELOAD=str(library)),
                    files={"lib/evil.so": b"\x7fELF not really"})
    refused(copy, "instance 0", "evil.so", "LD_PRELOAD")


def test_the_thread_variables_are_derived_here_not_read(bundle, tmp_path):
    copy = tampered(bundle, tmp_path, lambda m: instance(m)["env"].update(OMP_NUM_THREADS="64"))
    (tmp_path / "work").mkdir()
    opened = open_bundle(copy, tmp_path / "work")
    assert opened.launches[0].env["OMP_NUM_THREADS"] == str(opened.specs[0].threads)


# ---- trust_remote_code and pickle: the command line's flags, never the manifest (H1 fix 3) ----

@pytest.mark.parametrize("key, flag", [("trust_remote_code", "remote_code"), ("allow_pickle", "pickle")])
def test_a_manifest_asking_for_code_execution_needs_the_flag(bundle, tmp_path, key, flag):
    copy = tampered(bundle, tmp_path, lambda m: m["config"].update({key: True}))
    refused(copy, key, f"--{key.replace('_', '-')}")
    shutil.rmtree(tmp_path / "work")
    (tmp_path / "work").mkdir()
    opened = open_bundle(copy, tmp_path / "work", Trust(**{flag: True}))
    assert getattr(opened.cfg, key) is True


def test_serve_refuses_a_trust_remote_code_bundle_in_one_line_exit_2(bundle, tmp_path):
    copy = tampered(bundle, tmp_path, lambda m: m["config"].update(trust_remote_code=True))
    proc = corescale("serve", str(copy), "--port", "0", timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "--trust-remote-code" in proc.stderr


# ---- paths confined to the bundle (H1 fix 2) ----

def test_an_artifact_step_that_leaves_the_cache_plants_nothing(bundle, tmp_path):
    """The first step names the link serve makes in its runtime cache: `..` and absolute paths are refused."""
    for step in ("../../../planted", str(tmp_path / "planted-abs")):
        where = tmp_path / uuid.uuid4().hex
        where.mkdir()
        copy = tampered(bundle, where, lambda m, step=step: m["artifact"].update(steps=[step]))
        refused(copy, "manifest.artifact")
        assert not any(p.name.startswith("planted") for p in (*tmp_path.iterdir(), *where.iterdir()))


def test_an_artifact_step_that_is_not_an_export_key_is_refused(bundle, tmp_path):
    copy = tampered(bundle, tmp_path, lambda m: m["artifact"].update(steps=["notakey"]))
    refused(copy, "not an export key")


@pytest.mark.parametrize("name", ["../outside.txt", "/etc/hostname", "model/../../outside.txt", "./README.md"])
def test_a_listed_file_outside_the_bundle_is_refused(bundle, tmp_path, name):
    (tmp_path / "outside.txt").write_text("outside")
    digest = sha256(Path(name) if name.startswith("/") else tmp_path / "outside.txt" if "outside" in name
                    else bundle / "README.md")  # the file's own: only where it is can refuse it
    copy = tampered(bundle, tmp_path, lambda m: m["files"].update({name: digest}))
    refused(copy, "manifest.files", "relative path inside the bundle")


@pytest.mark.parametrize("where_to", ["/abs", "../other"])
def test_a_tokenizer_outside_the_bundle_is_refused(bundle, tmp_path, where_to):
    outside = tmp_path / "elsewhere"
    shutil.copytree(bundle / "tokenizer", outside)
    target = str(outside) if where_to == "/abs" else "../elsewhere"
    copy = tampered(bundle, tmp_path, lambda m: m["config"]["workload"].update(tokenizer=target))
    refused(copy, "manifest.config.workload.tokenizer")


def test_a_model_that_is_not_the_bundles_is_refused(bundle, tmp_path):
    copy = tampered(bundle, tmp_path, lambda m: m["config"].update(model="someone/remote-code-model"))
    refused(copy, "manifest.config.model", "a bundle carries its model")


def test_a_symbolic_link_out_of_the_bundle_is_refused(bundle, tmp_path):
    outside = tmp_path / "tokenizer.json"
    shutil.copy(bundle / "tokenizer" / "tokenizer.json", outside)  # the same bytes: its sha256 matches
    copy = tampered(bundle, tmp_path, symlinks={"tokenizer/tokenizer.json": outside})
    refused(copy, "tokenizer/tokenizer.json", "symbolic link")


def test_a_symbolic_link_inside_the_bundle_is_refused(bundle, tmp_path):
    copy = tampered(bundle, tmp_path, symlinks={"extra.md": Path("README.md")})
    refused(copy, "extra.md", "symbolic link")


def test_a_file_the_manifest_does_not_list_is_refused(bundle, tmp_path):
    copy = tampered(bundle, tmp_path, files={"sitecustomize.py": b"import os\n"}, listed=False)
    refused(copy, "sitecustomize.py", "not listed")


# ---- malformed manifests: one line each (L1) ----

def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("edit, words", [
    (lambda m: m.update(layout={}), ["manifest.layout", "'instances' is missing"]),
    (lambda m: m.update(artifact=[]), ["manifest.artifact"]),
    (lambda m: m["config"]["warmup"].update(colour="red"), ["manifest.config.warmup", "colour"]),
    (lambda m: m["config"]["server"].update(colour="red"), ["manifest.config.server", "colour"]),
    (lambda m: m["config"]["server"].update(max_batch=0), ["server.max_batch"]),
    (lambda m: m["config"]["server"].update(max_batch="8"), ["manifest.config.server.max_batch"]),
    (lambda m: m["config"].update(workload=["tokenizer"]), ["manifest.config.workload"]),
    (lambda m: m["config"].update(threads="2"), ["manifest.config.threads"]),
    (lambda m: instance(m).update(cpus="0-1"), ["manifest.layout.instances[0].cpus", "expected a list"]),
    (lambda m: instance(m).update(threads=100_000), ["100000 threads on", "at most one thread a CPU"]),  # L6
    (lambda m: m["requires"].update(cpu_features="avx2"), ["manifest.requires.cpu_features", "expected a list"]),
    (lambda m: m["files"].update({"README.md": "not a digest"}), ["manifest.files['README.md']", "sha256"]),
])
def test_a_malformed_manifest_field_is_one_line(bundle, tmp_path, edit, words):
    copy = tampered(bundle, tmp_path, edit)
    refused(copy, "is malformed", *words)


def test_a_manifest_nested_too_deeply_is_one_line(bundle, tmp_path):
    copy = tampered(bundle, tmp_path)
    (copy / "manifest.json").write_text('{"format": 2, "extra": ' + deep(100_000) + "}")
    refused(copy, "nested too deeply")


def test_a_malformed_tokenizer_is_one_line(bundle, tmp_path):
    copy = tampered(bundle, tmp_path, files={"tokenizer/tokenizer.json": b'{"model": {"type": "nonsense"}}'})
    refused(copy, "tokenizer.json", "not a readable fast tokenizer")


# ---- the CLI: exit 2, nothing on stdout, before any worker ----

def test_serve_refuses_a_tampered_launch_before_any_worker(bundle, tmp_path):
    marker = tmp_path / "ran"
    copy = tampered(bundle, tmp_path, lambda m: instance(m)["env"].update(PYTHONPATH=str(tmp_path / "bundle" / "py")),
                    files={"py/sitecustomize.py": f"open({str(marker)!r}, 'w').close()\n".encode()})
    proc = corescale("serve", str(copy), "--port", "0", timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "PYTHONPATH" in proc.stderr and not marker.exists()


def test_an_empty_api_key_is_refused_and_an_open_address_warned(bundle, tmp_path):
    proc = corescale("serve", str(tmp_path / "nowhere"), env={"CORESCALE_API_KEY": ""}, timeout=120)
    assert proc.returncode == 2 and "API key is empty" in proc.stderr
    proc = corescale("serve", str(tmp_path / "nowhere"), "--host", "0.0.0.0", timeout=120)
    assert proc.returncode == 2 and "warning: listening on 0.0.0.0 with no API key" in proc.stderr


# ---- files verified again at a restart: the service runs its verified copy (L2) ----

def redeploy_another_graph(artifact: Path) -> None:
    """Another valid graph written over the bundle's in place, its artifact manifest updated to match (what a
    redeploy of another measurement over the folder does): the weights of its first matrix doubled."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(artifact / "model.onnx"))
    first = next(t for t in model.graph.initializer if len(t.dims) == 2)
    first.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(first) * 2, first.name))
    onnx.save(model, str(artifact / "model.onnx"))
    listed = json.loads((artifact / "manifest.json").read_text())
    info = (artifact / "model.onnx").stat()
    listed["files"]["model.onnx"] = {"size": info.st_size, "mtime_ns": info.st_mtime_ns,
                                     "sha256": sha256(artifact / "model.onnx")}
    (artifact / "manifest.json").write_text(json.dumps(listed))


def test_a_restarted_worker_loads_the_verified_files_not_a_bundle_changed_in_place(bundle, tmp_path):
    copy = tampered(bundle, tmp_path)
    marker = f"CORESCALE_SERVE_TEST={uuid.uuid4()}"
    name, value = marker.split("=")
    with Service(copy, tmp_path / "serve.log", env={name: value}) as service:
        before = httpx.post(f"{service.url}/tokenize", json={"inputs": "hello"}, timeout=60)
        assert before.status_code == 200, before.text
        vector = httpx.post(f"{service.url}/v1/embeddings", json={"input": "hello"}, timeout=60)
        assert vector.status_code == 200, vector.text
        redeploy_another_graph(copy / "artifact")
        (worker,) = [pid for pid in processes_with_env(marker) if pid != service.process.pid
                     and b"corescale.measure.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        os.kill(worker, signal.SIGKILL)
        deadline, answer = time.monotonic() + 120, None
        while time.monotonic() < deadline:
            answer = httpx.post(f"{service.url}/v1/embeddings", json={"input": "hello"}, timeout=120)
            if answer.status_code == 200:
                break
            time.sleep(0.2)
        assert answer is not None and answer.status_code == 200, answer and answer.text
        assert answer.json()["data"][0]["embedding"] == vector.json()["data"][0]["embedding"]
        code, _ = service.terminate()
    assert code == 0


# ---- optional signing: HMAC-SHA256 of the manifest (serve --sign / --verify KEYFILE, run --bundle --sign) ----

def test_a_signed_bundle_verifies_and_any_change_after_signing_is_refused(bundle, tmp_path):
    from corescale.serve.manifest import read_key
    from corescale.serve.opened import sign_bundle

    (tmp_path / "key").write_bytes(os.urandom(32).hex().encode())
    (tmp_path / "other").write_bytes(os.urandom(32).hex().encode())
    key, other = read_key(tmp_path / "key"), read_key(tmp_path / "other")
    copy = tampered(bundle, tmp_path)
    assert sign_bundle(copy, key).name == "manifest.sig"
    (tmp_path / "work").mkdir()
    assert open_bundle(copy, tmp_path / "work", Trust(), key).manifest is not None
    shutil.rmtree(tmp_path / "work")
    with pytest.raises(UserError, match="does not match manifest.json with this key"):
        open_bundle(copy, tmp_path / "work", Trust(), other)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["layout"]["instances"][0]["threads"] = 1  # any change, even one serve would accept
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="does not match manifest.json with this key"):
        open_bundle(copy, tmp_path / "work", Trust(), key)
    (copy / "manifest.sig").unlink()
    with pytest.raises(UserError, match="is not signed"):
        open_bundle(copy, tmp_path / "work", Trust(), key)
    assert not (tmp_path / "work").exists()  # refused before anything is copied
    (tmp_path / "short").write_text("short")
    with pytest.raises(UserError, match="holds 5 bytes"):
        read_key(tmp_path / "short")


def test_serve_verify_refuses_an_unsigned_bundle_exit_2(bundle, tmp_path):
    (tmp_path / "key").write_text("k" * 32)
    copy = tampered(bundle, tmp_path)
    proc = corescale("serve", str(copy), "--port", "0", "--verify", str(tmp_path / "key"), timeout=120)
    assert proc.returncode == 2 and proc.stdout == "" and "is not signed" in proc.stderr, proc.stderr
    proc = corescale("serve", str(copy), "--sign", str(tmp_path / "key"), timeout=120)
    assert proc.returncode == 0 and (copy / "manifest.sig").is_file(), proc.stderr
