"""Issue 54's benchmarks: `corescale embed` against the bundle's own offline throughput (P14), against
sentence-transformers on the same cores and texts, killed and resumed, its memory through a long corpus, and on
Ray Data against the nodes' single-machine sum. Each part's runs alternate within a round, fresh processes each.

    python benchmarks/embed.py [--parts p14,st,kill,ray,rss] [--texts 20000] [--rounds 2] [--cores 0,1]
                               [--rss-texts 1000000] [--output DIR] [BUNDLE OVERRIDES ...]

The corpus: corescale's built-in corpus of real texts (corescale/data/corpus.jsonl: Debian package descriptions,
PyPI summaries), repeated in a seeded shuffle to --texts rows, as Parquet (id, text); the lengths are the corpus's.
The bundle: `corescale run model=all-minilm-l6-v2 scenario=offline workload=<the corpus's first 2,000 texts>
OVERRIDES --bundle` (default OVERRIDES: backend=onnxruntime precision=fp32 instances=2 cores_per_instance=1
batch_size=32 pad=sorted sequence_length=256; give a tune's winner's keys to measure what it chose).
- p14: `corescale embed BUNDLE corpus.parquet` (its manifest's texts/s: rows computed over the job's window, the
  instances' start excluded) ÷ `corescale run OVERRIDES` again on the same texts (the bundle's configuration
  measured offline, samples/s). Goal >= 0.95.
- st: sentence-transformers 6 (torch) on the same texts and cores, as people run it: `encode()` (its own length
  sort, batch 32, threads = cores), and `encode_multi_process` with one process per core (1 thread each; ST does
  not pin them); each warmed up, then one call over every text timed. Quality: each corescale vector's cosine to
  ST's. Goal: corescale ÷ the faster >= 1.5 (no int8 artifact) or >= 3 (an int8 artifact that passed the gate).
- kill: the p14 job SIGKILLed at a seeded random point, started again; its shards against an uninterrupted run's
  (ids and vectors, row for row).
- ray: a Ray cluster of two nodes on loopback (tests/ray_clusters.py), node i pinned to CPU i with 1 CPU; the bundle
  measured as 1 instance x 1 core; each round `embed` alone under `taskset -c 0`, then `-c 1` (its instance placed
  on that CPU), then `embed --ray`, every run with 500-row shards (enough to keep both nodes busy to the end); Ray ÷
  (the two single-CPU figures' sum). Goal >= 0.9.
- rss: `embed` of --rss-texts rows through a bert-tiny bundle (one instance per core); the resident memory of the
  job's process tree sampled each second beside the rows written; the largest after 10,000 rows ÷ the first sample
  past 10,000. Goal <= 1.2.
Prints one line per part and writes DIR/embed.json with every raw figure and the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ["backend=onnxruntime", "precision=fp32", "instances=2", "cores_per_instance=1", "batch_size=32",
           "pad=sorted", "sequence_length=256"]
SAMPLE = 2000  # texts of the offline workload (the bundle's and P14's)
ST_BATCH = 32
WARMUP_TEXTS = 256
RAY_SHARD_ROWS = 500  # the ray part's shards (each run's): the last shards' imbalance a small share of the job


def cli(*words: str, env: dict | None = None, prefix: tuple[str, ...] = (), timeout: float = 7200):
    return subprocess.run([*prefix, sys.executable, "-m", "corescale.cli", *words], cwd=ROOT, capture_output=True,
                          text=True, env=env, timeout=timeout)


def checked(proc, what: str):
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed (exit {proc.returncode}): {proc.stderr[-3000:]}")
    return proc


# --- the corpus and the bundle ----------------------------------------------------------------------------------

def make_corpus(out: Path, rows: int) -> tuple[Path, Path]:
    """(corpus.parquet of `rows` real texts, sample.jsonl of its first SAMPLE)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [json.loads(line)["text"] for line in (ROOT / "corescale/data/corpus.jsonl").read_text().splitlines()
             if line.strip()]
    rng = random.Random(54)
    picked: list[str] = []
    while len(picked) < rows:
        copy = texts[:]
        rng.shuffle(copy)
        picked += copy
    picked = picked[:rows]
    corpus = out / f"corpus-{rows}.parquet"
    if not corpus.exists():
        pq.write_table(pa.table({"id": [f"t{i}" for i in range(rows)], "text": picked}), corpus,
                       row_group_size=8192)
    sample = out / "sample.jsonl"
    sample.write_text("".join(json.dumps({"text": t}) + "\n" for t in picked[:SAMPLE]))
    return corpus, sample


