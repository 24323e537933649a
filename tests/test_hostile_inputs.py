"""Hostile inputs, class by class (issue 20): interpolations in any value, binary, huge or endless files wherever a
file is read, numbers that overflow, vocabularies that cannot hold their special tokens, work that cannot finish
within the timeout, empty paths. Each is one line, exit code 2, nothing written, no worker started (the corpus
machinery of test_bad_inputs.py)."""

import json
import os

import pytest
import test_bad_inputs as corpus
from helpers import FAST

from corescale.cli import main

no_workers = corpus.no_workers  # the fixture: a worker start fails the test
RUN = ["run", *FAST]
SERVER = [*RUN, "scenario=server"]
GOOD = {"model_type": "bert", "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 512, "vocab_size": 30522, "max_position_embeddings": 512}
VOCABULARIES = {"vocab3": {"vocab_size": 3}, "vocab5": {"vocab_size": 5}, "pad_beyond": {"pad_token_id": 30522},
                "eos_negative": {"eos_token_id": -1}, "bos_text": {"bos_token_id": "<s>"},
                "eos_list": {"eos_token_id": [2, 99999]}, "sep_bool": {"sep_token_id": True},
                "pad_small_vocab": {"vocab_size": 8, "pad_token_id": 8}}
HUGE_INT = "9" * 5000


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile")
    os.mkfifo(base / "fifo")
    with open(base / "sparse", "wb") as handle:  # 2 GB that take no disk
        handle.truncate(2 << 30)
    (base / "binary").write_bytes(b"\x7fELF\x02\x01\x01\x00\x00" + bytes(range(256)))
    (base / "latin1.txt").write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1"))
    (base / "nul.txt").write_text("16,1\n\0\n")
    (base / "a-dir").mkdir()
    (base / "lscpu-digits").write_text(f"# CPU,Core,Socket,Node\n{HUGE_INT},0,0,0\n")
    (base / "lscpu-big-id").write_text("# CPU,Core,Socket,Node\n99999999999999999999999,0,0,0\n")
    (base / "lscpu-words").write_text("hello\nworld\n")
    for name, text in {"overflow": "length,count\n16,1e400\n", "huge-count": f"16,{HUGE_INT}\n",
                       "huge-length": f"{HUGE_INT},1\n", "minus-inf": "16,-inf\n"}.items():
        (base / f"{name}.csv").write_text(text)
    for name, change in VOCABULARIES.items():
        (base / name).mkdir()
        (base / name / "config.json").write_text(json.dumps({**GOOD, **change}))
    (base / "deep-config").mkdir()
    (base / "deep-config" / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    (base / "digits-config").mkdir()
    (base / "digits-config" / "config.json").write_text(f'{{"vocab_size": {HUGE_INT}}}')
    for name, content in {"binary-result": b"\0\1\2", "deep-result": b"[" * 100_000,
                          "digits-result": f'{{"schema_version": {HUGE_INT}}}'.encode()}.items():
        (base / name).mkdir()
        (base / name / "result.json").write_bytes(content)
    (base / "texts.jsonl").write_text('{"text": "a b c"}\n')
    for name, text in {"null": '{"text": null}\n', "number": '{"text": 123}\n', "list": '{"text": ["a"]}\n',
                       "deep": '{"text": ' + "[" * 100_000 + "\n"}.items():
        (base / f"{name}.jsonl").write_text(text)
    (base / "huge-field.csv").write_text("text\n" + "x" * 200_000 + "\n")
    return {"base": base, "root": base, "out": None}


# a file that is not one regular UTF-8 text file, wherever corescale reads a file a user named
BAD_FILES = {"zero": "/dev/zero", "urandom": "/dev/urandom", "fifo": "{base}/fifo", "sparse": "{base}/sparse",
             "binary": "{base}/binary", "latin1": "{base}/latin1.txt", "nul": "{base}/nul.txt",
             "directory": "{base}/a-dir"}
WHY = {"zero": "not a regular file", "urandom": "not a regular file", "fifo": "not a regular file",
       "sparse": "more than the", "binary": "binary file", "latin1": "is not UTF-8 text", "nul": "binary file",
       "directory": "a directory"}
CASES = []
for kind, path in BAD_FILES.items():
    CASES += [
        (f"lscpu-{kind}", ["plan", "--lscpu", path], f"--lscpu file '{path}"),
        (f"histogram-{kind}", [*RUN, f"workload.lengths={path}"], "histogram file (workload.lengths)"),
        (f"catalog-{kind}", ["cost", "--list-machines", "--catalog", path], "machine catalog '"),
    ]
    CASES += [(f"{case}-says-why", argv, WHY[kind]) for case, argv, _ in CASES[-3:]]
    if kind not in ("directory",):  # a directory names a model directory, not a workload file
        CASES.append((f"workload-{kind}", [*RUN, f"workload={path}"], WHY[kind]))
CASES += [
    # interpolations: Hydra/OmegaConf resolve ${...} in any value
    ("interpolation-missing-key", [*RUN, "model=${{nope}}"], "cannot resolve the interpolation in model"),
    ("interpolation-hydra", [*RUN, "output_dir=${{hydra:runtime.cwd}}"], "interpolation in output_dir"),
    ("interpolation-inside", [*RUN, "output_dir=/tmp/a${{x}}b"], "interpolation in output_dir"),
    ("interpolation-type", [*RUN, "batch_size=${{model}}"], "interpolation in batch_size"),
    ("interpolation-env", [*RUN, "workload.lengths=${{oc.env:CORESCALE_NO_SUCH_VARIABLE}}"],
     "interpolation in workload.lengths"),
    ("interpolation-nested", [*RUN, "warmup.window=${{warmup.nope}}"], "interpolation in warmup.window"),
    ("interpolation-plan", ["plan", "cache_dir=${{nope}}"], "interpolation in cache_dir"),
    ("interpolation-sweep", ["run", "-m", *FAST, "batch_size=1,2", "model=${{nope}}"], "interpolation in model"),
    # lscpu text that is text but not lscpu's
    ("lscpu-digits", ["plan", "--lscpu", "{base}/lscpu-digits"], "lscpu line 2: bad CPU value '9999"),
    ("lscpu-big-id", ["plan", "--lscpu", "{base}/lscpu-big-id"], "lscpu line 2: bad CPU value"),
    ("lscpu-words", ["plan", "--lscpu", "{base}/lscpu-words"], "lscpu line 1: expected 4 columns"),
    # histogram counts and lengths beyond any number
    ("histogram-overflow", [*RUN, "workload.lengths={base}/overflow.csv"], "count a finite number"),
    ("histogram-huge-count", [*RUN, "workload.lengths={base}/huge-count.csv"], "count a finite number"),
    ("histogram-huge-length", [*RUN, "workload.lengths={base}/huge-length.csv"], "expected `length,count`"),
    ("histogram-minus-inf", [*RUN, "workload.lengths={base}/minus-inf.csv"], "count a finite number"),
    # model configs and JSON files that cannot be what they claim
    ("config-deep", [*RUN, "model={base}/deep-config"], "nested too deeply"),
    ("config-digits", [*RUN, "model={base}/digits-config"], "not valid JSON"),
    ("show-binary-result", ["show", "{base}/binary-result"], "is a binary file"),
    ("show-deep-result", ["show", "{base}/deep-result"], "result file"),
    ("show-digits-result", ["show", "{base}/digits-result"], "not valid JSON"),
    ("show-fifo", ["show", "{base}/fifo"], "no result at"),
    # workload texts that are not text
    ("jsonl-null", [*RUN, "workload={base}/null.jsonl:text"], "field 'text' is NoneType null, not a text"),
    ("jsonl-number", [*RUN, "workload={base}/number.jsonl:text"], "field 'text' is int 123"),
    ("jsonl-list", [*RUN, "workload={base}/list.jsonl:text"], "field 'text' is list"),
    ("jsonl-deep", [*RUN, "workload={base}/deep.jsonl:text"], "deep.jsonl:1 is not a JSON line"),
    ("csv-huge-field", [*RUN, "workload={base}/huge-field.csv:text"], "not a CSV row"),
    # work that cannot finish within the timeout
    ("min-iterations-huge", [*RUN, "min_iterations=1000000000000"], "min_iterations=1000000000000 cannot finish"),
    ("min-iterations-timeout", [*RUN, "min_iterations=10000000", "timeout=60"], "cannot finish within timeout=60"),
    ("warmup-min-huge", [*RUN, "warmup.min_iterations=100000000", "warmup.max_iterations=100000000"],
     "warmup.min_iterations=100000000 cannot finish"),
    ("warmup-max-huge", [*RUN, "warmup.max_iterations=1000000000000"], "warmup.max_iterations=1000000000000"),
    ("repeats-huge", [*RUN, "repeats=1000000000"], "repeats=1000000000 is more than 1000"),
    ("repeats-1001", [*RUN, "repeats=1001"], "allowed: 1 to 1000"),
    ("samples-batches", [*RUN, "workload.samples=1000000", "workload.lengths=uniform(4,8)", "timeout=9"],
     "the batches of workload.samples=1000000 cannot finish within timeout=9"),
    ("samples-tokens", [*RUN, "workload.samples=1000000", "sequence_length=512", "workload.lengths=uniform(4,8)"],
     "a query set may hold (1 GiB); allowed: workload.samples <= 262144"),
    ("server-queries-qps", [*SERVER, "target_qps=1", "server.min_query_count=100000"],
     "server.min_query_count=100000 cannot be issued before a test stops at half the timeout (300 s)"),
    ("server-queries-auto", [*SERVER, "target_qps=auto", "slo_p99_ms=100", "server.min_query_count=10000000000"],
     "at 1e+06 queries/s at most"),
    ("server-queries-single-stream", [*RUN, "scenario=single_stream", "server.min_query_count=100000000000"],
     "server.min_query_count=100000000000 cannot be issued"),
    ("server-duration", [*SERVER, "target_qps=5", "duration=400"], "allowed: timeout >= 800"),
    ("server-duration-timeout", [*SERVER, "target_qps=5", "duration=40", "timeout=60"], "allowed: timeout >= 80"),
    ("sweep-bounded", ["run", "-m", *FAST, "min_iterations=5,1000000000000"], "cannot finish"),
    ("plan-bounded", ["plan", "repeats=5000"], "repeats=5000 is more than 1000"),
    ("tune-bounded", ["tune", *FAST, "min_iterations=1000000000000"], "cannot finish"),
    # an empty value where a path is due
    ("empty-output-dir", [*RUN, "output_dir="], "output_dir is empty"),
    ("blank-output-dir", [*RUN, "output_dir=' '"], "output_dir is empty"),
    ("empty-cache-dir", [*RUN, "cache_dir="], "cache_dir is empty"),
    ("empty-tokenizer", [*RUN, "workload.tokenizer="], "workload.tokenizer is empty"),
    ("empty-workload", [*RUN, "workload="], "workload.source is empty"),
    ("empty-lengths", [*RUN, "workload.lengths="], "workload.lengths is empty"),
    ("empty-model", [*RUN, "model="], "model is empty"),
    ("empty-plan-output", ["plan", "output_dir="], "output_dir is empty"),
    ("empty-tune-output", ["tune", *FAST, "output_dir="], "output_dir is empty"),
    ("empty-lscpu", ["plan", "--lscpu", ""], "argument --lscpu: expected a path, got an empty string"),
    ("empty-catalog", ["cost", "--list-machines", "--catalog", ""], "argument --catalog: expected a path"),
    ("empty-results-root", ["results", ""], "argument root: expected a path"),
    ("empty-report-output", ["report", "{base}", "-o", ""], "argument -o/--output: expected a path"),
    ("empty-show", ["show", ""], "argument path: expected a path"),
    ("empty-compare", ["compare", "", "{base}"], "argument before: expected a path"),
    ("empty-csv", ["results", "{base}", "--csv", ""], "argument --csv: expected a path"),
    ("empty-info-cache", ["info", "--cache-dir", ""], "argument --cache-dir: expected a path"),
]
CASES += [(f"vocabulary-{name}", [*RUN, f"model={{base}}/{name}"], "config.json: {}={}".format(*[*change.items()][-1]))
          for name, change in VOCABULARIES.items()]  # the line names the value that is wrong


def test_every_class_has_several_inputs():
    for prefix in ("lscpu-", "histogram-", "catalog-", "workload-", "interpolation-", "empty-", "vocabulary-",
                   "server-"):
        assert sum(case.startswith(prefix) for case, _, _ in CASES) >= 4, prefix
    assert len({case for case, _, _ in CASES}) == len(CASES)


@pytest.mark.parametrize("argv, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_input(argv, message, place, tmp_path, monkeypatch, capsys, no_workers):
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.chdir(tmp_path)  # a default output dir would appear here
    before, shared = corpus._tree(tmp_path), corpus._tree(place["base"])
    code = main(corpus._argv(argv, place, out))
    captured = capsys.readouterr()
    assert code == 2, captured.err
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("corescale: error: "), captured.err
    assert message.format(base=place["base"]) in lines[0]
    assert "Traceback" not in captured.err and captured.out == ""
    assert corpus._tree(tmp_path) == before and corpus._tree(place["base"]) == shared
