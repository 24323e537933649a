"""Real peers side by side: sentence-transformers' encode() on each of its CPU backends and corescale's
recommendation, on the same cores, the same texts and the same thread count, in fresh processes, alternated.

    python benchmarks/peers.py [--texts 1000] [--batch 32] [--repeats 3] [--cores 0,1]
                               [--peers st-torch,st-onnx,st-onnx-int8,st-openvino,st-openvino-int8,corescale]
                               [--peer-venv /tmp/st-peers] [--tune-budget 5m] [--output DIR]
                               [--corescale OVERRIDES...]

The model is all-MiniLM-L6-v2 with its trained weights (corescale's packaged copy, checksum-verified; copied to
DIR/st-model so the peers' exports land there), the texts the first --texts of corescale's built-in corpus.
- st-torch: `SentenceTransformer(dir, device="cpu").encode(texts, batch_size, normalize_embeddings=True)`, the
  out-of-the-box baseline, in this interpreter (the project's venv).
- st-onnx, st-onnx-int8 (its `export_dynamic_quantized_onnx_model` for this CPU's ISA), st-openvino,
  st-openvino-int8 (its `export_static_quantized_openvino_model`, calibrated on corpus texts that are not
  measured): sentence-transformers' own CPU backends, in their own virtualenv (--peer-venv; created when missing
  with `pip install "sentence-transformers[onnx,openvino]" datasets "huggingface-hub<1.0" torch==2.13.0`,
  because optimum pins transformers below corescale's floor).
  Exports are made once, before the rounds, in their own processes.
- corescale: `corescale run model=all-minilm-l6-v2 workload=builtin tokenize=true` (the tokenizer inside the timed
  call, as encode() includes it) on the same texts and batch size, padded per length-sorted batch as encode()
  does (pad=sorted), truncated at the model's 256 tokens; the configuration is --corescale's overrides, or by
  default the winner of a short `corescale tune` (--tune-budget) with the same fixed keys.
Each peer process is pinned to --cores (corescale's own spawn, as a trial's workers) with that many threads; a peer
warms up on a few batches, then one encode() of all the texts is timed (texts/s = texts ÷ its wall time);
corescale's figure is samples/s of its timed window, which covers every batch of the texts at least once. Rounds
alternate the peers (A B C A B C ...). Quality: each peer's embeddings against sentence-transformers torch fp32 on
the same texts (per-text cosine min/p1/mean, recall@10); corescale's is its own `quality` section (its fp32 PyTorch
reference).
A peer that fails to install, export or run is a row with its error. Prints a markdown table and writes
DIR/peers.json with every raw figure. The reranker peer (CrossEncoder.predict) is benchmarks/rerank_peers.py; inside
corescale, `backend=sentence_transformers` is the tune's peer baseline (docs/tune.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ST_PEERS = ("st-torch", "st-onnx", "st-onnx-int8", "st-openvino", "st-openvino-int8")
PEERS = (*ST_PEERS, "corescale")
BASELINE = "st-torch"
GOAL_DEFAULT, GOAL_BACKEND, GOAL_P1 = 2.0, 1.3, 0.99
MAX_LENGTH = 256  # the model's max_seq_length (sentence_bert_config.json)
CALIBRATION = 300  # corpus texts after the measured ones calibrate the static int8 export
# torch: the local CPU file (a bare torch pulls the CUDA build); datasets (the static int8 export's calibration set)
# would lift huggingface-hub past what the transformers that optimum pins accepts
PEER_PACKAGES = ["sentence-transformers[onnx,openvino]", "datasets", "huggingface-hub<1.0", "torch==2.13.0"]
WARMUP_BATCHES = 2
MODEL_FILES = {"st-onnx": "onnx/model.onnx", "st-onnx-int8": "onnx/model_qint8_{isa}.onnx",
               "st-openvino": "openvino/openvino_model.xml",
               "st-openvino-int8": "openvino/openvino_model_qint8_quantized.xml"}  # made by the exports


# --- the worker: runs in either virtualenv, imports nothing of corescale ----------------------------------------

def worker_model(peer: str, folder: str, isa: str):
    from sentence_transformers import SentenceTransformer

    if peer == "st-torch":
        return SentenceTransformer(folder, device="cpu")
    return SentenceTransformer(folder, device="cpu", backend="onnx" if "onnx" in peer else "openvino",
                               model_kwargs={"file_name": MODEL_FILES[peer].format(isa=isa)})


def worker_export(peer: str, folder: str, isa: str, calibration: list[str]) -> None:
    """The peer's model file, made once in DIR/st-model by sentence-transformers' own export functions."""
    from sentence_transformers import SentenceTransformer

    if peer in ("st-onnx", "st-onnx-int8") and not (Path(folder) / MODEL_FILES["st-onnx"]).is_file():
        SentenceTransformer(folder, device="cpu", backend="onnx").save_pretrained(folder)
    if peer == "st-onnx-int8" and not (Path(folder) / MODEL_FILES[peer].format(isa=isa)).is_file():
        from sentence_transformers import export_dynamic_quantized_onnx_model

        model = worker_model("st-onnx", folder, isa)
        export_dynamic_quantized_onnx_model(model, isa, folder)
    if peer in ("st-openvino", "st-openvino-int8") and not (Path(folder) / MODEL_FILES["st-openvino"]).is_file():
        SentenceTransformer(folder, device="cpu", backend="openvino").save_pretrained(folder)
    if peer == "st-openvino-int8" and not (Path(folder) / MODEL_FILES[peer]).is_file():
        from sentence_transformers import export_static_quantized_openvino_model

        data = Path(folder).parent / "calibration"  # a local dataset folder: the hub's default (glue) is offline
        data.mkdir(exist_ok=True)
        (data / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in calibration))
        model = worker_model("st-openvino", folder, isa)
        export_static_quantized_openvino_model(model, None, folder, dataset_name=str(data),
                                               dataset_config_name="default", dataset_split="train",
                                               column_name="text")


def cpu_busy(cpus: list[int]) -> float:
    """Busy seconds of these CPUs since boot (/proc/stat: user + nice + system + irq + softirq + steal)."""
    ticks = os.sysconf("SC_CLK_TCK")
    busy = 0
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            values = [int(v) for v in fields]
            busy += values[0] + values[1] + values[2] + values[5] + values[6] + values[7]
    return busy / ticks


def worker(spec: dict) -> dict:
    import numpy as np

    threads = spec["threads"]
    if spec["peer"] == "st-torch":
        import torch

        torch.set_num_threads(threads)
    if spec.get("export"):
        worker_export(spec["peer"], spec["model"], spec["isa"], spec["calibration"])
        return {"status": "ok"}
    texts = json.loads(Path(spec["texts"]).read_text())
    model = worker_model(spec["peer"], spec["model"], spec["isa"])
    model.max_seq_length = MAX_LENGTH
    batch = spec["batch"]
    model.encode(texts[:batch * WARMUP_BATCHES], batch_size=batch, normalize_embeddings=True)
    cpus = sorted(os.sched_getaffinity(0))
    own, busy, started = time.process_time(), cpu_busy(cpus), time.perf_counter()
    vectors = model.encode(texts, batch_size=batch, normalize_embeddings=True, convert_to_numpy=True)
    wall = time.perf_counter() - started
    own, busy = time.process_time() - own, cpu_busy(cpus) - busy
    np.save(spec["embeddings"], np.asarray(vectors, dtype=np.float32))
    from importlib import metadata

    return {"status": "ok", "seconds": wall, "texts_per_s": len(texts) / wall,
            "foreign_load": max(0.0, (busy - own) / (wall * len(cpus))), "cpu_utilisation": own / (wall * len(cpus)),
            "versions": {n: metadata.version(n) for n in ("sentence-transformers", "transformers", "torch",
                                                         "onnxruntime", "openvino", "optimum-intel", "optimum-onnx")
                         if _installed(n)}}


def worker_slices(spec: dict) -> dict:
    """Shared-host mode: loaded and warmed once, then one timed encode() of the texts per `go` line on stdin (a
    JSON line of its figures on stdout), until `stop`; the last slice's embeddings are saved."""
    import numpy as np

    if spec["peer"] == "st-torch":
        import torch

        torch.set_num_threads(spec["threads"])
    texts = json.loads(Path(spec["texts"]).read_text())
    model = worker_model(spec["peer"], spec["model"], spec["isa"])
    model.max_seq_length = MAX_LENGTH
    batch = spec["batch"]
    model.encode(texts[:batch * WARMUP_BATCHES], batch_size=batch, normalize_embeddings=True)
    print(json.dumps({"status": "ready"}), flush=True)
    cpus = sorted(os.sched_getaffinity(0))
    vectors = None
    for line in sys.stdin:
        if line.strip() != "go":
            break
        own, busy, started = time.process_time(), cpu_busy(cpus), time.perf_counter()
        vectors = model.encode(texts, batch_size=batch, normalize_embeddings=True, convert_to_numpy=True)
        wall = time.perf_counter() - started
        own, busy = time.process_time() - own, cpu_busy(cpus) - busy
        print(json.dumps({"status": "ok", "seconds": wall, "texts_per_s": len(texts) / wall, "at": time.time(),
                          "foreign_load": max(0.0, (busy - own) / (wall * len(cpus)))}), flush=True)
    if vectors is not None:
        np.save(spec["embeddings"], np.asarray(vectors, dtype=np.float32))
    return {"status": "ok"}


