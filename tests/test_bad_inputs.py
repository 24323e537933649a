"""The bad-input corpus: every class of bad input, for every subcommand, gives exit code 2, exactly one line on
stderr (`corescale: error: ...`), no traceback, nothing written, and no worker started.

The corpus runs the CLI's entry point in this process (a worker start or any other exception would fail the test
at once); a sample of it runs again as a real `corescale` process, where the exit code and stderr are the
process's own."""

import json
import shutil
from pathlib import Path

import pytest
from helpers import FAST, ROOT, corescale

from corescale.cli import main

SCHEMA1 = ROOT / "tests" / "data" / "schema1"


def _model_dirs(base: Path) -> None:
    """Local model directories whose config.json is wrong in one way each."""
    good = {"model_type": "bert", "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
            "intermediate_size": 512, "vocab_size": 30522, "max_position_embeddings": 512}
    configs = {
        "big_hidden": {**good, "hidden_size": "big"},
        "negative_layers": {**good, "num_hidden_layers": -1},
        "list_config": [good],
        "heads_mismatch": {**good, "num_attention_heads": 3},
        "numeric_type": {**good, "model_type": 5},
        "bool_vocab": {**good, "vocab_size": True},
        "huge_model": {**good, "hidden_size": 2**20, "intermediate_size": 2**22, "num_attention_heads": 1,
                       "num_hidden_layers": 4096},
    }
    for name, config in configs.items():
        (base / name).mkdir()
        (base / name / "config.json").write_text(json.dumps(config))
    (base / "not_json").mkdir()
    (base / "not_json" / "config.json").write_text("{nope")


def _catalogs(base: Path) -> None:
    entry = "price_per_hour: 1.0\n    vcpus: 4\n    physical_cores: 2"
    catalogs = {
        "list_entry": "machines:\n  m: [1, 2]\n",
        "scalar_entry": "machines:\n  m: 3\n",
        "negative_price": f"machines:\n  m:\n    {entry.replace('1.0', '-1.0')}\n",
        "zero_cores": f"machines:\n  m:\n    {entry.replace('physical_cores: 2', 'physical_cores: 0')}\n",
        "nan_price": f"machines:\n  m:\n    {entry.replace('1.0', '.nan')}\n",
        "text_price": f"machines:\n  m:\n    {entry.replace('1.0', 'cheap')}\n",
        "more_cores_than_vcpus": f"machines:\n  m:\n    {entry.replace('physical_cores: 2', 'physical_cores: 8')}\n",
        "top_list": "- m\n",
        "no_machines": "machines: {}\n",
        "bad_yaml": "machines: [\n",
    }
    for name, text in catalogs.items():
        (base / f"{name}.yaml").write_text(text)


def _results(base: Path, root: Path) -> None:
    """A random JSON file, records without config or metrics, a record that is a list."""
    record = json.loads(next(root.glob("*/result.json")).read_text())
    (base / "random.json").write_text(json.dumps({"hello": "world"}))
    (base / "list.json").write_text(json.dumps([1, 2]))
    for name, drop in (("no_config", "config"), ("no_metrics", "metrics")):
        (base / name).mkdir()
        (base / name / "result.json").write_text(json.dumps({k: v for k, v in record.items() if k != drop}))
    (base / "metrics_list").mkdir()
    (base / "metrics_list" / "result.json").write_text(json.dumps({**record, "metrics": [1]}))


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """Inputs shared by every case: a results root (a copy, so nothing can touch the repository), bad files."""
    base = tmp_path_factory.mktemp("bad-inputs")
    root = base / "root"
    shutil.copytree(SCHEMA1, root)
    (base / "a-file").write_text("not a directory\n")
    _model_dirs(base)
    _catalogs(base)
    _results(base, root)
    _workloads(base)
    return {"base": base, "root": root}


