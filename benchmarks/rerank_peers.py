"""The reranker peer: sentence-transformers' out-of-the-box `CrossEncoder(dir, device="cpu").predict(pairs,
batch_size=B)` against a corescale configuration on the same (query, document) pairs, alternated in fresh processes.

    python benchmarks/rerank_peers.py [--model DIR] [--batch 16] [--repeats 3] [--duration 2] [--queries 16]
                                      [--output DIR] [--corescale OVERRIDES...]

Both sides are `corescale run` of the built-in rerank sets (corescale/workload/corpus.py: each query a package's
one-line description, 16 candidates: its own paragraphs and TF-IDF hard negatives) with the tokenizer inside the
timed call (`workload=builtin tokenize=true task=rerank`): the peer is `backend=sentence_transformers`, whose
timed call is exactly CrossEncoder.predict (corescale/backends/sentence_transformers/), so both are placed, timed
and judged by the same harness. pairs/s is samples/s of the timed window; quality is each run's own section against
the fp32 PyTorch reference of the same model on --queries × 16 pairs: NDCG@10 (mean, min), Kendall tau (mean, min),
top-1 agreement. The peer's sigmoid is monotone: the rank metrics judge it as they judge the logits.

The model: no trained cross-encoder is packaged on PyPI as far as we found (the package lists hold none; the hub is
not reachable here), so by default a config-built BERT cross-encoder of ms-marco-MiniLM-L6-v2's shape (6 layers,
384 wide, 12 heads, one label, seeded random weights) with all-MiniLM-L6-v2's WordPiece tokenizer is saved to
DIR/cross-encoder. Its speed is a trained model's (same shapes); its scores mean nothing, its agreement with its own
reference does. --model DIR takes a real cross-encoder directory instead.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PEER, OURS = "st-crossencoder", "corescale"
METRICS = ("ndcg_at_10_mean", "ndcg_at_10_min", "kendall_tau_mean", "kendall_tau_min", "top1_agreement")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def build_cross_encoder(folder: Path) -> Path:
    """A BertForSequenceClassification with one label, ms-marco-MiniLM-L6-v2's shape, seeded, as a directory."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from corescale.workload.models import resolve_model

    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=6, hidden_size=384, num_attention_heads=12, intermediate_size=1536,
                        num_labels=1, id2label={0: "score"}, label2id={"score": 0})
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer = Path(str(resolve_model("all-minilm-l6-v2").path))
    for name in TOKENIZER_FILES:
        if (tokenizer / name).is_file():
            shutil.copy(tokenizer / name, folder / name)
    return folder


def run(words: list[str], folder: Path, timeout: float) -> dict:
    """One `corescale run` in a fresh process: pairs/s and the quality section (or why it failed)."""
    folder.mkdir(parents=True)
    log = folder / "log.txt"
    with log.open("w") as handle:
        rc = subprocess.run([sys.executable, "-m", "corescale.cli", "run", "--no-progress", *words,
                             f"output_dir={folder / 'results'}"], stdout=handle, stderr=subprocess.STDOUT,
                            timeout=timeout).returncode
    results = list((folder / "results").glob("*/result.json"))
    if not results:
        return {"status": "failed", "error": f"exit {rc}: " + " | ".join(log.read_text().splitlines()[-4:])}
    record = json.loads(results[0].read_text())
    metrics = record.get("metrics") or {}
    return {"status": record["status"], "pairs_per_s": metrics.get("throughput_samples_per_s"),
            "contaminated": metrics.get("contaminated"), "quality": (record.get("quality") or {}).get("metrics"),
            "path": str(results[0].parent)}


def summary(runs: list[dict]) -> dict:
    ok = [r for r in runs if r["status"] == "ok" and r.get("pairs_per_s")]
    if not ok:
        return {"error": next((r.get("error") for r in runs), "no run")}
    rates = [r["pairs_per_s"] for r in ok]
    return {"pairs_per_s": {"mean": statistics.fmean(rates), "min": min(rates), "max": max(rates),
                            "values": rates}, "quality": ok[0]["quality"] or {}, "failed_repeats": len(runs) - len(ok)}


