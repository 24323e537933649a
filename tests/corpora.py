"""Corpora for `corescale embed`'s tests, and what a job wrote (tests/test_embed.py, tests/test_embed_ray.py)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq

WORDS = ["serving", "transformer", "models", "on", "cpus", "needs", "pinned", "cores", "careful", "batching",
         "honest", "measurement", "of", "every", "number", "a", "performance", "engineer", "reads", "twice"]


def corpus(path, rows: int, bad: dict[int, object] | None = None, seed: int = 0):
    rng = np.random.default_rng(seed)
    with open(path, "w") as file:
        for i in range(rows):
            text = " ".join(rng.choice(WORDS, int(rng.integers(1, 40))))
            file.write(json.dumps({"id": f"doc-{i}", "text": (bad or {}).get(i, text)}) + "\n")
    return path


def shards(folder):
    """Every written row of the job: (row, id) in order and the vectors."""
    tables = [pq.read_table(p) for p in sorted(folder.glob("shard-*.parquet"))]
    keys = [(r, i) for t in tables for r, i in zip(t["row"].to_pylist(), t["id"].to_pylist())]
    vectors = np.concatenate([np.asarray(t["embedding"].combine_chunks().flatten()).reshape(t.num_rows, -1)
                              for t in tables])
    return keys, vectors
