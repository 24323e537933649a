"""scenario=server: MLPerf LoadGen drives the pinned instances through one queue with dynamic batching;
target_qps=auto; query sets from lengths and real text (tokenizer trained here); padding policies."""

import csv
import json
import os
import random
import signal
import threading
import types

import numpy as np
import pytest
from helpers import FAST, corescale, execute, raw_record

from corescale.measure.batching import Batcher
from corescale.measure.qps_search import knee, search
from corescale.overrides import compose
from corescale.workload.samples import (
    QuerySet,
    draw_lengths,
    offline_batches,
    padded_length,
    read_texts,
)

pytestmark = pytest.mark.alone  # LoadGen's server scenario: latency bounds and a QPS search

WORDS = ["the", "a", "model", "serves", "queries", "under", "load", "with", "latency", "batches", "cores",
         "tokens", "padding", "bucket", "server", "text"]


def write_corpus(base, lines=240):
    """A WordPiece tokenizer trained on a small corpus, saved as a local directory (BertTokenizerFast), and the
    corpus as .jsonl, .csv and .txt."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast

    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 40))) for _ in range(lines)]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=120, special_tokens=special))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[(t, tok.token_to_id(t)) for t in ("[CLS]", "[SEP]")])
    BertTokenizerFast(tokenizer_object=tok).save_pretrained(base / "tokenizer")
    (base / "texts.jsonl").write_text("".join(json.dumps({"text": t, "n": i}) + "\n" for i, t in enumerate(texts)))
    with open(base / "texts.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "body"])
        writer.writerows(enumerate(texts))
    (base / "texts.txt").write_text("\n".join(texts) + "\n")
    return texts


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    base = tmp_path_factory.mktemp("corpus")
    return base, write_corpus(base)


# --- no processes -------------------------------------------------------------------------------------------------

def _cfg(**server):
    pad = server.pop("pad", "max")
    settings = {"max_batch": 4, "max_queue_ms": 0.0, "max_batch_tokens": None, "max_padding": None,
                "queue_delay": "fixed", **server}
    return types.SimpleNamespace(scenario="server", pad=pad, sequence_length=128,
                                 server=types.SimpleNamespace(**settings))


def _samples(n):
    return [types.SimpleNamespace(id=i, index=i) for i in range(n)]


def test_batcher_takes_up_to_max_batch_oldest_first_and_respects_the_token_budget():
    lengths = np.array([10, 100, 12, 11, 90, 9, 120, 8])
    batcher = Batcher(_cfg(), lengths)
    batcher.put(_samples(8))
    assert [w.sample.index for w in batcher.take()] == [0, 1, 2, 3]
    assert [w.sample.index for w in batcher.take()] == [4, 5, 6, 7]
    budget = Batcher(_cfg(max_batch_tokens=240), lengths)  # 2 rows x 100 fit, 3 rows x 100 do not
    budget.put(_samples(8))
    assert [w.sample.index for w in budget.take()] == [0, 1]
    sorted_ = Batcher(_cfg(pad="sorted"), lengths)  # the oldest, then the waiting ones nearest its length
    sorted_.put(_samples(8))
    assert [w.sample.index for w in sorted_.take()] == [0, 3, 5, 2]  # ties: the older first


def test_the_padding_cap_leaves_a_far_length_for_another_call():
    lengths = np.array([10, 100, 12, 11, 90, 9, 120, 8])
    capped = Batcher(_cfg(pad="sorted", max_padding=0.1, max_batch=8), lengths)
    capped.put(_samples(8))
    # 10, 11, 9 pad to 11: 33 tokens, 3 of them padding (9 %); with 12, 6 of 48 (12.5 %)
    calls = [[w.sample.index for w in capped.take()] for _ in range(5)]
    assert calls == [[0, 3, 5], [1, 4], [2], [6], [7]]  # 100 and 90: 5 %, with 120: 13.9 %; 12 and 8: 16.7 %
    arrival = Batcher(_cfg(max_padding=0.0, max_batch=8), lengths)  # pad=max: in arrival order, no padding at all
    arrival.put(_samples(8))
    assert [w.sample.index for w in arrival.take()] == [0]  # the oldest always goes
    assert [w.sample.index for w in arrival.take()] == [1]


def test_the_padding_cap_keeps_earlier_keys_and_is_recorded():
    """A key computed before the field existed holds with no cap (the search's key in test_qps_search_bound.py);
    a cap measures something else: another key."""
    from corescale.overrides import compose

    served = ["model=bert-tiny", "scenario=server", "target_qps=auto", "slo_p99_ms=100"]
    assert compose([*served, "server.max_padding=null"]).key() == "ac4b991d1f5baa80"
    capped = compose([*served, "server.max_padding=0.15"])
    assert capped.key() != "ac4b991d1f5baa80" and "server.max_padding" in capped.key_fields()


def test_batcher_waits_at_most_max_queue_ms_for_a_batch_to_fill():
    import time

    batcher = Batcher(_cfg(max_queue_ms=50.0), np.full(4, 16))
    batcher.put(_samples(1))
    began = time.perf_counter()
    batch = batcher.take()
    waited = time.perf_counter() - began
    assert len(batch) == 1 and 0.04 <= waited < 2.0
    batcher.close()
    assert batcher.take() is None


def _fake_step(capacity):
    def step(qps):
        return types.SimpleNamespace(target_qps=qps, meets_slo=qps <= capacity)
    return step


@pytest.mark.parametrize("first", [5.0, 300.0, 3000.0])
def test_search_brackets_then_bisects_to_the_highest_qps_that_meets_the_slo(first):
    steps = []
    found = search(_fake_step(123.0), first, 0.02, 30, steps).best
    assert found <= 123.0
    above = min(s.target_qps for s in steps if not s.meets_slo)
    assert (above - found) / found <= 0.02 and above > 123.0 * 0.999
    assert len(steps) < 30


def test_search_stops_at_max_steps_and_reports_none_when_nothing_met():
    steps = []
    assert search(_fake_step(0.001), 100.0, 0.01, 5, steps).best is None
    assert len(steps) == 5 and all(not s.meets_slo for s in steps)


def test_search_stops_halving_once_even_the_fastest_query_missed():
    def step(qps):
        return types.SimpleNamespace(target_qps=qps, meets_slo=False, latency_ms={"min": 300.0})
    steps = []
    assert search(step, 100.0, 0.01, 10, steps, slo_ms=130.0).best is None and len(steps) == 1
    steps = []
    assert search(step, 100.0, 0.01, 10, steps, floor=30.0, slo_ms=500.0).best is None
    assert [s.target_qps for s in steps] == [100.0, 50.0]  # 25 is below the floor
    steps = []
    search(_fake_step(1000.0), 1.0, 0.01, 1, steps, floor=40.0)
    assert steps[0].target_qps == 40.0  # a first guess below the floor starts at the floor


def test_knee_is_where_p99_turns_up():
    curve = [{"target_qps": q, "p99": p} for q, p in ((10, 20), (20, 21), (40, 23), (60, 26), (70, 200), (80, 400))]
    assert knee(curve) == 60
    assert knee(curve[:2]) is None


def test_lengths_are_seeded_and_bounded(tmp_path):
    a = draw_lengths("uniform(8,128)", np.random.default_rng(3), 500, 128)
    b = draw_lengths("uniform(8,128)", np.random.default_rng(3), 500, 128)
    assert (a == b).all() and a.min() >= 8 and a.max() <= 128 and len(set(a)) > 50
    (tmp_path / "h.csv").write_text("length,count\n16,3\n64,1\n")
    drawn = draw_lengths(str(tmp_path / "h.csv"), np.random.default_rng(0), 4000, 128)
    assert set(drawn) == {16, 64} and 0.7 < (drawn == 16).mean() < 0.8


def test_padding_policies_sorted_and_bucket_waste_less_than_max():
    lengths = np.random.default_rng(0).integers(8, 129, size=512)

    def waste(pad):
        real = padded = 0
        for rows in offline_batches(lengths, 8, pad, 0):
            padded += len(rows) * padded_length(lengths[rows], pad, 128)
            real += int(lengths[rows].sum())
        return 1 - real / padded
    assert waste("sorted") < waste("bucket") < waste("max")
    assert sorted(i for b in offline_batches(lengths, 8, "sorted", 0) for i in b) == list(range(512))
    assert padded_length([17, 30], "bucket", 128) == 32 and padded_length([60], "bucket", 64) == 64
    assert padded_length([100], "bucket", 64) == 100  # serve: past the measured length, the row's own (issue 29)


def test_texts_from_txt_jsonl_and_csv(corpus):
    base, texts = corpus
    assert read_texts(str(base / "texts.txt")) == texts
    assert read_texts(f"{base}/texts.jsonl:text") == texts
    assert read_texts(f"{base}/texts.csv:body") == texts


def test_query_set_round_trips(tmp_path):
    queries = QuerySet([np.arange(3), np.arange(5, 12)], "x")
    queries.save(tmp_path / "q.npz")
    back = QuerySet.load(tmp_path / "q.npz")
    assert [q.tolist() for q in back.ids] == [q.tolist() for q in queries.ids] and back.origin == "x"


# --- real processes -----------------------------------------------------------------------------------------------

SERVE = [*FAST, "scenario=server", "duration=1", "server.min_query_count=480", "sequence_length=64"]


@pytest.fixture(scope="module")
def served(corpus, tmp_path_factory):
    """One LoadGen server run on 2 instances, text queries through the trained tokenizer, bucketed padding, a
    token budget and a queue delay that lets batches form at a low rate."""
    base, _ = corpus
    out = tmp_path_factory.mktemp("served")
    proc = corescale("run", *SERVE, "instances=2", "cores_per_instance=1", "target_qps=120", "slo_p99_ms=3000",
                     "server.max_batch=8", "server.max_queue_ms=25", "server.max_batch_tokens=256", "pad=bucket",
                     f"workload={base}/texts.jsonl:text", f"workload.tokenizer={base}/tokenizer",
                     f"output_dir={out}", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    path = next(out.glob("*/result.json")).parent
    return proc, path, raw_record(path)


@pytest.mark.slow
def test_server_run_is_valid_and_keeps_loadgen_logs(served):
    proc, path, record = served
    server = record["server"]
    assert record["status"] == "ok" and server["validity"] == "VALID", server["steps"]
    summary = (path / "loadgen-01-summary.txt").read_text()
    assert "Result is : VALID" in summary and "Scenario : Server" in summary and "target_qps : 120" in summary
    assert "result_validity" in (path / "loadgen-01-detail.txt").read_text()
    step = server["steps"][0]
    assert step["queries"] >= 480 and step["latency_ms"]["p99"] <= 3000 and step["checks"]["early_stopping_met"]
    assert 0 < server["parent"]["cores_used"] < 2  # the parent's own CPU, measured
    assert "VALID" in proc.stdout and "max_batch 8" in proc.stdout


@pytest.mark.slow
def test_server_dispatches_to_both_instances_and_forms_batches(served):
    _, path, record = served
    rows = list(csv.DictReader((path / "server-batches.csv").open()))
    assert {r["instance"] for r in rows} == {"0", "1"}
    assert max(int(r["rows"]) for r in rows) > 1
    assert all(int(r["rows"]) * int(r["padded_length"]) <= 256 for r in rows)  # the token budget
    assert all(int(r["padded_length"]) in (16, 32, 64) for r in rows)  # pad=bucket
    batching = record["server"]["batching"]  # the calls' histograms, in the record (issue 31)
    assert sum(batching["rows_histogram"].values()) == len(rows) == batching["batches"]
    assert set(batching["padded_length_histogram"]) <= {"16", "32", "64"}
    assert batching["real_tokens"] == sum(int(r["real_tokens"]) for r in rows) < batching["padded_tokens"]
    assert sum(i["queries_served"] for i in record["instance_reports"]) == sum(int(r["rows"]) for r in rows)
    assert all(int(r["first_arrival_ns"]) <= int(r["instance_start_ns"]) < int(r["completed_ns"]) for r in rows)
    workload = record["workload"]
    assert workload["queries"] == 240 and 0 < workload["padding_waste"] < 1 and workload["pad"] == "bucket"


@pytest.mark.slow
def test_cost_prices_server_results_under_the_slo(served, capsys):
    from corescale.cli import main

    _, path, _ = served
    assert main(["cost", str(path.parent), "--price-per-hour", "1", "--slo-p99-ms", "3000"]) == 0
    out = capsys.readouterr().out
    assert "120.0 QPS (LoadGen server, p99 within its SLO)" in out and "closed-loop" not in out
    assert main(["cost", str(path.parent), "--price-per-hour", "1", "--slo-p99-ms", "100"]) == 1  # measured at 3 s
    assert "no measured layout that meets p99 ≤ 100 ms" in capsys.readouterr().out
    assert main(["results", str(path.parent), "--csv", "-"]) == 0
    assert "VALID" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSEGV])
def test_a_failed_server_trial_leaves_no_loadgen_test_running_into_the_next(tmp_path, how, forkservers):
    """A worker killed 1.5 s into a test whose schedule lasts ~4.6 s (459 queries at 100 QPS): the trial fails, and
    LoadGen's test (which cannot be stopped, only answered at once) has ended before the next trial starts its
    own, whose summary and batches hold only its own queries."""
    from corescale.measure.runner import prepare_trial

    pids = {}

    def kill_one(instance, event):
        if instance >= 0 and "pid" in event:
            pids[instance] = event["pid"]
        if event.get("event") == "started":
            threading.Timer(1.5, os.kill, (pids[0], how)).start()

    slow = compose([*SERVE, "target_qps=100", "server.min_query_count=459", "timeout=120", f"output_dir={tmp_path}"])
    failed = execute(prepare_trial(slow), on_event=kill_one, forkservers=forkservers)
    assert not failed.ok and failed.record.failure.kind in ("signal", "crash"), failed.record.reason
    assert not [t for t in threading.enumerate() if t.name.startswith("corescale-loadgen") and t.is_alive()]
    quick = compose([*SERVE, "target_qps=120", "server.min_query_count=480", f"output_dir={tmp_path}"])
    outcome = execute(prepare_trial(quick), forkservers=forkservers)
    assert outcome.ok, outcome.record.reason
    (step,) = outcome.record.server.steps
    served = sum(r["queries_served"] for r in raw_record(outcome.path)["instance_reports"])
    rows = list(csv.DictReader((outcome.path / "server-batches.csv").open()))
    assert step.queries == served == sum(int(r["rows"]) for r in rows)  # its own queries, all of them, only them
    assert "target_qps : 120" in (outcome.path / "loadgen-01-summary.txt").read_text()


@pytest.mark.slow
def test_target_qps_auto_converges(tmp_path, forkservers):
    from corescale.measure.runner import prepare_trial

    cfg = compose([*SERVE, "target_qps=auto", "slo_p99_ms=5000", "server.search_precision=0.3",
                   "server.max_steps=6", "duration=0.5", "timeout=120", f"output_dir={tmp_path}"])
    outcome = execute(prepare_trial(cfg), forkservers=forkservers)
    assert outcome.ok, outcome.record.reason
    server = outcome.record.server
    assert server is not None
    steps = server.steps
    best = server.max_valid_qps
    assert best is not None and best == max(s.target_qps or 0 for s in steps if s.meets_slo)
    missed = [s.target_qps for s in steps if s.meets_slo is False and s.target_qps and s.target_qps > best]
    assert len(steps) == 6 or (missed and (min(missed) - best) / best <= 0.25 + 1e-9), steps  # 133.5 / 106.8
    assert [p.target_qps for p in server.load_curve] == sorted(s.target_qps or 0 for s in steps)
    assert len(list(outcome.path.glob("loadgen-*-summary.txt"))) >= len(steps)
    from corescale.report.html import build

    built = build(tmp_path, tmp_path / "report.html")
    assert "load_curve" in built.charts and "Load curve (server scenario)" in (tmp_path / "report.html").read_text()


@pytest.mark.slow
def test_offline_on_text_counts_real_and_padded_tokens(corpus, tmp_path, capsys, forkservers):
    from corescale.measure.runner import prepare_trial

    base, _ = corpus
    cfg = compose([*FAST, "batch_size=4", "sequence_length=64", "pad=sorted", f"workload={base}/texts.txt",
                   f"workload.tokenizer={base}/tokenizer", f"output_dir={tmp_path}"])
    outcome = execute(prepare_trial(cfg), forkservers=forkservers)
    assert outcome.ok, outcome.record.reason
    m, workload = outcome.record.metrics, outcome.record.workload
    assert m.throughput_tokens_per_s < m.padded_tokens_per_s < m.throughput_samples_per_s * 64
    assert workload["pad"] == "sorted" and 0 <= workload["padding_waste"] < 0.5
    from corescale.cli import main

    assert main(["cost", str(tmp_path), "--price-per-hour", "1", "--slo-p99-ms", "1000"]) == 0
    assert "only closed-loop results" in capsys.readouterr().out


def test_a_hub_tokenizer_missing_offline_is_one_line(corpus, tmp_path, monkeypatch, capsys):
    from corescale.cli import main

    base, _ = corpus
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = main(["run", *FAST, f"workload={base}/texts.txt", "workload.tokenizer=nosuch-org/nosuch-tokenizer",
                 f"output_dir={tmp_path}/out", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "cannot be found offline" in err and not (tmp_path / "out").exists()