def table(rows: dict) -> str:
    base = rows.get(PEER, {}).get("pairs_per_s", {}).get("mean")
    lines = ["| peer | pairs/s mean (min – max) | NDCG@10 mean / min | Kendall tau mean / min | top-1 | "
             f"× {PEER} |", "|---|---:|---:|---:|---:|---:|"]
    for name, row in rows.items():
        if "error" in row:
            lines.append(f"| {name} | failed: {row['error'][:300]} | | | | |")
            continue
        rate, q = row["pairs_per_s"], row["quality"]
        pair = [" / ".join(f"{q.get(k, float('nan')):.4f}" for k in keys)
                for keys in (METRICS[:2], METRICS[2:4])]
        ratio = f"{rate['mean'] / base:.2f}×" if base else "-"
        lines.append(f"| {name} | {rate['mean']:.1f} ({rate['min']:.1f} – {rate['max']:.1f}) | {pair[0]} | {pair[1]} "
                     f"| {q.get('top1_agreement', float('nan')):.3f} | {ratio} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="a cross-encoder directory (default: built)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="rounds; each side once per round, fresh processes")
    parser.add_argument("--duration", type=float, default=2.0, help="each timed window (s)")
    parser.add_argument("--queries", type=int, default=16, help="quality: queries × 16 candidate pairs")
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--timeout", type=float, default=900.0, help="per process (s)")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--corescale", nargs="+", default=["backend=onnxruntime"], metavar="OVERRIDE",
                        help="corescale's configuration (default: backend=onnxruntime)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.batch < 1 or not 1 <= args.queries <= 600:
        raise SystemExit("--repeats and --batch must be >= 1, --queries in [1, 600]")
    out = args.output or Path(tempfile.mkdtemp(prefix="corescale-rerank-peers-"))
    out.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    model = args.model or build_cross_encoder(out / "cross-encoder")
    shared = [f"model={model}", "task=rerank", "workload=builtin", "tokenize=true", f"batch_size={args.batch}",
              f"sequence_length={args.sequence_length}", f"duration={args.duration:g}", "calibrate=false",
              f"quality_samples={max(10, args.queries * 16)}"]
    sides = {PEER: ["backend=sentence_transformers"], OURS: list(args.corescale)}
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    count = len(list((out / "runs").glob("*")))
    for round_number in range(args.repeats):
        for name, words in sides.items():
            print(f"[round {round_number + 1}/{args.repeats}] {name} ...", file=sys.stderr, flush=True)
            count += 1
            runs[name].append(run([*shared, *words], out / "runs" / f"{count:03d}-{name}", args.timeout))
    rows = {name: summary(found) for name, found in runs.items()}
    from peers import cpu_name  # this folder is the script's: the embed peers' CPU line

    cpu = cpu_name()
    print(f"**{cpu['model_name']} (family {cpu['family']} model {cpu['model']}), {cpu['cpus']} CPUs, flags "
          f"{' '.join(cpu['flags'])}; {started:%Y-%m-%d %H:%M} UTC**\n\n{'built' if args.model is None else 'given'} "
          f"cross-encoder {model}, built-in rerank sets, batch {args.batch}, sequence_length {args.sequence_length}, "
          f"{args.repeats} alternated rounds; corescale: {' '.join(args.corescale)}\n")
    print(table(rows))
    (out / "rerank_peers.json").write_text(json.dumps(
        {"date": started.isoformat(), "cpu": cpu, "model": str(model), "built": args.model is None, "shared": shared,
         "sides": sides, "peers": rows, "runs": runs}, indent=1, default=str))
    print(f"\nraw figures: {out / 'rerank_peers.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