def offline_words(model: str, sample: Path, overrides: list[str]) -> list[str]:
    return [f"model={model}", "task=embed", "scenario=offline", f"workload={sample}:text",
            f"workload.samples={SAMPLE}", *overrides]


def bundle(out: Path, words: list[str], name: str) -> Path:
    folder = out / name
    if not (folder / "manifest.json").is_file():
        checked(cli("run", "--no-progress", *words, f"output_dir={out / (name + '-run')}", "--bundle", str(folder)),
                f"measuring the bundle {name}")
    return folder


def offline_rate(out: Path, words: list[str], tag: str) -> float:
    """samples/s of `corescale run WORDS` (a fresh process, a fresh folder)."""
    where = out / f"offline-{tag}"
    checked(cli("run", "--no-progress", "--rerun", *words, f"output_dir={where}"), f"offline run {tag}")
    found = max(where.glob("*/result.json"), key=lambda p: p.stat().st_mtime)
    return float(json.loads(found.read_text())["metrics"]["throughput_samples_per_s"])


def embed(folder: Path, corpus: Path, out: Path, *extra: str, prefix: tuple[str, ...] = (),
          env: dict | None = None) -> dict:
    """`corescale embed` into a fresh `out`; its manifest."""
    checked(cli("embed", str(folder), str(corpus), str(out), "--id-column", "id", "--no-progress", *extra,
                prefix=prefix, env=env), f"embed into {out.name}")
    return json.loads((out / "manifest.json").read_text())


def vectors(folder: Path, rows: int | None = None):
    import numpy as np
    import pyarrow.parquet as pq

    tables = [pq.read_table(p) for p in sorted(folder.glob("shard-*.parquet"))]
    ids = [i for t in tables for i in t["id"].to_pylist()]
    found = np.concatenate([np.asarray(t["embedding"].combine_chunks().flatten()).reshape(t.num_rows, -1)
                            for t in tables])
    return (ids[:rows], found[:rows]) if rows else (ids, found)


# --- sentence-transformers, in a pinned process of its own ------------------------------------------------------

def st_worker(spec: dict) -> dict:
    import numpy as np
    import pyarrow.parquet as pq
    import torch
    from sentence_transformers import SentenceTransformer

    texts = pq.read_table(spec["corpus"], columns=["text"])["text"].to_pylist()
    model = SentenceTransformer(spec["model"], device="cpu")
    if spec["mode"] == "encode":
        torch.set_num_threads(spec["threads"])
        model.encode(texts[:WARMUP_TEXTS], batch_size=ST_BATCH)
        started = time.perf_counter()
        found = model.encode(texts, batch_size=ST_BATCH, normalize_embeddings=True, convert_to_numpy=True)
        wall = time.perf_counter() - started
    else:
        pool = model.start_multi_process_pool(["cpu"] * spec["processes"])
        try:
            model.encode_multi_process(texts[:WARMUP_TEXTS * spec["processes"]], pool, batch_size=ST_BATCH)
            started = time.perf_counter()
            found = model.encode_multi_process(texts, pool, batch_size=ST_BATCH, normalize_embeddings=True)
            wall = time.perf_counter() - started
        finally:
            model.stop_multi_process_pool(pool)
    np.save(spec["vectors"], np.asarray(found, np.float32)[:SAMPLE])
    import sentence_transformers

    return {"texts_per_s": len(texts) / wall, "seconds": wall, "st": sentence_transformers.__version__,
            "torch": torch.__version__}


def st_rate(out: Path, corpus: Path, model: str, mode: str, cores: list[int], tag: str) -> dict:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from peers import run_pinned

    spec = {"corpus": str(corpus), "model": model, "mode": mode, "threads": len(cores), "processes": len(cores),
            "vectors": str(out / f"st-{mode}-{tag}.npy"), "result": str(out / f"st-{mode}-{tag}.json")}
    (out / f"st-{mode}-{tag}.spec").write_text(json.dumps(spec))
    code = run_pinned([sys.executable, __file__, "--worker", str(out / f"st-{mode}-{tag}.spec")], cores,
                      len(cores) if mode == "encode" else 1, out / f"st-{mode}-{tag}.log", 3600)
    if code != 0:
        raise SystemExit(f"sentence-transformers {mode} failed: {(out / f'st-{mode}-{tag}.log').read_text()[-2000:]}")
    return json.loads(Path(spec["result"]).read_text())


