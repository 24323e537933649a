"""A model file as the model (workload/modelfile.py), read without a framework: tiny ONNX graphs built with
onnx.helper and IR files written by hand, their tasks from their outputs, bad files refused in one line."""

import json
import shutil

import pytest
from onnx import TensorProto, helper, save

from corescale.backends import quality_reference, runs_model
from corescale.errors import UserError
from corescale.workload.flops import forward_flops
from corescale.workload.memory import estimate
from corescale.workload.models import PRESETS, resolve_model, source_files

TEXT = (("input_ids", TensorProto.INT64), ("attention_mask", TensorProto.INT64))


def onnx_file(path, outputs, inputs=TEXT, tokenizer=True):
    """A small valid ONNX graph: every output a Cast of attention_mask (shapes as declared)."""
    graph = helper.make_graph(
        [helper.make_node("Cast", ["attention_mask"], [name], to=TensorProto.FLOAT) for name, _ in outputs],
        "g", [helper.make_tensor_value_info(n, t, ["batch", "sequence"]) for n, t in inputs],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, dims) for name, dims in outputs])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    if tokenizer:
        shutil.copy(packaged_tokenizer(), path.parent / "tokenizer.json")
    return path


def packaged_tokenizer():
    return resolve_model("all-minilm-l6-v2").path + "/tokenizer.json"


@pytest.mark.parametrize("outputs, task, output", [
    ([("sentence_embedding", ["batch", 384])], "embed", "sentence_embedding"),
    ([("token_embeddings", ["batch", "sequence", 384]), ("sentence_embedding", ["batch", 384])], "embed",
     "sentence_embedding"),
    ([("pooled", ["batch", 64])], "embed", "pooled"),
    ([("logits", ["batch", 1])], "rerank", "logits"),
    ([("logits", ["batch", 3])], "classify", "logits"),
    ([("last_hidden_state", ["batch", "sequence", 128])], "encode", "last_hidden_state"),
])
def test_the_task_comes_from_the_outputs(tmp_path, outputs, task, output):
    spec = resolve_model(str(onnx_file(tmp_path / "model.onnx", outputs)))
    assert spec.source == "file" and spec.task == task and spec.model_file["output"] == output
    assert spec.model_file["format"] == "onnx" and spec.vocab_size == 30522  # the tokenizer's vocabulary
    assert spec.head.pooling is None and not spec.head.normalize  # the graph's own output: nothing added
    if task == "classify":
        assert spec.head.labels == ("LABEL_0", "LABEL_1", "LABEL_2")
    if task in ("embed", "encode"):
        assert spec.hidden == (384 if output != "pooled" and task == "embed" else 64 if task == "embed" else 128)


def test_task_may_only_agree_with_the_file(tmp_path):
    both = onnx_file(tmp_path / "model.onnx",
                     [("last_hidden_state", ["b", "s", 32]), ("sentence_embedding", ["b", 32])])
    assert resolve_model(str(both), task="encode").model_file["output"] == "last_hidden_state"
    with pytest.raises(UserError, match=r"computes task=embed .*cannot do task=rerank: a model file is measured as"):
        resolve_model(str(both), task="rerank")
    pooled = onnx_file(tmp_path / "pooled.onnx", [("sentence_embedding", ["b", 32])])
    with pytest.raises(UserError, match="cannot do task=encode"):
        resolve_model(str(pooled), task="encode")


def test_without_config_the_sizes_are_unknown_and_with_it_known(tmp_path):
    path = onnx_file(tmp_path / "model.onnx", [("sentence_embedding", ["b", 128])])
    spec = resolve_model(str(path))
    assert not spec.sizes_known and spec.max_positions is None and spec.model_file["sizes"] == "graph"
    assert estimate(spec, 1, 16).weights_bytes == path.stat().st_size  # the file's bytes, not a guess
    (tmp_path / "config.json").write_text(json.dumps(PRESETS["bert-tiny"]))
    known = resolve_model(str(path))
    assert known.sizes_known and known.max_positions == 512 and known.model_file["sizes"] == "config.json"
    assert forward_flops(known, 1, 16) == forward_flops(resolve_model("bert-tiny"), 1, 16)
    assert [f[0] for f in source_files(known)] == ["config.json", "model.onnx"]  # not the tokenizer, not others


