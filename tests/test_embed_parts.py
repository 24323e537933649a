"""`corescale embed`'s parts without workers: the corpus's files and rows, the output folder, the columns."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corescale.embed import columns as written
from corescale.embed.corpus import Columns, discover, rows
from corescale.embed.estimate import rows_of
from corescale.embed.output import JOB, Output
from corescale.errors import UserError
from corescale.workload.tasks import TASKS, resolve


def jsonl(path, items):
    path.write_text("".join((item if isinstance(item, str) else json.dumps(item)) + "\n" for item in items))
    return path


def test_each_kind_is_read_in_order_with_unreadable_rows_as_rejects(tmp_path):
    folder = tmp_path / "a corpus ünï"
    folder.mkdir()
    pq.write_table(pa.table({"text": ["alpha", None, "gamma"], "id": [10, 11, 12]}), folder / "1.parquet")
    (folder / "2.csv").write_bytes(b"id,text\n20,delta\n21,\xff\xfe broken\n22,\"with, a comma\"\n")
    jsonl(folder / "3.jsonl", [{"id": 30, "text": "epsilon"}, "{not json", {"id": 32, "text": 5}, ""])
    (folder / ".hidden.jsonl").write_text('{"text": "never read"}\n')
    (folder / "notes.txt").write_text("not a corpus file")
    corpus = discover(folder, Columns("text", None, "id"))
    assert [f.path.name for f in corpus.files] == ["1.parquet", "2.csv", "3.jsonl"]
    assert corpus.rows is None and rows_of(corpus) == (9, False)  # the CSV's lines: an estimate
    got = [(r.number, r.id, r.text, r.problem) for r in rows(corpus)]
    assert [g[0] for g in got] == list(range(9))
    assert [g[2] for g in got if g[3] is None] == ["alpha", "gamma", "delta", "with, a comma", "epsilon"]
    problems = {g[0]: g[3] for g in got if g[3] is not None}
    assert set(problems) == {1, 4, 7, 8}
    assert "null" in problems[1] and "UTF-8" in problems[4] and "not JSON" in problems[7] and "int" in problems[8]
    assert [r.number for r in rows(corpus, start=6)] == [6, 7, 8]


@pytest.mark.parametrize("make, expected", [
    (lambda p: p / "missing.jsonl", "does not exist"),
    (lambda p: (p / "a.txt").write_text("x") and p / "a.txt", "allowed: .csv, .jsonl, .ndjson, .parquet"),
    (lambda p: jsonl(p / "a.jsonl", [{"body": "x"}]), "has no column 'text' (its columns: body)"),
    (lambda p: (p / "empty").mkdir() or p / "empty", "holds no"),
    (lambda p: jsonl(p / "a.jsonl", ["[1, 2]"]), "not a JSON object"),
])
def test_a_corpus_that_cannot_work_is_one_line(tmp_path, make, expected):
    with pytest.raises(UserError, match=None) as caught:
        discover(make(tmp_path), Columns())
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_a_parquet_corpus_counts_its_rows_exactly(tmp_path):
    pq.write_table(pa.table({"text": ["a"] * 5}), tmp_path / "c.parquet")
    corpus = discover(tmp_path / "c.parquet", Columns())
    assert corpus.rows == 5 and rows_of(corpus) == (5, True)


def test_the_output_folder_is_new_empty_or_this_same_jobs(tmp_path):
    mine = {"bundle": "b", "corpus": {"files": []}, "dtype": "float32"}
    output = Output.open(tmp_path / "out", mine)
    assert not (tmp_path / "out").exists()  # nothing is written before the instances are ready
    output.begin()
    assert json.loads((tmp_path / "out" / JOB).read_text())["identity"] == mine
    output.write_shard(3, pa.table({"row": [1, 2]}))
    assert output.done() == {3} and not list((tmp_path / "out").glob(".*"))
    assert Output.open(tmp_path / "out", mine).done() == {3}  # resumed
    with pytest.raises(UserError, match="another job's shards \\(it differs in dtype\\)"):
        Output.open(tmp_path / "out", {**mine, "dtype": "int8"})
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "results.csv").write_text("x")
    with pytest.raises(UserError, match="not an embed job's"):
        Output.open(tmp_path / "other", mine)
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file"):
        Output.open(tmp_path / "file", mine)


def test_a_killed_writers_leftovers_are_removed_and_rejects_go_with_their_shard(tmp_path):
    output = Output.open(tmp_path, {"x": 1})
    (tmp_path / ".shard-00000.parquet.999.tmp").write_bytes(b"half")
    output.begin()
    assert not (tmp_path / ".shard-00000.parquet.999.tmp").exists()
    output.write_shard(0, pa.table({"row": [0]}), pa.table({"row": [1], "reason": ["empty"]}))
    assert (tmp_path / "rejects-00000.parquet").exists() and output.counts() == (1, 1)
    output.write_shard(0, pa.table({"row": [0, 1]}))  # computed again, now without rejects
    assert not (tmp_path / "rejects-00000.parquet").exists() and output.counts() == (2, 0)


def test_every_task_with_a_corpus_job_names_what_it_writes():
    named = {name: resolve(task.corpus) for name, task in TASKS.items() if task.corpus}
    assert set(named) >= {"embed", "rerank", "classify"} and TASKS["encode"].corpus is None
    assert all(isinstance(w, written.Written) and w.dtypes[0] == "float32" for w in named.values())


def test_int8_and_binary_vectors_read_back_and_say_what_they_cost():
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((300, 64)).astype(np.float32)
    made = written.vector_columns(None, None, vectors, "int8")
    values = np.asarray(made["embedding"].flatten()).reshape(300, 64).astype(np.float32)
    back = values * np.asarray(made["scale"])[:, None]
    assert np.abs(back - vectors).max() <= np.abs(vectors).max() / 127  # within one step of its scale
    bits = written.vector_columns(None, None, vectors, "binary")["embedding"]
    assert bits.type.byte_width == 8 and np.array_equal(np.frombuffer(bits[0].as_py(), np.uint8),
                                                        np.packbits(vectors[0] > 0))
    int8, binary = written.quality_of(vectors, "int8"), written.quality_of(vectors, "binary")
    assert 0.999 < int8["cosine_min"] <= 1.0 and int8["recall_at_10"] > 0.8 and int8["rows"] == 300
    assert 0 < binary["recall_at_10"] < int8["recall_at_10"]  # one bit a dimension costs more
    assert written.quality_of(vectors, "float32") is None