# --- the parts ---------------------------------------------------------------------------------------------------

def part_p14_st(args, out: Path, report: dict, with_st: bool) -> None:
    import numpy as np

    from corescale.workload.models import resolve_model

    corpus, sample = make_corpus(out, args.texts)
    words = offline_words("all-minilm-l6-v2", sample, args.overrides)
    folder = bundle(out, words, "bundle")
    model = str(resolve_model("all-minilm-l6-v2").path)
    rounds = []
    for number in range(args.rounds):
        row: dict = {"round": number + 1}
        job = out / f"embed-r{number + 1}"
        order = ["embed", "offline", *(["encode", "multi"] if with_st else [])]
        for what in order if number % 2 == 0 else order[::-1]:
            if what == "embed":
                row["embed"] = embed(folder, corpus, job)["this_run"]
            elif what == "offline":
                row["offline"] = offline_rate(out, words, f"r{number + 1}")
            else:
                row[what] = st_rate(out, corpus, model, "encode" if what == "encode" else "multi", args.cores,
                                    f"r{number + 1}")
        row["p14"] = row["embed"]["texts_per_s"] / row["offline"]
        if with_st:
            best = max(row["encode"]["texts_per_s"], row["multi"]["texts_per_s"])
            row["over_st"] = row["embed"]["texts_per_s"] / best
            _, ours = vectors(job, SAMPLE)
            theirs = np.load(out / f"st-encode-r{number + 1}.npy")
            ours = ours / np.linalg.norm(ours, axis=1, keepdims=True)
            row["cosine_to_st"] = {"min": float((ours * theirs).sum(1).min()),
                                   "mean": float((ours * theirs).sum(1).mean())}
        rounds.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "embed"} |
                         {"embed_texts_per_s": row["embed"]["texts_per_s"]}), flush=True)
    report["p14"] = {"bundle": words, "texts": args.texts, "rounds": rounds,
                     "p14_mean": statistics.mean(r["p14"] for r in rounds),
                     **({"over_st_mean": statistics.mean(r["over_st"] for r in rounds)} if with_st else {})}
    report["p14"]["manifest"] = json.loads((out / "embed-r1" / "manifest.json").read_text())


def part_kill(args, out: Path, report: dict) -> None:
    import numpy as np

    corpus, sample = make_corpus(out, args.texts)
    folder = bundle(out, offline_words("all-minilm-l6-v2", sample, args.overrides), "bundle")
    whole = out / "embed-r1"
    if not (whole / "manifest.json").exists():
        embed(folder, corpus, whole)
    cut = out / "embed-killed"
    rng = random.Random(args.seed)
    command = [sys.executable, "-m", "corescale.cli", "embed", str(folder), str(corpus), str(cut), "--id-column",
               "id", "--no-progress"]
    job = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           start_new_session=True)
    wall = json.loads((whole / "manifest.json").read_text())["this_run"]["wall_s"]
    after = rng.uniform(0.2, 0.8) * wall
    while not cut.joinpath("job.json").exists() and job.poll() is None:
        time.sleep(0.05)
    time.sleep(after)
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    left = len(list(cut.glob("shard-*.parquet")))
    checked(cli("embed", str(folder), str(corpus), str(cut), "--id-column", "id", "--no-progress"), "the restart")
    a_ids, a = vectors(whole)
    b_ids, b = vectors(cut)
    report["kill"] = {"killed_after_s": after, "shards_left": left, "rows": len(b_ids), "same_ids": a_ids == b_ids,
                      "max_abs_diff": float(np.abs(a - b).max()) if a.shape == b.shape else None,
                      "identical": bool(a.shape == b.shape and (a == b).all())}
    print(json.dumps(report["kill"]), flush=True)