def _installed(name: str) -> bool:
    from importlib import metadata

    try:
        metadata.version(name)
        return True
    except metadata.PackageNotFoundError:
        return False


def worker_main(spec_file: str) -> int:
    spec = json.loads(Path(spec_file).read_text())
    try:
        found = worker_slices(spec) if spec.get("slices") else worker(spec)
    except BaseException as exc:  # the parent reports it as the peer's row
        found = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"[:600], "traceback": traceback.format_exc()}
    Path(spec["result"]).write_text(json.dumps(found))
    return 0 if found["status"] == "ok" else 1


# --- the parent -----------------------------------------------------------------------------------------------

def cpu_name() -> dict:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    flags = set(fields.get("Flags", "").split())
    wanted = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
              if f in flags]
    return {"model_name": fields.get("Model name", "?").strip(), "family": fields.get("CPU family", "?").strip(),
            "model": fields.get("Model", "?").strip(), "hypervisor": fields.get("Hypervisor vendor", "").strip(),
            "cpus": os.cpu_count(), "flags": wanted}


def isa_preset(flags: list[str]) -> str:
    """sentence-transformers' dynamic int8 preset for this CPU."""
    if "avx512_vnni" in flags:
        return "avx512_vnni"
    if "avx512f" in flags:
        return "avx512"
    return "avx2" if "avx2" in flags else "arm64"


