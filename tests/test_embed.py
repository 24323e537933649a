"""`corescale embed`: a real corpus job through a measured bert-tiny bundle's pinned instances, in a folder whose
name has spaces and non-ASCII letters; its vectors are the service's; killed and started again it equals an
uninterrupted run row for row; bad input is one line, exit 2, nothing written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest
from corpora import corpus, shards
from helpers import ROOT, corescale

pytestmark = pytest.mark.slow

@pytest.fixture
def place(tmp_path):
    folder = tmp_path / "a corpus folder ünï"
    folder.mkdir()
    return folder


def test_a_corpus_goes_through_the_bundle_in_order_with_its_rejects_and_the_services_vectors(
        tiny_bundle, tiny_service, place):
    source = corpus(place / "texts.jsonl", 300, {5: "", 17: None, 40: "word " * 700})  # 40: past bert-tiny's 512
    out = place / "vectors out"
    proc = corescale("embed", str(tiny_bundle()), str(source), str(out), "--id-column", "id", "--shard-rows", "64",
                     "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "estimate: 300 rows" in proc.stderr and "texts/s" in proc.stderr
    keys, vectors = shards(out)
    kept = [i for i in range(300) if i not in (5, 17, 40)]
    assert keys == [(i, f"doc-{i}") for i in kept]  # input order, every readable row once
    rejects = {r["row"]: r["reason"] for p in sorted(out.glob("rejects-*.parquet"))
               for r in pq.read_table(p).to_pylist()}
    assert set(rejects) == {5, 17, 40}
    assert "empty" in rejects[5] and "null" in rejects[17] and "tokens" in rejects[40]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["rows_written"] == 297 and manifest["rows_rejected"] == 3
    assert manifest["task"] == "embed" and manifest["layout"]["instances"] and manifest["this_run"]["texts_per_s"] > 0
    texts = [json.loads(line)["text"] for line in source.read_text().splitlines()]
    served = httpx.post(f"{tiny_service().url}/embed", json={"inputs": [texts[i] for i in kept[:8]]}, timeout=60)
    assert served.status_code == 200, served.text
    mine = vectors[:8] / np.linalg.norm(vectors[:8], axis=1, keepdims=True)
    assert np.allclose(mine, np.asarray(served.json()), atol=1e-4)  # the same engine, the same artifact


def test_killed_or_stopped_and_started_again_it_equals_an_uninterrupted_run(tiny_bundle, place):
    source = corpus(place / "texts.jsonl", 2400, seed=1)
    whole, cut = place / "whole", place / "cut"
    args = [str(tiny_bundle()), str(source)]
    options = ["--id-column", "id", "--shard-rows", "100", "--no-progress"]
    assert corescale("embed", *args, str(whole), *options).returncode == 0
    for sig in (signal.SIGTERM, signal.SIGKILL):  # stopped, then killed at a point where shards are complete
        job = subprocess.Popen([sys.executable, "-m", "corescale.cli", "embed", *args, str(cut), *options],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
        deadline = time.monotonic() + 120
        before = len(list(cut.glob("shard-*.parquet"))) if cut.exists() else 0
        while time.monotonic() < deadline and job.poll() is None and \
                len(list(cut.glob("shard-*.parquet"))) < before + 2:
            time.sleep(0.05)
        assert job.poll() is None, job.communicate()[1][-2000:]
        os.killpg(job.pid, sig)
        _, err = job.communicate(timeout=60)
        assert job.returncode == (143 if sig == signal.SIGTERM else -9), err[-2000:]
        if sig == signal.SIGTERM:
            assert "the same command again resumes" in err
            assert not json.loads((cut / "manifest.json").read_text())["complete"]
    left = len(list(cut.glob("shard-*.parquet")))
    assert 0 < left < 24
    again = corescale("embed", *args, str(cut), *options)
    assert again.returncode == 0, again.stderr[-3000:]
    manifest = json.loads((cut / "manifest.json").read_text())
    assert manifest["complete"] and manifest["this_run"]["shards_before"] == left
    assert not list(cut.glob(".*"))  # no half-written file left
    whole_keys, whole_vectors = shards(whole)
    cut_keys, cut_vectors = shards(cut)
    assert cut_keys == whole_keys and len(cut_keys) == 2400  # nothing lost, nothing twice
    assert np.allclose(cut_vectors, whole_vectors, atol=1e-5)


def test_int8_vectors_say_what_they_cost(tiny_bundle, place):
    source = corpus(place / "texts.jsonl", 200, seed=2)
    proc = corescale("embed", str(tiny_bundle()), str(source), str(place / "int8"), "--dtype", "int8",
                     "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = pq.read_table(next((place / "int8").glob("shard-*.parquet")))
    assert str(table.schema.field("embedding").type.value_type) == "int8" and "scale" in table.column_names
    quality = json.loads((place / "int8" / "manifest.json").read_text())["quality_of_dtype"]
    assert quality["cosine_min"] > 0.99 and 0 < quality["recall_at_10"] <= 1 and quality["rows"] == 200


@pytest.mark.parametrize("words, expected", [
    (["--text-column", "body"], "has no column 'body'"),
    (["--pair-column", "text"], "--pair-column is for a task that scores pairs"),
    (["--dtype", "int4"], "invalid choice"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tiny_bundle, place, words, expected):
    source = corpus(place / "texts.jsonl", 10)
    out = place / "never"
    proc = corescale("embed", str(tiny_bundle()), str(source), str(out), *words, "--no-progress")
    assert proc.returncode == 2 and expected in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()


def test_a_folder_of_another_jobs_shards_is_refused(tiny_bundle, place):
    source = corpus(place / "texts.jsonl", 20)
    out = place / "out"
    assert corescale("embed", str(tiny_bundle()), str(source), str(out), "--no-progress").returncode == 0
    before = sorted(p.name for p in out.iterdir())
    proc = corescale("embed", str(tiny_bundle()), str(source), str(out), "--truncate", "--no-progress")
    assert proc.returncode == 2 and "another job's shards (it differs in truncate)" in proc.stderr, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == before


def test_a_shard_whose_rows_are_all_rejected_has_the_jobs_columns(tiny_bundle, place):
    source = corpus(place / "texts.jsonl", 30, {i: "" for i in range(10, 20)}, seed=5)
    out = place / "out"
    proc = corescale("embed", str(tiny_bundle()), str(source), str(out), "--id-column", "id", "--shard-rows", "10",
                     "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    schemas = [pq.read_schema(out / f"shard-0000{i}.parquet") for i in range(3)]
    assert schemas[0] == schemas[1] == schemas[2] and "embedding" in schemas[1].names
    assert pq.read_metadata(out / "shard-00001.parquet").num_rows == 0
    import pyarrow.dataset as ds

    assert ds.dataset(sorted(out.glob("shard-*.parquet"))).to_table().num_rows == 20  # one table, one schema