def part_ray(args, out: Path, report: dict) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from ray_clusters import CPUS, RAY_ENV, pinned_nodes

    corpus, sample = make_corpus(out, args.texts)
    one = [w for w in args.overrides if w.split("=")[0] not in ("instances", "cores_per_instance")]
    folder = bundle(out, offline_words("all-minilm-l6-v2", sample, [*one, "instances=1", "cores_per_instance=1"]),
                    "bundle-1x1")
    rounds = []
    with pinned_nodes(2) as cluster:
        env = {**os.environ, **RAY_ENV, "RAY_TMPDIR": str(cluster.tmp)}
        for number in range(args.rounds):
            row: dict = {"round": number + 1}
            order = ["cpu0", "cpu1", "ray"]
            for what in order if number % 2 == 0 else order[::-1]:
                job = out / f"ray-{what}-r{number + 1}"
                shards = ("--shard-rows", str(RAY_SHARD_ROWS))  # enough shards to keep both nodes busy to the end
                if what == "ray":
                    row[what] = embed(folder, corpus, job, *shards, "--ray", cluster.address, env=env)["this_run"]
                else:
                    cpu = CPUS[int(what[-1])]
                    row[what] = embed(folder, corpus, job, *shards, prefix=("taskset", "-c", str(cpu)))["this_run"]
            row["ratio"] = row["ray"]["texts_per_s"] / (row["cpu0"]["texts_per_s"] + row["cpu1"]["texts_per_s"])
            rounds.append(row)
            print(json.dumps({k: (v["texts_per_s"] if isinstance(v, dict) else v) for k, v in row.items()}),
                  flush=True)
    report["ray"] = {"rounds": rounds, "ratio_mean": statistics.mean(r["ratio"] for r in rounds)}


def tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and every descendant."""
    import psutil

    try:
        root = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
    except psutil.Error:
        return 0


def part_rss(args, out: Path, report: dict) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    corpus, _ = make_corpus(out, args.texts)
    big = out / f"corpus-{args.rss_texts}.parquet"
    if not big.exists():
        base = pq.read_table(corpus)
        with pq.ParquetWriter(big, base.schema) as writer:
            for start in range(0, args.rss_texts, len(base)):
                part = base.slice(0, min(len(base), args.rss_texts - start))
                writer.write_table(pa.table({"id": [f"t{start + i}" for i in range(len(part))],
                                             "text": part["text"]}), row_group_size=8192)
    folder = bundle(out, ["model=bert-tiny", "task=embed", "backend=onnxruntime", f"instances={len(args.cores)}",
                          "cores_per_instance=1", "batch_size=32", "sequence_length=128", "duration=1"], "tiny")
    where = out / "rss-job"
    job = subprocess.Popen([sys.executable, "-m", "corescale.cli", "embed", str(folder), str(big), str(where),
                            "--id-column", "id", "--no-progress", "--truncate"], cwd=ROOT,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    samples = []
    began = time.monotonic()
    while job.poll() is None:
        rows = 8192 * len(list(where.glob("shard-*.parquet"))) if where.is_dir() else 0
        samples.append((time.monotonic() - began, rows, tree_rss(job.pid)))
        time.sleep(1.0)
    if job.returncode != 0:
        raise SystemExit(f"the rss job failed: {job.stderr.read()[-2000:] if job.stderr else ''}")
    past = [s for s in samples if s[1] >= 10_000]
    first, most = (past[0][2], max(s[2] for s in past)) if past else (None, None)
    report["rss"] = {"texts": args.rss_texts, "samples": samples, "rss_at_10k": first, "rss_max_after": most,
                     "ratio": most / first if first and most else None,
                     "manifest": json.loads((where / "manifest.json").read_text())["this_run"]}
    print(json.dumps({k: v for k, v in report["rss"].items() if k != "samples"}), flush=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--worker"]:
        spec = json.loads(Path(argv[1]).read_text())
        Path(spec["result"]).write_text(json.dumps(st_worker(spec)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="p14,st,kill,ray,rss")
    parser.add_argument("--texts", type=int, default=20_000)
    parser.add_argument("--rss-texts", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cores", default=",".join(map(str, sorted(os.sched_getaffinity(0)))))
    parser.add_argument("--seed", type=int, default=54)
    parser.add_argument("--output", type=Path, default=Path("outputs/embed-benchmark"))
    args, overrides = parser.parse_known_args(argv)
    args.overrides = overrides or DEFAULT
    args.cores = [int(c) for c in args.cores.split(",")]
    out = args.output.resolve()
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from peers import cpu_name

    report: dict = {"cpu": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "overrides": args.overrides, "parts": args.parts}
    parts = args.parts.split(",")
    if "p14" in parts or "st" in parts:
        part_p14_st(args, out, report, "st" in parts)
    if "kill" in parts:
        part_kill(args, out, report)
    if "ray" in parts:
        part_ray(args, out, report)
    if "rss" in parts:
        part_rss(args, out, report)
    (out / "embed.json").write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps({"cpu": report["cpu"]["model_name"], **{k: report[k].get(m) for k, m in
                      (("p14", "p14_mean"), ("ray", "ratio_mean"), ("rss", "ratio")) if k in report}}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