def run_pinned(cmd: list[str], cores: list[int], threads: int, log: Path, timeout: float) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1"}
    import corescale  # its children run the same corescale as this process

    root = str(Path(corescale.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    from corescale.machine import instance_env

    # corescale's own spawn: pinned before exec, its own session, killed with this process (as a trial's workers)
    with log.open("w") as handle:
        child = instance_env.start(instance_env.Launch([], env, tuple(cores)), cmd, stdout=handle,
                                   stderr=subprocess.STDOUT)
        try:
            return child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            instance_env.kill(child)
            handle.write(f"\ntimed out after {timeout:.0f} s\n")
            return 124


class Bench:
    def __init__(self, args, out: Path):
        self.args, self.out = args, out
        self.cores = args.cores
        self.threads = len(self.cores)
        self.cpu = cpu_name()
        self.isa = isa_preset(self.cpu["flags"])
        self.errors: dict[str, str] = {}  # peer -> why it has no figures
        self.runs: dict[str, list[dict]] = {p: [] for p in args.peers}
        self.count = len(list((out / "runs").glob("*")))  # a rerun into the same --output adds its processes

    def python_of(self, peer: str) -> str:
        return sys.executable if peer == BASELINE else str(Path(self.args.peer_venv) / "bin" / "python")

    def st_process(self, peer: str, name: str, **spec) -> dict:
        self.count += 1
        folder = self.out / "runs" / f"{self.count:03d}-{peer}-{name}"
        folder.mkdir(parents=True)
        spec = {"peer": peer, "model": str(self.out / "st-model"), "isa": self.isa, "threads": self.threads,
                "batch": self.args.batch, "texts": str(self.out / "texts.json"),
                "embeddings": str(folder / "embeddings.npy"), "result": str(folder / "result.json"), **spec}
        (folder / "spec.json").write_text(json.dumps(spec))
        from contextlib import nullcontext

        from corescale.machine.lock import machine_lock

        # a measured encode() holds corescale's machine lock, as a corescale trial does: no trial runs beside it
        with machine_lock() if name.startswith("round") else nullcontext():
            rc = run_pinned([self.python_of(peer), str(Path(__file__).resolve()), "--worker",
                             str(folder / "spec.json")], self.cores, self.threads, folder / "log.txt",
                            self.args.timeout)
        result = folder / "result.json"
        found = json.loads(result.read_text()) if result.is_file() else {
            "status": "failed", "error": f"exit {rc}: " + tail(folder / "log.txt")}
        found["folder"] = str(folder)
        return found

    def ensure_venv(self) -> None:
        """The peers' own virtualenv: made when missing or broken; a failure is each such peer's error."""
        venv = Path(self.args.peer_venv)
        python = venv / "bin" / "python"

        def probe() -> str:
            if not python.is_file():
                return f"{python} does not exist"
            found = subprocess.run([str(python), "-c", "import sentence_transformers, datasets"],
                                   capture_output=True, text=True)
            return "" if found.returncode == 0 else found.stderr.strip().splitlines()[-1][:400]

        if not probe():
            return
        print(f"creating {venv} (sentence-transformers' CPU backends) ...", file=sys.stderr, flush=True)
        log = self.out / "peer-venv-install.log"
        with log.open("w") as handle:
            for step in ([sys.executable, "-m", "venv", str(venv)], [str(venv / "bin" / "pip"), "install",
                                                                      *PEER_PACKAGES]):
                if subprocess.run(step, stdout=handle, stderr=subprocess.STDOUT).returncode != 0:
                    break
        problem = probe()
        if problem:
            for peer in self.args.peers:
                if peer in ST_PEERS and peer != BASELINE:
                    self.errors[peer] = f"install failed (pip install {' '.join(PEER_PACKAGES)}): {problem}; " \
                        + tail(log, 2)

    def prepare(self) -> None:
        from corescale.workload import corpus
        from corescale.workload.models import resolve_model

        self.texts = corpus.texts(self.args.texts)
        (self.out / "texts.json").write_text(json.dumps(self.texts))
        source = Path(str(resolve_model("all-minilm-l6-v2").path))
        if not (self.out / "st-model").is_dir():
            shutil.copytree(source, self.out / "st-model")
        self.tokens = real_tokens(self.out / "st-model", self.texts)
        if any(p in ST_PEERS and p != BASELINE for p in self.args.peers):
            self.ensure_venv()
        calibration = corpus.texts(self.args.texts + CALIBRATION)[self.args.texts:]
        for peer in self.args.peers:
            if peer in ST_PEERS and peer != BASELINE and peer not in self.errors and \
                    not (self.out / "st-model" / MODEL_FILES[peer].format(isa=self.isa)).is_file():
                print(f"exporting {peer} ...", file=sys.stderr, flush=True)
                found = self.st_process(peer, "export", export=True, calibration=calibration)
                if found["status"] != "ok":
                    self.errors[peer] = "export failed: " + found["error"]
        print("reference: sentence-transformers torch fp32 ...", file=sys.stderr, flush=True)
        reference = self.st_process(BASELINE, "reference")
        if reference["status"] != "ok":
            raise SystemExit(f"the reference (sentence-transformers torch fp32) failed: {reference['error']}")
        import numpy as np

        self.reference = np.load(Path(reference["folder"]) / "embeddings.npy")
        if "corescale" in self.args.peers:
            self.corescale_overrides = self.args.corescale or self.tune_winner()

    def fixed(self) -> list[str]:
        """The keys every corescale run and tune here share: the same texts, batch size, padding and truncation."""
        count = len(self.texts)
        return ["model=all-minilm-l6-v2", "task=embed", "workload=builtin", "tokenize=true",
                f"workload.samples={count}", f"batch_size={self.args.batch}", f"sequence_length={MAX_LENGTH}",
                "pad=sorted", f"quality_samples={min(max(count, 10), 10_000)}", "calibrate=false"]

    def corescale_cmd(self, command: str, *words: str) -> list[str]:
        return [sys.executable, "-m", "corescale.cli", command, "--no-progress", *words]

    def tune_winner(self) -> list[str]:
        tune_dir = self.out / "tune"
        print(f"corescale tune (budget {self.args.tune_budget}) ...", file=sys.stderr, flush=True)
        log = self.out / "tune.log"
        rc = run_pinned(self.corescale_cmd("tune", *self.fixed(), f"budget={self.args.tune_budget}",
                                           f"output_dir={tune_dir}", "--no-report"),
                        self.cores, self.threads, log, self.args.timeout * 20)
        docs = sorted(tune_dir.glob("tune-*/tune.json"))
        if not docs:
            self.errors["corescale"] = f"tune failed (exit {rc}): " + tail(log)
            return []
        doc = json.loads(docs[-1].read_text())
        winner = next((f for f in [*doc["finalists"], *([doc["baseline"]] if doc.get("baseline") else [])]
                       if f["role"] == "winner"), None)
        if winner is None:
            self.errors["corescale"] = "the tune recommended nothing: " + tail(log)
            return []
        mine = {w.split("=", 1)[0] for w in self.fixed()} | {"output_dir", "duration", "min_iterations", "repeats",
                                                              "warmup.max_iterations", "tune.screen"}
        self.tune_doc = {"winner": doc.get("winner"), "headline": doc.get("headline"), "path": str(docs[-1])}
        return [w for w in winner["overrides"] if w.split("=", 1)[0] not in mine]

    def corescale_run(self) -> dict:
        self.count += 1
        folder = self.out / "runs" / f"{self.count:03d}-corescale"
        folder.mkdir(parents=True)
        rc = run_pinned(self.corescale_cmd("run", *self.fixed(), *self.corescale_overrides,
                                           f"duration={self.args.duration:g}", f"output_dir={folder / 'results'}"),
                        self.cores, self.threads, folder / "log.txt", self.args.timeout)
        results = list((folder / "results").glob("*/result.json"))
        if not results:
            return {"status": "failed", "error": f"exit {rc}: " + tail(folder / "log.txt"), "folder": str(folder)}
        record = json.loads(results[0].read_text())
        metrics = record.get("metrics") or {}
        withheld = (record.get("failure") or {}).get("kind") == "quality" and record.get("valid")
        # withheld on its own quality gate: its figures are valid; this script judges cosine p1 (GOAL_P1) itself
        return {"status": "ok" if withheld else record["status"], "error": record.get("reason"),
                "withheld": record.get("reason") if withheld else None, "folder": str(results[0].parent),
                "texts_per_s": metrics.get("throughput_samples_per_s"),
                "tokens_per_s": metrics.get("throughput_tokens_per_s"), "quality": record.get("quality"),
                "contaminated": metrics.get("contaminated"), "foreign_load": metrics.get("foreign_load"),
                "window_samples": metrics.get("samples_in_window"), "window_s": metrics.get("window_s")}

    def rounds(self) -> None:
        live = [p for p in self.args.peers if p not in self.errors]
        for round_number in range(self.args.repeats):
            for peer in live:
                if peer in self.errors:
                    continue
                print(f"[round {round_number + 1}/{self.args.repeats}] {peer} ...", file=sys.stderr, flush=True)
                found = self.corescale_run() if peer == "corescale" else \
                    self.st_process(peer, f"round{round_number + 1}")
                if peer != "corescale" and found["status"] == "ok":
                    import numpy as np

                    from corescale.measure.quality import embed_metrics

                    vectors = np.load(Path(found["folder"]) / "embeddings.npy")
                    found["quality"] = {"metrics": embed_metrics(vectors, self.reference)}
                    found["tokens_per_s"] = found["texts_per_s"] * self.tokens / len(self.texts)
                self.runs[peer].append(found)
                if found["status"] != "ok" and not any(r["status"] == "ok" for r in self.runs[peer]):
                    self.errors[peer] = found.get("error") or "failed"


    def slices(self) -> None:
        """Shared-host mode: every sentence-transformers peer loaded once in its own pinned process, then --slices
        short alternating slices (one encode() of the texts each; corescale: one `corescale run` of --duration s),
        in order on even slices and reversed on odd ones, the speed sentinel read on the cores before each slice and
        after the last. A slice's ratio compares figures taken seconds apart."""
        from corescale.machine import instance_env
        from corescale.machine.lock import machine_lock
        from corescale.measure.sentinel import Sentinel

        sentinel = Sentinel()
        self.sentinel: list[dict] = []
        live = [p for p in self.args.peers if p not in self.errors]
        workers: dict[str, tuple[subprocess.Popen, Path]] = {}
        for peer in [p for p in live if p != "corescale"]:
            self.count += 1
            folder = self.out / "runs" / f"{self.count:03d}-{peer}-slices"
            folder.mkdir(parents=True)
            spec = {"peer": peer, "model": str(self.out / "st-model"), "isa": self.isa, "threads": self.threads,
                    "batch": self.args.batch, "texts": str(self.out / "texts.json"), "slices": True,
                    "embeddings": str(folder / "embeddings.npy"), "result": str(folder / "result.json")}
            (folder / "spec.json").write_text(json.dumps(spec))
            env = {**os.environ, "OMP_NUM_THREADS": str(self.threads), "TOKENIZERS_PARALLELISM": "false",
                   "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
            child = instance_env.start(instance_env.Launch([], env, tuple(self.cores)),
                                       [self.python_of(peer), str(Path(__file__).resolve()), "--worker",
                                        str(folder / "spec.json")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=(folder / "log.txt").open("w"), text=True, bufsize=1)
            assert child.stdout is not None
            ready = child.stdout.readline()
            if '"ready"' not in ready:
                instance_env.kill(child)
                self.errors[peer] = "did not start: " + tail(folder / "log.txt")
                continue
            workers[peer] = (child, folder)
        live = [p for p in live if p not in self.errors]
        try:
            for number in range(self.args.slices):
                self.sentinel.append({**sentinel.read(self.cores, f"slice {number + 1}"), "slice": number + 1})
                for peer in (live if number % 2 == 0 else live[::-1]):
                    print(f"[slice {number + 1}/{self.args.slices}] {peer} ...", file=sys.stderr, flush=True)
                    if peer == "corescale":
                        found = self.corescale_run()
                    else:
                        child, folder = workers[peer]
                        assert child.stdin is not None and child.stdout is not None
                        with machine_lock():
                            child.stdin.write("go\n")
                            child.stdin.flush()
                            answer = child.stdout.readline()
                        found = json.loads(answer) if answer.strip() else {
                            "status": "failed", "error": "the worker ended: " + tail(folder / "log.txt")}
                        found["folder"] = str(folder)
                        if found["status"] == "ok":
                            found["tokens_per_s"] = found["texts_per_s"] * self.tokens / len(self.texts)
                    found["slice"] = number + 1
                    self.runs[peer].append(found)
            self.sentinel.append({**sentinel.read(self.cores, "end"), "slice": self.args.slices + 1})
        finally:
            for child, _ in workers.values():
                assert child.stdin is not None
                try:
                    child.stdin.write("stop\n")
                    child.stdin.close()
                    child.wait(timeout=120)
                except (OSError, subprocess.TimeoutExpired):
                    instance_env.kill(child)
        import numpy as np

        from corescale.measure.quality import embed_metrics

        for peer, (_, folder) in workers.items():
            if (folder / "embeddings.npy").is_file():
                metrics = {"metrics": embed_metrics(np.load(folder / "embeddings.npy"), self.reference)}
                for found in self.runs[peer]:
                    found["quality"] = metrics


def slice_ratios(bench: Bench, best: str | None) -> dict | None:
    """Per slice, corescale ÷ the best sentence-transformers backend measured in that slice; their mean with a 95 %
    interval over slices (Student's t), min and max; the sentinel's range over the run (ratio of each reading to
    the first), and which slices it moved around (their ratios are marked)."""
    from scipy import stats

    from corescale.measure.sentinel import moved

    if not best or not getattr(bench, "sentinel", None):
        return None
    ours = {r["slice"]: r["texts_per_s"] for r in bench.runs.get("corescale", []) if r.get("texts_per_s")}
    theirs = {r["slice"]: r["texts_per_s"] for r in bench.runs.get(best, []) if r.get("texts_per_s")}
    foreign = {r["slice"]: r.get("foreign_load") or 0.0 for peer in ("corescale", best)
               for r in sorted(bench.runs.get(peer, []), key=lambda r: r.get("foreign_load") or 0.0)}
    readings = {r["slice"]: r for r in bench.sentinel}
    rows = []
    for number in sorted(set(ours) & set(theirs)):
        around = [readings[n] for n in (number, number + 1) if n in readings]
        rows.append({"slice": number, "ratio": ours[number] / theirs[number], "corescale": ours[number],
                     best: theirs[number], "sentinel_moved": any(r["moved"] for r in around),
                     "foreign_load": foreign.get(number)})
    if not rows:
        return None
    ratios = [r["ratio"] for r in rows]
    mean = statistics.fmean(ratios)
    half = stats.t.ppf(0.975, len(ratios) - 1) * statistics.stdev(ratios) / len(ratios) ** 0.5 \
        if len(ratios) > 1 else float("nan")
    steady = [r["ratio"] for r in rows if not r["sentinel_moved"]]
    sentinel = [r["ratio"] for r in bench.sentinel]
    parts = {f"sentinel_{part}_range": [min(v), max(v)] for part in ("compute", "memory")
             if (v := [r[f"{part}_ratio"] for r in bench.sentinel if r.get(f"{part}_ratio") is not None])}
    return {**parts, "best": best, "slices": rows, "mean": mean, "interval95": [mean - half, mean + half],
            "min": min(ratios), "max": max(ratios), "steady_mean": statistics.fmean(steady) if steady else None,
            "steady_slices": len(steady), "sentinel_range": [min(sentinel), max(sentinel)],
            "sentinel_moved": any(moved(r) for r in sentinel), "sentinel": bench.sentinel}


def slices_text(found: dict) -> str:
    marks = " ".join(f"{r['ratio']:.2f}{'*' if r['sentinel_moved'] else ''} ({r['foreign_load'] or 0:.0%})"
                     for r in found["slices"])
    low, high = found["interval95"]
    steady = f"{found['steady_mean']:.2f}× over the {found['steady_slices']} slices it did not move around" \
        if found["steady_mean"] is not None else "no slice without a moved sentinel"
    return (f"corescale ÷ {found['best']} per slice (the worst foreign load of the two in brackets): {marks} (* the "
            "sentinel moved around that slice)\n"
            f"ratio {found['mean']:.2f}× (95 % interval over {len(found['slices'])} slices {low:.2f}–{high:.2f}×, "
            f"min {found['min']:.2f}×, max {found['max']:.2f}×); sentinel {found['sentinel_range'][0]:.2f}–"
            f"{found['sentinel_range'][1]:.2f}× its first reading (tolerance ±25 %{_parts(found)}); {steady}")


def _parts(found: dict) -> str:
    ranges = [f"{part} {found[f'sentinel_{part}_range'][0]:.2f}–{found[f'sentinel_{part}_range'][1]:.2f}×"
              for part in ("compute", "memory") if f"sentinel_{part}_range" in found]
    return f"; {', '.join(ranges)}" if ranges else ""


def tail(path: Path, lines: int = 6) -> str:
    text = path.read_text(errors="replace") if path.is_file() else ""
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])[-800:]


def real_tokens(folder: Path, texts: list[str]) -> int:
    """Tokens of the texts through the model's fast tokenizer, truncated as encode() truncates (specials in)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=MAX_LENGTH)
    return sum(len(e.ids) for e in tokenizer.encode_batch(texts))


# --- the summary ----------------------------------------------------------------------------------------------

def summary(bench: Bench) -> dict:
    rows = {}
    for peer in bench.args.peers:
        ok = [r for r in bench.runs[peer] if r["status"] == "ok" and r.get("texts_per_s")]
        rates = [r["texts_per_s"] for r in ok]
        if not rates:
            rows[peer] = {"error": bench.errors.get(peer) or next((r.get("error") for r in bench.runs[peer]), "no run")}
            continue
        metrics = (ok[0].get("quality") or {}).get("metrics") or {}
        rows[peer] = {"texts_per_s": {"best": max(rates), "mean": statistics.fmean(rates), "min": min(rates),
                                      "max": max(rates), "values": rates,
                                      "stdev": statistics.stdev(rates) if len(rates) > 1 else None},
                      "tokens_per_s": {"best": max(r["tokens_per_s"] for r in ok),
                                       "mean": statistics.fmean(r["tokens_per_s"] for r in ok)},
                      "quality": metrics, "foreign_load": [r.get("foreign_load") for r in ok],
                      "failed_repeats": len(bench.runs[peer]) - len(ok)}
        if peer == "corescale":
            rows[peer]["quality_section"] = ok[0].get("quality")
    return rows


def verdict(rows: dict) -> dict:
    """The issue's goal on the means: corescale >= 2x st-torch and >= 1.3x sentence-transformers' best CPU backend
    that keeps cosine p1 >= 0.99, with corescale's own cosine p1 >= 0.99."""
    def mean(peer):
        return rows.get(peer, {}).get("texts_per_s", {}).get("mean")

    measured = [p for p in ST_PEERS if mean(p)]
    keeping = [p for p in measured if rows[p]["quality"].get("cosine_p1", 0) >= GOAL_P1]
    best = max(keeping, key=mean) if keeping else None
    fastest = max(measured, key=mean) if measured else None
    found: dict[str, Any] = {"st_best_backend": best, "st_fastest_any_quality": fastest}
    if mean("corescale") and mean(BASELINE) and best:
        p1 = rows["corescale"]["quality"].get("cosine_p1", float("nan"))
        top = {p: rows[p]["texts_per_s"]["best"] for p in ("corescale", BASELINE, best)}
        found.update(vs_default=mean("corescale") / mean(BASELINE), vs_best=mean("corescale") / mean(best),
                     cosine_p1=p1, best_of={"vs_default": top["corescale"] / top[BASELINE],
                                            "vs_best": top["corescale"] / top[best]})
        found["met"] = bool(found["vs_default"] >= GOAL_DEFAULT and found["vs_best"] >= GOAL_BACKEND
                            and p1 >= GOAL_P1)
    return found


def table(rows: dict, best: str | None) -> str:
    def mean(peer):
        return rows.get(peer, {}).get("texts_per_s", {}).get("mean")

    lines = ["| peer | texts/s mean (min – max) | best | tokens/s (mean) | cos min / p1 / mean | recall@10 "
             f"| × {BASELINE} | × best ST backend ({best or '-'}) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for peer, row in rows.items():
        if "error" in row:
            lines.append(f"| {peer} | failed: {row['error'][:300]} | | | | | | |")
            continue
        rate, q = row["texts_per_s"], row["quality"]
        ratio = [f"{rate['mean'] / mean(ref):.2f}×" if mean(ref) else "-" for ref in (BASELINE, best)]
        cos = " / ".join(f"{q[k]:.4f}" for k in ("cosine_min", "cosine_p1", "cosine_mean")) if q else "-"
        recall = f"{q['recall_at_10']:.3f}" if "recall_at_10" in q else "-"
        lines.append(f"| {peer} | {rate['mean']:.1f} ({rate['min']:.1f} – {rate['max']:.1f}) | {rate['best']:.1f} "
                     f"| {row['tokens_per_s']['mean']:,.0f} | {cos} | {recall} | {ratio[0]} | {ratio[1]} |")
    return "\n".join(lines)


def cores_arg(text: str) -> list[int]:
    return [int(c) for c in text.split(",") if c]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker_main(argv[1])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=1000, help="texts of the built-in corpus (from its start)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="rounds; each peer once per round, fresh processes")
    parser.add_argument("--cores", type=cores_arg, default=sorted(os.sched_getaffinity(0))[:2],
                        help="CPUs every peer is pinned to (threads = their number); default: the first 2 usable")
    parser.add_argument("--peers", type=lambda s: s.split(","), default=list(PEERS))
    parser.add_argument("--peer-venv", default="/tmp/st-peers", help="sentence-transformers' CPU backends' venv")
    parser.add_argument("--tune-budget", default="5m")
    parser.add_argument("--duration", type=float, default=2.0, help="corescale's timed window (s), at least")
    parser.add_argument("--timeout", type=float, default=900.0, help="per process (s)")
    parser.add_argument("--slices", type=int, default=0,
                        help="shared-host mode: this many short alternating slices, the sentence-transformers peers "
                             "loaded once, the sentinel read between slices (instead of --repeats rounds)")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--corescale", nargs="+", default=None, metavar="OVERRIDE",
                        help="corescale's configuration (e.g. backend=onnxruntime instances=2); default: a tune's "
                             "winner")
    args = parser.parse_args(argv)
    unknown = [p for p in args.peers if p not in PEERS]
    if unknown or BASELINE not in args.peers:
        raise SystemExit(f"--peers: {BASELINE} is required (the baseline); choose from {', '.join(PEERS)}")
    if not 10 <= args.texts <= 1800 or args.repeats < 1 or not args.cores:
        raise SystemExit("--texts must be in [10, 1800], --repeats >= 1, --cores non-empty")
    out = args.output or Path(tempfile.mkdtemp(prefix="corescale-peers-"))
    out.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    bench = Bench(args, out)
    bench.prepare()
    if args.slices:
        bench.slices()
    else:
        bench.rounds()
    rows = summary(bench)
    found = verdict(rows)
    sliced = slice_ratios(bench, found.get("st_best_backend")) if args.slices else None
    cpu = bench.cpu
    where = f", {cpu['hypervisor']}" if cpu["hypervisor"] else ""
    title = (f"{cpu['model_name']} (family {cpu['family']} model {cpu['model']}{where}), "
             f"{cpu['cpus']} CPUs, flags {' '.join(cpu['flags'])}; pinned to CPUs {','.join(map(str, args.cores))} "
             f"with {bench.threads} threads; {started:%Y-%m-%d %H:%M} UTC")
    rounds = f"{args.slices} alternating slices (shared-host mode)" if args.slices else \
        f"{args.repeats} alternated rounds"
    print(f"**{title}**\n\nall-MiniLM-L6-v2, {len(bench.texts)} built-in texts ({bench.tokens:,} real tokens, "
          f"truncated at {MAX_LENGTH}), batch {args.batch}, {rounds}; corescale: "
          f"{' '.join(getattr(bench, 'corescale_overrides', []) or ['-'])}\n")
    best = found.get("st_best_backend")
    print(table(rows, best))
    if "met" in found:
        print(f"\ngoal (means): corescale ÷ {BASELINE} = {found['vs_default']:.2f}× (>= {GOAL_DEFAULT}), ÷ {best} = "
              f"{found['vs_best']:.2f}× (>= {GOAL_BACKEND}), its cosine p1 {found['cosine_p1']:.4f} (>= {GOAL_P1}): "
              f"{'met' if found['met'] else 'NOT met'}; on the best of each: "
              f"{found['best_of']['vs_default']:.2f}× and {found['best_of']['vs_best']:.2f}×")
    if sliced:
        print("\n" + slices_text(sliced))
    document = {"date": started.isoformat(), "cpu": cpu, "cores": args.cores, "threads": bench.threads,
                "texts": len(bench.texts), "real_tokens": bench.tokens, "batch": args.batch, "repeats": args.repeats,
                "isa_preset": bench.isa, "command": [Path(sys.argv[0]).name, *argv],
                "corescale_overrides": getattr(bench, "corescale_overrides", None),
                "tune": getattr(bench, "tune_doc", None), "peers": rows, "goal": found,
                "runs": bench.runs, "load_average": os.getloadavg(), "slices": sliced}
    (out / "peers.json").write_text(json.dumps(document, indent=1, default=str))
    print(f"\nraw figures: {out / 'peers.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
