"""Real text through a real tokenizer: padding policies compared on one workload, real tokens/s each.

    python benchmarks/real_text.py [--model bert-base] [--sequence-length 128] [--batch 8] [--repeats 2]

The corpus is the prose of the installed packages' descriptions (every *.dist-info/METADATA paragraph of at
least 5 words; real English with a long-tailed length distribution); a WordPiece tokenizer is trained on it
(`tokenizers`, no hub) and saved as a local BertTokenizerFast. The closed loop (offline) then runs with
pad=max (each batch to its longest), pad=bucket (to 16/32/64/128) and pad=sorted (length-sorted batches),
alternated over --repeats rounds in fresh processes; every timed window covers each batch of the query set at
least once (in a seeded random order); prints samples/s, real tokens/s and padding waste (medians).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import sysconfig
import tempfile
from pathlib import Path

POLICIES = ("max", "bucket", "sorted")


def corpus(limit: int = 4000) -> list[str]:
    paragraphs = []
    for meta in sorted(Path(sysconfig.get_paths()["purelib"]).glob("*.dist-info/METADATA")):
        body = meta.read_text(errors="replace").split("\n\n", 1)[-1]
        for block in re.split(r"\n\s*\n", body):
            text = " ".join(block.split())
            if len(text.split()) >= 5 and not re.search(r"[{}<>=`|#]|\$ |>>>", text):
                paragraphs.append(text)
    return paragraphs[:limit]


def tokenizer_dir(texts: list[str], out: Path) -> Path:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(
        vocab_size=8000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[(t, tok.token_to_id(t)) for t in ("[CLS]", "[SEP]")])
    BertTokenizerFast(tokenizer_object=tok).save_pretrained(out / "tokenizer")
    return out / "tokenizer"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-base")
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--samples", type=int, default=256, help="queries; each window covers all their batches")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()

    from _loop import measure

    out = Path(args.output or tempfile.mkdtemp(prefix="corescale-text-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    texts = corpus()
    (out / "corpus.txt").write_text("\n".join(texts) + "\n")
    tokenizer = tokenizer_dir(texts, out)
    base = [f"model={args.model}", f"sequence_length={args.sequence_length}", f"batch_size={args.batch}",
            f"duration={args.duration}", f"output_dir={out / 'results'}", "calibrate=false",
            f"workload={out / 'corpus.txt'}", f"workload.tokenizer={tokenizer}", f"workload.samples={args.samples}"]
    measured = measure({f"pad={pad}": [*base, f"pad={pad}"] for pad in POLICIES}, args.repeats)
    runs = {pad: measured[f"pad={pad}"] for pad in POLICIES}
    lengths = runs["max"][0].workload  # the query set's summary, as the trial recorded it
    print(f"{len(texts)} paragraphs, {lengths['queries']} queries used; tokens per query: mean "
          f"{lengths['mean_length']:.1f}, p50 {lengths['p50_length']:.0f}, p90 {lengths['p90_length']:.0f}, max "
          f"{lengths['max_length']} (truncated at {args.sequence_length}); model {args.model}, batch {args.batch}\n")
    print("| pad | samples/s | real tokens/s | padded tokens/s | padding waste | vs pad=max |")
    print("|---|---|---|---|---|---|")
    median = {pad: statistics.median(r.metrics.throughput_tokens_per_s for r in records)
              for pad, records in runs.items()}
    for pad, records in runs.items():
        m = [r.metrics for r in records]
        waste = records[0].workload["padding_waste"]
        print(f"| {pad} | {statistics.median(x.throughput_samples_per_s for x in m):.2f} | {median[pad]:.0f} | "
              f"{statistics.median(x.padded_tokens_per_s for x in m):.0f} | {waste:.0%} | "
              f"{median[pad] / median['max']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