def test_token_type_ids_follow_the_graph(tmp_path):
    three = (*TEXT, ("token_type_ids", TensorProto.INT64))
    with_types = resolve_model(str(onnx_file(tmp_path / "a.onnx", [("sentence_embedding", ["b", 8])], three)))
    without = resolve_model(str(onnx_file(tmp_path / "b.onnx", [("sentence_embedding", ["b", 8])])))
    assert with_types.takes_token_type_ids and not without.takes_token_type_ids


@pytest.mark.parametrize("inputs", [
    (("pixel_values", TensorProto.FLOAT),),  # an image model
    (("input_ids", TensorProto.INT64),),  # no attention_mask
    (("input_ids", TensorProto.FLOAT), ("attention_mask", TensorProto.INT64)),  # float ids
    (*TEXT, ("pixel_values", TensorProto.FLOAT)),  # something else besides
])
def test_inputs_that_are_not_a_text_models_are_refused(tmp_path, inputs):
    path = onnx_file(tmp_path / "model.onnx", [("sentence_embedding", ["b", 8])], inputs)
    with pytest.raises(UserError, match="has inputs that are not a text model's"):
        resolve_model(str(path))


def test_damaged_files_are_refused_in_one_line(tmp_path):
    good = onnx_file(tmp_path / "model.onnx", [("sentence_embedding", ["b", 8])]).read_bytes()
    (tmp_path / "truncated.onnx").write_bytes(good[:len(good) // 2])
    (tmp_path / "garbage.onnx").write_bytes(bytes(range(256)) * 20)
    (tmp_path / "empty.onnx").write_bytes(b"")
    for name in ("truncated", "garbage", "empty"):
        with pytest.raises(UserError, match=f"'{tmp_path}/{name}.onnx' is not a readable ONNX model"):
            resolve_model(str(tmp_path / f"{name}.onnx"))
    with pytest.raises(UserError, match="does not exist"):
        resolve_model(str(tmp_path / "missing.onnx"))


def test_a_file_without_a_tokenizer_or_config_is_refused(tmp_path):
    path = onnx_file(tmp_path / "model.onnx", [("sentence_embedding", ["b", 8])], tokenizer=False)
    with pytest.raises(UserError, match="needs its tokenizer: give workload.tokenizer=DIR"):
        resolve_model(str(path))
    folder = tmp_path / "tok"
    folder.mkdir()
    shutil.copy(packaged_tokenizer(), folder / "tokenizer.json")
    assert resolve_model(str(path), tokenizer=str(folder)).vocab_size == 30522


IR = """<?xml version="1.0"?>
<net name="m" version="11"><layers>
<layer id="0" name="input_ids" type="Parameter" version="opset1"><data shape="?,?" element_type="i64"/>
 <output><port id="0" precision="I64" names="input_ids"><dim>-1</dim><dim>-1</dim></port></output></layer>
<layer id="1" name="attention_mask" type="Parameter" version="opset1"><data shape="?,?" element_type="i64"/>
 <output><port id="0" precision="I64" names="attention_mask"><dim>-1</dim><dim>-1</dim></port></output></layer>
<layer id="2" name="w" type="Const" version="opset1"><data element_type="f32" shape="8" offset="0" size="32"/>
 <output><port id="0" precision="FP32"><dim>8</dim></port></output></layer>
<layer id="3" name="pool" type="Convert" version="opset1"><data destination_type="f32"/>
 <output><port id="1" precision="FP32" names="sentence_embedding"><dim>-1</dim><dim>8</dim></port></output></layer>
<layer id="4" name="out" type="Result" version="opset1"><input><port id="0" precision="FP32"><dim>-1</dim>
 <dim>8</dim></port></input></layer>
</layers><edges><edge from-layer="3" from-port="1" to-layer="4" to-port="0"/></edges></net>
"""


def test_an_openvino_ir_is_read_from_its_xml_and_needs_its_bin(tmp_path):
    xml = tmp_path / "model.xml"
    xml.write_text(IR)
    shutil.copy(packaged_tokenizer(), tmp_path / "tokenizer.json")
    with pytest.raises(UserError, match="an OpenVINO IR without its weights: model.bin is not beside it"):
        resolve_model(str(xml))
    (tmp_path / "model.bin").write_bytes(b"\0" * 16)
    with pytest.raises(UserError, match="holds 16 bytes, the .xml places constants up to byte 32"):
        resolve_model(str(xml))
    (tmp_path / "model.bin").write_bytes(b"\0" * 32)
    spec = resolve_model(str(xml))
    assert spec.task == "embed" and spec.model_file["format"] == "openvino-ir" and spec.hidden == 8
    assert spec.model_file["output"] == "sentence_embedding" and spec.model_file["bytes"] == 32
    assert [f[0] for f in source_files(spec)] == ["model.bin", "model.xml"]
    (tmp_path / "bad.xml").write_text("<net><layers>")
    (tmp_path / "bad.bin").write_bytes(b"")
    with pytest.raises(UserError, match="is not a readable OpenVINO IR"):
        resolve_model(str(tmp_path / "bad.xml"))


def test_backends_declare_which_files_they_load(tmp_path):
    onnx = resolve_model(str(onnx_file(tmp_path / "model.onnx", [("sentence_embedding", ["b", 8])])))
    xml = tmp_path / "model.xml"
    xml.write_text(IR)
    (tmp_path / "model.bin").write_bytes(b"\0" * 32)
    ir = resolve_model(str(xml))
    runs_model("onnxruntime", onnx)
    runs_model("openvino", onnx)
    runs_model("openvino", ir)
    with pytest.raises(UserError, match=r"backend=pytorch cannot run model file .* runs on onnxruntime and openvino "
                                        r"only; backend=pytorch needs the PyTorch model"):
        runs_model("pytorch", onnx)
    with pytest.raises(UserError, match="runs on openvino only; reference=onnxruntime loads onnx files only"):
        runs_model("onnxruntime", ir, "reference")
    runs_model("pytorch", resolve_model("bert-tiny"))  # a preset runs anywhere
    assert quality_reference(onnx) == "onnxruntime" and quality_reference(ir) == "openvino"
    assert quality_reference(resolve_model("bert-tiny")) == "pytorch"


def test_a_tune_of_a_file_searches_the_backends_that_load_it(tmp_path):
    from corescale.tune.plan import plan_tune
    from corescale.tune.settings import parse

    path = onnx_file(tmp_path / "model.onnx", [("sentence_embedding", ["b", 8])])
    tune = plan_tune(parse([f"model={path}", "budget=5m", f"output_dir={tmp_path / 'out'}"]))
    assert set(tune.space.backends) <= {"onnxruntime", "openvino"} and "onnxruntime" in tune.space.backends
    assert "backend pytorch: does not load onnx model files" in tune.space.notes
    assert tune.baseline[-1] == "backend=onnxruntime" and tune.reference == "onnxruntime" and tune.task == "embed"


def test_hostile_ir_constants_and_external_data_locations_are_one_line(tmp_path):
    """Review 0.4 L10: a non-numeric `offset` raised a traceback; an external data location outside the file's
    folder (absolute, `..`) is refused before any backend reads it."""
    from corescale.workload.modelfile import read_graph

    xml = tmp_path / "m.xml"
    xml.write_text('<net><layers><layer id="0" type="Const"><data offset="x" size="4"/></layer></layers></net>')
    (tmp_path / "m.bin").write_bytes(b"\0" * 8)
    with pytest.raises(UserError, match="not a byte count"):
        read_graph(xml, "m.xml")
    for location in ("/etc/passwd", "../secret.bin"):
        weight = helper.make_tensor("w", TensorProto.FLOAT, [4], [0.0] * 4)
        weight.data_location = TensorProto.EXTERNAL
        del weight.float_data[:]
        entry = weight.external_data.add()
        entry.key, entry.value = "location", location
        inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "S"])]
        outputs = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["B", "S", 4])]
        graph = helper.make_graph([helper.make_node("Identity", ["w"], ["last_hidden_state"])], "g", inputs, outputs,
                                  [weight])
        path = tmp_path / "m.onnx"
        save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
        with pytest.raises(UserError) as err:
            read_graph(path, "m.onnx")
        assert "outside the file's folder" in str(err.value) and "\n" not in str(err.value)