RUN = ["run", *FAST]
# (case id, argv, what the one line must say); {out} is a fresh output dir, {base}/{root} the shared inputs
CASES = [
    # non-finite numbers in every float of the config
    ("duration-nan", [*RUN, "duration=nan"], "duration=nan is not a finite number"),
    ("duration-inf", [*RUN, "duration=inf"], "duration=inf is not a finite number"),
    ("duration-minus-inf", [*RUN, "duration=-inf"], "duration=-inf is not a finite number"),
    ("timeout-nan", [*RUN, "timeout=nan"], "timeout=nan is not a finite number"),
    ("timeout-inf", [*RUN, "timeout=inf"], "timeout=inf is not a finite number"),
    ("padding-nan", [*RUN, "padding_fraction=nan"], "padding_fraction=nan is not a finite number"),
    ("padding-minus-inf", [*RUN, "padding_fraction=-inf"], "padding_fraction=-inf is not a finite number"),
    ("tolerance-nan", [*RUN, "warmup.tolerance=nan"], "warmup.tolerance=nan is not a finite number"),
    ("tolerance-inf", [*RUN, "warmup.tolerance=inf"], "warmup.tolerance=inf is not a finite number"),
    ("max-seconds-nan", [*RUN, "warmup.max_seconds=nan"], "warmup.max_seconds=nan is not a finite number"),
    ("max-seconds-minus-inf", [*RUN, "warmup.max_seconds=-inf"], "warmup.max_seconds=-inf is not a finite"),
    ("max-seconds-zero", [*RUN, "warmup.max_seconds=0"], "warmup.max_seconds must be > 0"),
    ("drift-nan", [*RUN, "drift_tolerance=nan"], "drift_tolerance=nan is not a finite number"),
    ("drift-inf", [*RUN, "reference=pytorch", "drift_tolerance=inf"], "drift_tolerance=inf is not a finite"),
    ("batch-nan", [*RUN, "batch_size=nan"], "batch_size: expected integer, got 'nan'"),
    ("threads-inf", [*RUN, "threads=inf"], "threads: expected integer, got 'inf'"),
    # sizes beyond the machine
    ("batch-1e20", [*RUN, "batch_size=100000000000000000000"], "needs at least"),
    ("batch-1e12", [*RUN, "batch_size=1000000000000"], "than the"),
    ("total-batch-huge", [*RUN, "total_batch_size=2000000000000", "instances=2", "cores_per_instance=1"],
     "on 2 instance(s) needs at least"),
    ("sequence-huge", [*RUN, "sequence_length=1000000000000"], "exceeds the maximum of 512 positions"),
    ("instances-huge", [*RUN, "instances=1000000000000"], "cannot place 1000000000000 instances"),
    ("cores-huge", [*RUN, "cores_per_instance=1000000000000"], "cannot place"),
    ("threads-huge", [*RUN, "threads=1000000000000"], "threads=1000000000000 exceeds the"),
    ("interop-huge", [*RUN, "interop_threads=1000000000000"], "interop_threads=1000000000000 exceeds the"),
    ("model-too-big", [*RUN, "model={base}/huge_model"], "MemAvailable"),
    # Hydra's prefixed overrides
    ("plus-unknown-key", [*RUN, "+nosuchkey=1"], "'+nosuchkey=1': Hydra's +key (adds a key) is not supported"),
    ("plus-plus-model", [*RUN, "++model=bert-base"], "write model=bert-base"),
    ("tilde-model", [*RUN, "~model"], "'~model': Hydra's ~key (deletes a key) is not supported"),
    ("tilde-group-option", [*RUN, "~warmup.window"], "write warmup.window=VALUE"),
    ("plus-backend-option", [*RUN, "+backend.fusion=true"], "write backend.fusion=true"),
    # unwritable output
    ("output-proc", [*RUN, "output_dir=/proc/corescale-x"], "cannot write output_dir '/proc/corescale-x'"),
    ("output-is-file", [*RUN, "output_dir={base}/a-file"], "is a file, not a directory"),
    ("output-under-file", [*RUN, "output_dir={base}/a-file/sub"], "is a file, not a directory"),
    ("cache-proc", [*RUN, "calibrate=true", "cache_dir=/proc/corescale-c"], "cannot write cache_dir"),
    ("compiled-cache-proc", [*RUN, "compiled_cache=/proc/corescale-b"], "cannot write compiled_cache"),
    ("compiled-cache-file", [*RUN, "compiled_cache={base}/a-file"], "is a file, not a directory"),
    ("compiled-cache-empty", [*RUN, "compiled_cache="], "compiled_cache is empty"),
    # bad model files
    ("config-wrong-type", [*RUN, "model={base}/big_hidden"], "hidden_size must be a whole number >= 1 (got 'big')"),
    ("config-negative", [*RUN, "model={base}/negative_layers"], "num_hidden_layers must be a whole number >= 1"),
    ("config-list", [*RUN, "model={base}/list_config"], "must hold a JSON object of model settings, not a list"),
    ("config-heads", [*RUN, "model={base}/heads_mismatch"], "not a multiple of the 3 attention heads"),
    ("config-model-type", [*RUN, "model={base}/numeric_type"], "model_type must be a string"),
    ("config-bool", [*RUN, "model={base}/bool_vocab"], "vocab_size must be a whole number"),
    ("config-not-json", [*RUN, "model={base}/not_json"], "not valid JSON"),
    # threads, seed, timeout
    ("threads-above-instance", [*RUN, "instances=2", "cores_per_instance=1", "threads=2"],
     "threads=2 exceeds the 1 CPUs of instance 0 of 2"),
    ("seed-negative", [*RUN, "seed=-1"], "seed must be a whole number from 0 to 4294967295 (got -1)"),
    ("seed-too-big", [*RUN, "seed=4294967296"], "seed must be a whole number from 0 to 4294967295"),
    ("timeout-short", [*RUN, "timeout=1"], "timeout=1 s leaves no time to measure"),
    ("timeout-below-duration", [*RUN, "duration=60", "timeout=30"], "allowed: timeout > 65"),
    # run -m: the whole grid is checked before its first trial
    ("sweep-nan", ["run", "-m", *FAST, "duration=0.5,nan"], "trial 2 ("),
    ("sweep-batch-huge", ["run", "-m", *FAST, "batch_size=1,1000000000000"], "needs at least"),
    ("sweep-plus", ["run", "-m", *FAST, "+nosuchkey=1,2"], "Hydra's +key"),
    ("sweep-tilde", ["run", "-m", *FAST, "batch_size=1,2", "~seed"], "Hydra's ~key"),
    ("sweep-output-proc", ["run", "-m", *FAST, "batch_size=1,2", "output_dir=/proc/corescale-x"],
     "cannot write output_dir"),
    ("sweep-seed", ["run", "-m", *FAST, "seed=0,-1"], "seed must be a whole number"),
    # study
    ("study-nan", ["study", "cores", "--values", "1", *FAST, "duration=nan"], "duration=nan is not a finite"),
    ("study-tilde", ["study", "cores", "--values", "1", *FAST, "~model"], "Hydra's ~key"),
    ("study-threads", ["study", "instances", "--values", "2", *FAST, "cores_per_instance=1", "threads=2"],
     "threads=2 exceeds the 1 CPUs"),
    ("study-output-proc", ["study", "cores", "--values", "1", *FAST, "output_dir=/proc/corescale-x"],
     "cannot write output_dir"),
    ("study-values", ["study", "cores", "--values", "0", *FAST], "--values '0'"),
    # plan
    ("plan-nan", ["plan", "duration=nan"], "duration=nan is not a finite number"),
    ("plan-plus", ["plan", "+instances=2"], "Hydra's +key"),
    ("plan-threads", ["plan", "instances=2", "cores_per_instance=1", "threads=2"], "threads=2 exceeds the 1 CPUs"),
    ("plan-seed", ["plan", "seed=-1"], "seed must be a whole number"),
    ("plan-tolerance", ["plan", "warmup.tolerance=-inf"], "warmup.tolerance=-inf is not a finite number"),
    # results
    ("results-csv-proc", ["results", "{root}", "--csv", "/proc/corescale-x.csv"], "cannot write --csv"),
    ("results-csv-no-dir", ["results", "{root}", "--csv", "{out}/no/such/x.csv"], "does not exist"),
    ("results-csv-is-dir", ["results", "{root}", "--csv", "{base}"], "is a directory; give a file name"),
    ("results-missing-root", ["results", "{base}/nowhere"], "does not exist"),
    # report
    ("report-proc", ["report", "{root}", "-o", "/proc/corescale-x.html"], "cannot write report"),
    ("report-is-dir", ["report", "{root}", "-o", "{base}"], "is a directory"),
    ("report-price-nan", ["report", "{root}", "--price-per-hour", "nan"], "expected a finite number, got 'nan'"),
    ("report-price-minus-inf", ["report", "{root}", "--price-per-hour=-inf"], "expected a finite number"),
    ("report-slo-inf", ["report", "{root}", "--slo-p99-ms", "inf"], "--slo-p99-ms: expected a finite number"),
    ("report-slo-zero", ["report", "{root}", "--slo-p99-ms", "0"], "must be > 0, got '0'"),
    ("report-machine", ["report", "{root}", "--machine", "c9.huge"], "unknown machine 'c9.huge'"),
    # cost
    ("cost-price-nan", ["cost", "{root}", "--price-per-hour", "nan"], "--price-per-hour: expected a finite"),
    ("cost-price-inf", ["cost", "{root}", "--price-per-hour", "inf"], "expected a finite number, got 'inf'"),
    ("cost-price-zero", ["cost", "{root}", "--price-per-hour", "0"], "must be > 0"),
    ("cost-price-text", ["cost", "{root}", "--price-per-hour", "cheap"], "expected a number, got 'cheap'"),
    ("cost-slo-nan", ["cost", "{root}", "--price-per-hour", "1", "--slo-p99-ms", "nan"], "--slo-p99-ms: expected"),
    ("cost-slo-minus-inf", ["cost", "{root}", "--price-per-hour", "1", "--slo-p99-ms=-inf"], "finite number"),
    ("cost-csv-proc", ["cost", "{root}", "--price-per-hour", "1", "--csv", "/proc/corescale-x"],
     "cannot write --csv"),
    ("catalog-list-entry", ["cost", "{root}", "--machine", "m", "--catalog", "{base}/list_entry.yaml"],
     "must be a mapping of its fields (got [1, 2])"),
    ("catalog-scalar-entry", ["cost", "{root}", "--machine", "m", "--catalog", "{base}/scalar_entry.yaml"],
     "must be a mapping of its fields (got 3)"),
    ("catalog-negative-price", ["cost", "{root}", "--machine", "m", "--catalog", "{base}/negative_price.yaml"],
     "price_per_hour=-1.0"),
    ("catalog-zero-cores", ["cost", "{root}", "--machine", "m", "--catalog", "{base}/zero_cores.yaml"],
     "physical_cores=0"),
    ("catalog-nan-price", ["cost", "{root}", "--machine", "m", "--catalog", "{base}/nan_price.yaml"],
     "price_per_hour=nan"),
    ("catalog-text-price", ["cost", "{root}", "--machine", "m", "--catalog", "{base}/text_price.yaml"],
     "price_per_hour='cheap'"),
    ("catalog-cores-vcpus", ["cost", "{root}", "--machine", "m", "--catalog", "{base}/more_cores_than_vcpus.yaml"],
     "more physical_cores (8) than vcpus (4)"),
    ("catalog-top-list", ["cost", "--list-machines", "--catalog", "{base}/top_list.yaml"], "holds no machines"),
    ("catalog-no-date", ["cost", "--list-machines", "--catalog", "{base}/negative_price.yaml"], "no date"),
    ("run-cost-price-zero", ["run", "model=bert-tiny", "cost.price_per_hour=0"], "cost.price_per_hour must be > 0"),
    ("run-cost-price-nan", ["run", "model=bert-tiny", "cost.price_per_hour=nan"], "is not a finite number"),
    ("run-cost-bad-catalog", ["run", "model=bert-tiny", "cost.catalog={base}/negative_price.yaml"],
     "price_per_hour=-1.0"),
    ("run-cost-not-this-machine", ["run", "model=bert-tiny", "cost.machine=c7i.48xlarge"],
     "is not the measured machine"),
    ("cost-this-machine-unknown", ["cost", "{root}", "--this-machine", "c9.huge"], "unknown machine 'c9.huge'"),
    ("catalog-empty", ["cost", "{root}", "--machine", "m", "--catalog", "{base}/no_machines.yaml"],
     "holds no machines"),
    ("catalog-bad-yaml", ["cost", "--list-machines", "--catalog", "{base}/bad_yaml.yaml"], "while parsing"),
    ("catalog-missing", ["cost", "--list-machines", "--catalog", "{base}/nowhere.yaml"], "No such file"),
    # compare
    ("compare-threshold-nan", ["compare", "{root}", "{root}", "--threshold", "nan"], "--threshold: expected a"),
    ("compare-threshold-inf", ["compare", "{root}", "{root}", "--threshold", "inf"], "finite number, got 'inf'"),
    ("compare-threshold-negative", ["compare", "{root}", "{root}", "--threshold=-0.5"], "must be >= 0"),
    ("compare-csv-proc", ["compare", "{root}", "{root}", "--csv", "/proc/corescale-x"], "cannot write --csv"),
    ("compare-missing", ["compare", "{root}", "{base}/nowhere"], "does not exist"),
    # show
    ("show-random-json", ["show", "{base}/random.json"], "is not a corescale result"),
    ("show-list-json", ["show", "{base}/list.json"], "is not a corescale result"),
    ("show-no-config", ["show", "{base}/no_config"], "malformed result"),
    ("show-no-metrics", ["show", "{base}/no_metrics"], "status is ok but it holds no metrics"),
    ("show-no-metrics-json", ["show", "--json", "{base}/no_metrics"], "holds no metrics"),
    ("show-metrics-list", ["show", "{base}/metrics_list"], "malformed result"),
    ("show-nothing", ["show", "{base}/nowhere"], "no result at"),
    # info and the parser
    ("info-unknown-option", ["info", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    ("info-extra-word", ["info", "extra"], "unrecognized arguments: extra"),
    ("unknown-command", ["frobnicate"], "invalid choice"),
    # explain and backend.linear=onednn (issue 11)
    ("explain-no-profiler", ["explain", *FAST, "backend=tensorflow", "output_dir={out}"],
     "explain cannot profile backend=tensorflow"),
    ("explain-op-class", ["explain", *FAST, "--op-class", "gemm,nope", "output_dir={out}"],
     "unknown op class nope; allowed: gemm, attention"),
    ("explain-compare-one", ["explain", *FAST, "--compare", "backend=pytorch", "output_dir={out}"],
     "--compare needs KEY=A,B"),
    ("explain-instances", ["explain", *FAST, "instances=2", "cores_per_instance=1", "output_dir={out}"],
     "explain profiles one instance"),
    ("explain-output-proc", ["explain", *FAST, "output_dir=/proc/corescale-x"], "cannot write output_dir"),
    ("onednn-openvino", [*RUN, "backend=openvino", "backend.linear=onednn"],
     "unknown key 'backend.linear' for backend=openvino"),
    ("onednn-compile", [*RUN, "backend=torch_compile", "backend.linear=onednn"], "does not compose with torch_compile"),
    ("backend-precision", [*RUN, "backend=onnxruntime", "precision=bf16"],
     "backend=onnxruntime does not compute in precision=bf16; allowed precisions: fp32, int8"),
    ("onednn-int8", [*RUN, "backend.linear=onednn", "precision=int8"], "backend.linear=onednn supports precision"),
    ("onednn-explain-openvino", ["explain", *FAST, "backend=openvino", "backend.linear=onednn", "output_dir={out}"],
     "unknown key 'backend.linear' for backend=openvino"),
    # tune
    ("tune-objective", ["tune", *FAST, "objective=speed"], "unknown objective 'speed'; allowed: throughput, latency"),
    ("tune-constraint", ["tune", *FAST, "max_power_w=100"], "unknown constraint 'max_power_w': no such metric"),
    ("tune-budget-small", ["tune", *FAST, "budget=2s"], "budget=2s is too small for one trial"),
    ("tune-budget-text", ["tune", *FAST, "budget=soon"], "budget: expected a duration such as 300s, 5m"),
    ("tune-empty-space", ["tune", *FAST, "space.backend=[onnxruntime]", "precision=bf16"], "the search space is empty"),
    ("tune-backend-precision", ["tune", *FAST, "backend=tensorflow", "precision=int8"],
     "backend=tensorflow does not compute in precision=int8; allowed precisions: fp32"),
    ("tune-empty-list", ["tune", *FAST, "space.backend=[]"], "space.backend=[] leaves nothing to search"),
    ("tune-space-unknown", ["tune", *FAST, "space.flavour=[a]"], "unknown search dimension 'space.flavour'"),
    ("tune-fronts-in-process", ["tune", *FAST, "slo_p99_ms=100", "space.server.fronts=[2]"],
     "unknown search dimension 'space.server.fronts'"),
    ("tune-fronts-uneven", ["tune", *FAST, "slo_p99_ms=100", "endpoint=managed", "space.server.fronts=[3]"],
     "space.server.fronts: 3 not possible here; possible: 1, 2"),
    ("tune-fronts-word", ["tune", *FAST, "slo_p99_ms=100", "endpoint=managed", "space.server.fronts=[many]"],
     "space.server.fronts: 'many' is not a whole number >= 1"),
    ("tune-cost-no-price", ["tune", *FAST, "objective=cost"], "objective=cost needs a price"),
    ("tune-slo-nan", ["tune", *FAST, "slo_p99_ms=nan"], "slo_p99_ms=nan is not a finite number"),
    ("tune-machine", ["tune", *FAST, "objective=cost", "machine=c9.huge"], "unknown machine 'c9.huge'"),
    ("tune-layout", ["tune", *FAST, "layout=max"], "tune sets layout itself"),
    ("tune-output-proc", ["tune", *FAST, "output_dir=/proc/corescale-x"], "cannot write output_dir"),
    ("tune-server-no-slo", ["tune", *FAST, "objective=server_qps"], "objective=server_qps needs slo_p99_ms=MS"),
    ("tune-priors", ["tune", *FAST, "tune.priors=maybe"], "tune.priors=maybe: allowed all (earlier tunes' winners"),
    ("demo-priors", ["demo", "tune.priors=off"], "tune.priors=off: allowed all"),
]


SERVER = [*RUN, "scenario=server"]
TEXTS = "workload={base}/texts.jsonl:text"
CASES += [
    # scenario=server, target_qps, SLO, dynamic batching
    ("server-qps-zero", [*SERVER, "target_qps=0"], "target_qps must be a number in (0, 1e+06] or auto (got 0)"),
    ("server-qps-negative", [*SERVER, "target_qps=-5"], "target_qps must be a number in (0"),
    ("server-qps-nan", [*SERVER, "target_qps=nan"], "target_qps=nan is not a finite number"),
    ("server-qps-inf", [*SERVER, "target_qps=inf"], "target_qps=inf is not a finite number"),
    ("server-qps-word", [*SERVER, "target_qps=fast"], "or auto (got fast)"),
    ("server-qps-huge", [*SERVER, "target_qps=1e12"], "target_qps must be a number in (0"),
    ("server-no-qps", SERVER, "scenario=server needs target_qps=QPS"),
    ("server-auto-no-slo", [*SERVER, "target_qps=auto"], "give slo_p99_ms=MS"),
    ("server-slo-zero", [*SERVER, "target_qps=auto", "slo_p99_ms=0"], "slo_p99_ms must be > 0"),
    ("server-slo-nan", [*SERVER, "target_qps=auto", "slo_p99_ms=nan"], "slo_p99_ms=nan is not a finite number"),
    ("server-max-batch-zero", [*SERVER, "target_qps=5", "server.max_batch=0"],
     "server.max_batch must be a whole number from 1 to 4096 (got 0)"),
    ("server-too-few-queries", [*SERVER, "target_qps=5", "server.min_query_count=300"],
     "server.min_query_count=300 is below 459, the fewest queries LoadGen's early stopping needs to judge a 99th"),
    ("server-queue-negative", [*SERVER, "target_qps=5", "server.max_queue_ms=-1"], "server.max_queue_ms must be >= 0"),
    ("server-token-budget-small", [*SERVER, "target_qps=5", "server.max_batch_tokens=4"],
     "cannot hold one query of up to sequence_length=32"),
    ("server-padding-whole", [*SERVER, "target_qps=5", "server.max_padding=1"],
     "server.max_padding must be a share of a call's padded tokens from 0 to below 1, or null (no cap) (got 1"),
    ("server-padding-negative", [*SERVER, "target_qps=5", "server.max_padding=-0.1"],
     "server.max_padding must be a share of a call's padded tokens from 0 to below 1"),
    ("server-padding-word", [*SERVER, "target_qps=5", "server.max_padding=some"], "server.max_padding: expected"),
    ("offline-with-qps", [*RUN, "target_qps=5"], "target_qps and slo_p99_ms apply to scenario=server"),
    ("scenario-unknown", [*RUN, "scenario=online"], "unknown scenario 'online'; allowed: offline, single_stream"),
    ("sweep-server-qps-nan", ["run", "-m", *SERVER[1:], "target_qps=5,nan"], "target_qps=nan is not a finite"),
    # workloads
    ("workload-missing", [*RUN, "workload={base}/nowhere.txt"], "does not exist"),
    ("workload-empty", [*RUN, "workload={base}/empty.txt"], "holds no text"),
    ("workload-blank-lines", [*RUN, "workload={base}/blank.txt"], "holds no text"),
    ("workload-no-field", [*RUN, "workload={base}/texts.jsonl:body", "workload.tokenizer={base}"],
     "lacks the field 'body'; its fields: text"),
    ("workload-no-field-named", [*RUN, "workload={base}/texts.jsonl"], "say which field holds the text"),
    ("workload-no-column", [*RUN, "workload={base}/texts.csv:body"], "has no column 'body'; its columns: id, text"),
    ("workload-not-json", [*RUN, "workload={base}/broken.jsonl:text"], "broken.jsonl:2 is not a JSON line"),
    ("workload-preset-no-tokenizer", [*RUN, TEXTS, "model=qwen3-tiny"], "is a preset without a tokenizer"),
    ("workload-tokenizer-missing", [*RUN, TEXTS, "workload.tokenizer={base}/no-tokenizer"],
     "tokenizer directory '"),
    ("workload-tokenizer-not-one", [*RUN, TEXTS, "workload.tokenizer={base}/big_hidden"], "cannot be found"),
    ("workload-and-lengths", [*RUN, TEXTS, "workload.lengths=uniform(8,16)"], "not both"),
    ("lengths-zero", [*RUN, "workload.lengths=uniform(0,16)"], "need 1 <= A <= B <= sequence_length=32"),
    ("lengths-beyond", [*RUN, "workload.lengths=uniform(8,1000)"], "need 1 <= A <= B <= sequence_length=32"),
    ("lengths-histogram-missing", [*RUN, "workload.lengths={base}/nowhere.csv"], "nor a histogram file"),
    ("lengths-histogram-nan", [*RUN, "workload.lengths={base}/nan-histogram.csv"], "count a finite number"),
    ("workload-samples-zero", [*RUN, "workload.samples=0"], "workload.samples must be from 1 to 1000000"),
    ("pad-unknown", [*RUN, "pad=left"], "unknown pad 'left'; allowed: max, bucket, sorted"),
    # corescale serve --fronts: a whole number that divides the instances, checked before any worker or port
    ("serve-fronts-uneven", ["serve", "model=bert-tiny", "task=embed", "backend=onnxruntime", "instances=2",
                             "cores_per_instance=1", "--fronts", "3"],
     "--fronts 3 does not divide the layout's 2 instance(s) evenly among the fronts: give one of 1, 2"),
    ("serve-fronts-zero", ["serve", "model=bert-tiny", "--fronts", "0"], "expected a whole number >= 1, got '0'"),
    ("server-fronts-uneven", [*SERVER, "target_qps=5", "server.fronts=2"],
     "server.fronts=2 does not divide instances=1 evenly among the fronts: give one of 1"),
    ("server-fronts-zero", [*SERVER, "target_qps=5", "server.fronts=0"], "server.fronts must be a whole number >= 1"),
    ("serve-config-fronts-uneven", ["serve", "model=bert-tiny", "task=embed", "backend=onnxruntime", "instances=2",
                                    "cores_per_instance=1", "server.fronts=2", "--fronts", "3"],
     "--fronts 3 does not divide the layout's 2 instance(s)"),
]


def _workloads(base: Path) -> None:
    """Workload files that are wrong in one way each."""
    (base / "empty.txt").write_text("")
    (base / "blank.txt").write_text("\n  \n\n")
    (base / "texts.jsonl").write_text('{"text": "a b c"}\n{"text": "d e"}\n')
    (base / "texts.csv").write_text("id,text\n1,a b c\n")
    (base / "broken.jsonl").write_text('{"text": "a"}\n{nope\n')
    (base / "nan-histogram.csv").write_text("length,count\n16,nan\n")


def _argv(argv: list[str], place: dict, out: Path) -> list[str]:
    values = {"base": place["base"], "root": place["root"], "out": out}
    argv = [word.format(**values) for word in argv]
    return [*argv, f"output_dir={out}"] if argv[0] in ("run", "study") and not any(
        w.startswith("output_dir=") for w in argv) else argv


def _tree(path: Path) -> dict[str, float | None]:
    """Every entry under path, with each file's mtime (a directory's own mtime moves when a writability probe
    makes and removes a temporary entry in it: that leaves nothing behind)."""
    return {str(p.relative_to(path)): None if p.is_dir() else p.stat().st_mtime for p in path.rglob("*")}


@pytest.fixture
def no_workers(monkeypatch):
    """Starting an instance (or a Ray trial) fails the test: bad input must be refused before that."""
    from corescale.measure.launcher import Launcher
    from corescale.trials import ray

    def refuse(*args, **kwargs):
        raise AssertionError("a worker was started for bad input")

    monkeypatch.setattr(Launcher, "run", refuse)
    monkeypatch.setattr(ray.RayExecutor, "run", refuse)


def test_the_corpus_is_large_and_covers_every_subcommand():
    commands = {argv[0] for _, argv, _ in CASES}
    assert {"run", "study", "plan", "results", "report", "cost", "compare", "show", "info"} <= commands
    assert any(argv[:2] == ["run", "-m"] for _, argv, _ in CASES)
    assert len(CASES) >= 60 and len({case for case, _, _ in CASES}) == len(CASES)


@pytest.mark.parametrize("argv, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(argv, message, place, tmp_path, monkeypatch, capsys, no_workers):
    out = tmp_path / "out"
    out.mkdir()
    (out / "earlier.txt").write_text("an earlier file\n")
    monkeypatch.chdir(tmp_path)  # a default output dir would appear here
    before, shared = _tree(tmp_path), _tree(place["base"])
    code = main(_argv(argv, place, out))
    captured = capsys.readouterr()
    assert code == 2, captured.err
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("corescale: error: "), captured.err
    assert message in lines[0]
    assert "Traceback" not in captured.err and captured.out == ""
    assert _tree(tmp_path) == before and _tree(place["base"]) == shared  # nothing written anywhere


PROCESS_SAMPLE = ["duration-nan", "batch-1e20", "tilde-model", "output-proc", "config-wrong-type", "sweep-nan",
                  "study-threads", "plan-plus", "results-csv-proc", "report-proc", "cost-price-nan",
                  "catalog-scalar-entry", "compare-threshold-nan", "show-no-metrics", "info-extra-word"]


@pytest.mark.parametrize("case", PROCESS_SAMPLE)
@pytest.mark.slow
def test_bad_input_in_a_real_process(case, place, tmp_path):
    (argv, message), = [c[1:] for c in CASES if c[0] == case]
    out = tmp_path / "out"
    proc = corescale(*_argv(argv, place, out), "--no-progress" if argv[0] in ("run", "study") else "-v")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("corescale: error: ") and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not out.exists()


@pytest.mark.parametrize("command", ["run", "explain"])
def test_onednn_linear_on_a_torch_without_onednn(command, tmp_path, monkeypatch, capsys, no_workers):
    import torch

    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    code = main([command, *FAST, "backend.linear=onednn", f"output_dir={tmp_path / 'out'}"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and "needs oneDNN (mkldnn)" in err, err
    assert list(tmp_path.iterdir()) == []
