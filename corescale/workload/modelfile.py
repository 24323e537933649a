"""An already exported model file as the model: an ONNX file (`model=path/model.onnx`) or an OpenVINO IR
(`model=path/model.xml` with its .bin), read without loading any framework.

What is read: the graph's inputs (a text model's: int64 `input_ids` and `attention_mask`, optionally
`token_type_ids`; anything else is refused) and outputs, which decide the task (`sentence_embedding` or another 2-D
float output: embed, as computed by the graph, no pooling added; `logits` [B, 1]: rerank, [B, C]: classify;
`last_hidden_state` or another 3-D output: encode). An ONNX file is walked at the protobuf wire level (the
weights are skipped, never read; a truncated or garbage file fails the walk); an IR's .xml is parsed and its .bin
checked to hold every constant the .xml places in it. The sizes come from a config.json beside the file when there
is one, else from the graph where it tells them (the hidden size from the output's last dimension) and the
vocabulary from the tokenizer; the rest stays unknown (FLOPs, hence GFLOP/s, are then not given).
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path
from typing import Any, BinaryIO

from corescale.errors import UserError
from corescale.workload.tasks import TASKS, of_head

FORMATS = {".onnx": "onnx", ".xml": "openvino-ir"}
TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
REQUIRED_INPUTS = ("input_ids", "attention_mask")
_ONNX_TYPES = {1: "float32", 7: "int64", 6: "int32", 10: "float16", 16: "bfloat16", 11: "float64", 9: "bool",
               2: "uint8", 3: "int8"}
_IR_TYPES = {"f32": "float32", "i64": "int64", "i32": "int32", "f16": "float16", "bf16": "bfloat16",
             "f64": "float64", "boolean": "bool", "u8": "uint8", "i8": "int8",
             "fp32": "float32", "fp16": "float16", "fp64": "float64"}  # element types, then ports' precisions
FLOATS = ("float32", "float16", "bfloat16", "float64")
_MODEL_GRAPH, _MODEL_OPSET = 7, 8  # ModelProto's fields
_GRAPH_NODE, _GRAPH_INITIALIZER, _GRAPH_INPUT, _GRAPH_OUTPUT = 1, 5, 11, 12  # GraphProto's fields
_NODE_INPUT, _NODE_OP_TYPE = 1, 4  # NodeProto's
_TENSOR_DIMS, _TENSOR_TYPE, _TENSOR_NAME, _TENSOR_EXTERNAL = 1, 2, 8, 13  # TensorProto's
_ONNX_LOW_BITS = {3: 8, 2: 8, 22: 4, 21: 4}  # TensorProto's INT8, UINT8, INT4, UINT4
_LEAST_WEIGHT = 4096  # elements: a weight matrix, not a mask or a table of a few numbers
DECOMPRESS = ("Cast", "DequantizeLinear")  # nodes that turn integer weights into floats
# what a quantized graph is made of, by scheme: ONNX operators (ONNX Runtime's contrib ones included), OpenVINO
# layer types, and COMPRESSED for an IR's integer weight constants decompressed by a Convert
COMPRESSED = "compressed weights"
QUANTIZED = {
    "dynamic": ("DynamicQuantizeLinear", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "DynamicQuantizeLSTM"),
    "static": ("QuantizeLinear", "QLinearMatMul", "QLinearConv", "QLinearAdd", "QLinearMul", "QLinearSoftmax",
               "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat", "QLinearAveragePool", "QLinearReduceMean",
               "QLinearGlobalAveragePool", "QGemm", "QAttention", "QEmbedLayerNormalization", "FakeQuantize"),
    "weight-only": ("DequantizeLinear", "MatMulNBits", "GatherBlockQuantized", COMPRESSED),
}
INTEGER_KERNELS = ("MatMulInteger", "ConvInteger", "MatMulIntegerToFloat", "QLinearMatMul", "QGemm", "QAttention",
                   "MatMulNBits")
FLOAT_MATMULS = ("MatMul", "Gemm", "MatMul_Float", "FullyConnected")  # ONNX's and OpenVINO's float GEMMs
_LOW_BITS = {"u4": 4, "i4": 4, "nf4": 4, "u8": 8, "i8": 8}  # an IR's compressed weight element types


def is_model_file(name: str) -> bool:
    return Path(name).suffix.lower() in FORMATS


def read_graph(path: Path, name: str) -> dict[str, Any]:
    """{"format", "inputs": {name: [dtype, dims]}, "outputs": {name: [dtype, dims]}, "bytes"} of a model file; one
    line when it is missing, unreadable or not a model of its kind. Dims: an int, or None where dynamic."""
    kind = FORMATS[path.suffix.lower()]
    if not path.is_file():
        raise UserError(f"model file '{name}' does not exist")
    if kind == "onnx":
        inputs, outputs, size, operators = _onnx_ports(path, name)
    else:
        inputs, outputs, size, operators = _ir_ports(path, name)
    if not outputs:
        raise UserError(f"model file '{name}' declares no output")
    found = {"format": kind, "inputs": inputs, "outputs": outputs, "bytes": size}
    quantized = quantization(operators)
    return {**found, "quantization": quantized} if quantized else found  # a float file's keys hold


def quantization(operators: Counter[str]) -> dict[str, Any] | None:
    """What the graph's operators say of its precision: None for a float graph, else {"precision": the registered
    integer precision, "scheme": dynamic | static | weight-only | mixed, "weight_bits", "operators": the counts of
    the quantized ones, "float_matmuls": the GEMMs left in floating point}."""
    from corescale.machine.precisions import integer_precision

    marks = {op for ops in QUANTIZED.values() for op in ops} | set(INTEGER_KERNELS) | {f"{COMPRESSED} {b}-bit"
                                                                                       for b in (4, 8)}
    found = {op: n for op, n in operators.items() if op in marks}
    if not found:
        return None
    named = {COMPRESSED if op.startswith(COMPRESSED) else op for op in found}
    kinds = {scheme for scheme, ops in QUANTIZED.items() if named & set(ops)}
    if kinds & {"dynamic", "static"} and not {"MatMulNBits", "GatherBlockQuantized"} & set(found):
        kinds.discard("weight-only")  # their DequantizeLinear or decompressed constants serve the quantized kernels
    scheme = next(iter(kinds)) if len(kinds) == 1 else "mixed" if kinds else "static"  # bare integer kernels: their
    # scales and zero points are constants of the graph
    bits = 4 if "MatMulNBits" in found or f"{COMPRESSED} 4-bit" in found else 8
    return {"precision": integer_precision(), "scheme": scheme, "weight_bits": bits, "operators": found,
            "float_matmuls": sum(operators[op] for op in FLOAT_MATMULS)}


def describe_quantization(found: dict[str, Any]) -> str:
    """One phrase for the record and the refusals: "int8 (dynamic; MatMulInteger x36, ...)"."""
    shown = ", ".join(f"{op} x{n}" for op, n in sorted(found["operators"].items(), key=lambda kv: -kv[1])[:3])
    bits = f", {found['weight_bits']}-bit weights" if found["weight_bits"] != 8 else ""
    return f"{found['precision']} ({found['scheme']}{bits}; {shown})"


# --- ONNX: the protobuf wire format, walked without reading the weights ------------------------------------------

def _varint(handle: BinaryIO) -> int:
    value = shift = 0
    while True:
        byte = handle.read(1)
        if not byte:
            raise ValueError("ends inside a number")
        value |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return value
        shift += 7
        if shift > 63:
            raise ValueError("a number longer than 10 bytes")


def _fields(handle: BinaryIO, end: int):
    """(field number, offset, length) of each length-delimited field up to `end`; other wire types are skipped."""
    while handle.tell() < end:
        key = _varint(handle)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0")
        if wire == 0:
            _varint(handle)
        elif wire in (1, 5):
            handle.seek(8 if wire == 1 else 4, os.SEEK_CUR)
        elif wire == 2:
            length = _varint(handle)
            start = handle.tell()
            if start + length > end:
                raise ValueError(f"field {number} runs {start + length - end} bytes past its end")
            yield number, start, length
            handle.seek(start + length)
        else:
            raise ValueError(f"wire type {wire}")
    if handle.tell() != end:
        raise ValueError("the last field runs past the end")


def _onnx_ports(path: Path, name: str) -> tuple[dict, dict, int, Counter[str]]:
    from onnx import ValueInfoProto

    size = path.stat().st_size
    found: dict[int, list[bytes]] = {_GRAPH_INPUT: [], _GRAPH_OUTPUT: []}
    seen = set()
    operators: Counter[str] = Counter()
    decompressed: set[str] = set()  # what Cast and DequantizeLinear nodes take
    low: dict[str, int] = {}  # integer weight tensors (initializers) -> their bits
    try:
        with open(path, "rb") as handle:
            for number, start, length in list(_fields(handle, size)):
                seen.add(number)
                if number == _MODEL_GRAPH:
                    handle.seek(start)
                    for inner, at, count in list(_fields(handle, start + length)):
                        if inner in found:
                            handle.seek(at)
                            found[inner].append(handle.read(count))
                        elif inner == _GRAPH_NODE:
                            op, node_inputs = _node(handle, at, count)
                            operators[op] += 1
                            if op in DECOMPRESS:
                                decompressed.update(node_inputs)
                        elif inner == _GRAPH_INITIALIZER:
                            kind, elements, tensor, location = _tensor_head(handle, at, count)
                            if location is not None and not _beside(location):
                                raise UserError(f"model file '{name}': the weight {tensor[:60]!r} names its data "
                                                f"at {location[:80]!r}, outside the file's folder; refused (an "
                                                "external data location is a file name beside the model)")
                            if kind in _ONNX_LOW_BITS and elements >= _LEAST_WEIGHT:
                                low[tensor] = _ONNX_LOW_BITS[kind]
        if _MODEL_GRAPH not in seen or _MODEL_OPSET not in seen:
            raise ValueError("no graph" if _MODEL_GRAPH not in seen else "no opset")
        ports: list[dict[str, list]] = [{}, {}]
        for side, number in enumerate((_GRAPH_INPUT, _GRAPH_OUTPUT)):
            for blob in found[number]:
                info = ValueInfoProto.FromString(blob)
                tensor = info.type.tensor_type
                dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
                ports[side][info.name] = [_ONNX_TYPES.get(tensor.elem_type, f"type {tensor.elem_type}"), dims]
    except (ValueError, OSError) as exc:  # protobuf's DecodeError is a ValueError
        raise UserError(f"model file '{name}' is not a readable ONNX model ({exc}): truncated, damaged or another "
                        "kind of file") from None
    for tensor, bits in low.items():  # integer weights turned into floats by a node: compressed weights
        if tensor in decompressed:
            operators[f"{COMPRESSED} {bits}-bit"] += 1
    return ports[0], ports[1], size + _external_bytes(path), operators


def _node(handle: BinaryIO, start: int, length: int) -> tuple[str, list[str]]:
    """A NodeProto's op_type and inputs, its other fields (a Constant's tensor among them) skipped."""
    handle.seek(start)
    op, inputs = "", []
    for number, at, count in list(_fields(handle, start + length)):
        if number in (_NODE_INPUT, _NODE_OP_TYPE):
            handle.seek(at)
            text = handle.read(count).decode("utf-8", "replace")
            op = text if number == _NODE_OP_TYPE else op
            inputs += [text] if number == _NODE_INPUT else []
    return op, inputs


def _beside(location: str) -> bool:
    """An external data location that stays in the model file's folder: relative, without `..`."""
    path = Path(location)
    return bool(location) and not path.is_absolute() and ".." not in path.parts and "\0" not in location


def _external_location(handle: BinaryIO, start: int, length: int) -> tuple[str, str]:
    """One StringStringEntryProto of a tensor's external_data: (key, value)."""
    key = value = ""
    handle.seek(start)
    for number, at, count in list(_fields(handle, start + length)):
        handle.seek(at)
        text = handle.read(count).decode("utf-8", "replace")
        key, value = (text, value) if number == 1 else (key, text) if number == 2 else (key, value)
    return key, value


def _tensor_head(handle: BinaryIO, start: int, length: int) -> tuple[int, int, str, str | None]:
    """A TensorProto's element type, element count, name and external data location (None: in the file); its data
    is skipped, never read."""
    handle.seek(start)
    end, kind, dims, name, location = start + length, 0, [], "", None
    while handle.tell() < end:
        key = _varint(handle)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value = _varint(handle)
            kind = value if number == _TENSOR_TYPE else kind
            dims += [value] if number == _TENSOR_DIMS else []
        elif wire == 2:
            count = _varint(handle)
            at = handle.tell()
            if number == _TENSOR_NAME:
                name = handle.read(count).decode("utf-8", "replace")
            elif number == _TENSOR_EXTERNAL:
                entry, named = _external_location(handle, at, count)
                location = named if entry == "location" else location
            elif number == _TENSOR_DIMS:  # packed
                while handle.tell() < at + count:
                    dims.append(_varint(handle))
            handle.seek(at + count)
        elif wire in (1, 5):
            handle.seek(8 if wire == 1 else 4, os.SEEK_CUR)
        else:
            raise ValueError(f"wire type {wire}")
    elements = 1
    for dim in dims:
        elements *= dim
    return kind, elements, name, location


def _external_bytes(path: Path) -> int:
    """Weights kept beside an ONNX file (external data, named after it by the exporters)."""
    return sum(p.stat().st_size for p in path.parent.iterdir()
               if p.name.startswith(path.name) and p != path and p.is_file())


# --- OpenVINO IR: the .xml's Parameters and Results, the .bin's size ------------------------------------------

def _byte(data, key: str, name: str) -> int:
    """A Const's `<data offset= size=>` in the .xml: a byte count (a file from someone else may hold anything)."""
    text = str(data.get(key, "0")).strip()
    if not text.isdigit() or len(text) > 19:
        raise UserError(f"model file '{name}': a constant's {key}={text[:30]!r} in the .xml is not a byte count")
    return int(text)


def _ir_ports(path: Path, name: str) -> tuple[dict, dict, int, Counter[str]]:
    weights = path.with_suffix(".bin")
    if not weights.is_file():
        raise UserError(f"model file '{name}' is an OpenVINO IR without its weights: {weights.name} is not beside it")
    try:
        root = ElementTree.parse(path).getroot()
    except (ElementTree.ParseError, OSError) as exc:
        raise UserError(f"model file '{name}' is not a readable OpenVINO IR ({exc})") from None
    layers = {layer.get("id"): layer for layer in root.iter("layer")}
    if root.tag != "net" or not layers:
        raise UserError(f"model file '{name}' is not an OpenVINO IR (no <net> of layers)")
    size = weights.stat().st_size
    needed = max((_byte(d, "offset", name) + _byte(d, "size", name) for layer in layers.values()
                  if layer.get("type") == "Const" for d in layer.iter("data")), default=0)
    if needed > size:
        raise UserError(f"model file '{name}': {weights.name} holds {size} bytes, the .xml places constants up to "
                        f"byte {needed} (truncated, or the .bin of another model)")
    inputs, outputs = {}, {}
    operators: Counter[str] = Counter(str(layer.get("type")) for layer in layers.values())
    for edge in root.iter("edge"):  # an integer constant decompressed by a Convert: a compressed weight
        source, target = layers.get(edge.get("from-layer")), layers.get(edge.get("to-layer"))
        data = source.find("data") if source is not None and source.get("type") == "Const" else None
        bits = _LOW_BITS.get(data.get("element_type", "")) if data is not None else None
        if bits and target is not None and target.get("type") == "Convert":
            operators[f"{COMPRESSED} {bits}-bit"] += 1
    for layer in layers.values():
        if layer.get("type") == "Parameter":
            port = layer.find("output/port")
            data = layer.find("data")
            kind = data.get("element_type", "") if data is not None else ""
            inputs[_port_name(port, layer)] = [_IR_TYPES.get(kind, kind), _dims(port)]
    for edge in root.iter("edge"):
        result = layers.get(edge.get("to-layer"))
        source = layers.get(edge.get("from-layer"))
        if result is None or source is None or result.get("type") != "Result":
            continue
        port = next((p for p in source.iter("port") if p.get("id") == edge.get("from-port")), None)
        precision = (port.get("precision", "") if port is not None else "").lower()
        named = (result.get("output_names") or "").split(",")[0].strip()
        outputs[named or _port_name(port, result)] = [_IR_TYPES.get(precision, precision), _dims(port)]
    return inputs, outputs, size, operators


def _port_name(port, layer) -> str:
    names = port.get("names") if port is not None else None
    return (names.split(",")[0] if names else layer.get("name", "")).strip()


def _dims(port) -> list[int | None]:
    dims = [] if port is None else [d.text or "" for d in port.findall("dim")]
    return [int(d) if d.strip().isdigit() else None for d in dims]


# --- what the graph is ---------------------------------------------------------------------------------------

def check_text_inputs(graph: dict, name: str) -> None:
    """A text model's inputs: int64 input_ids and attention_mask, optionally token_type_ids, nothing else."""
    inputs = graph["inputs"]
    shown = ", ".join(f"{k} ({v[0]})" for k, v in inputs.items()) or "none"
    other = [k for k in inputs if k not in TEXT_INPUTS]
    wrong = [k for k, v in inputs.items() if k in TEXT_INPUTS and v[0] != "int64"]
    missing = [k for k in REQUIRED_INPUTS if k not in inputs]
    if other or wrong or missing:
        raise UserError(f"model file '{name}' has inputs that are not a text model's ({shown}); corescale runs a "
                        "text model: int64 input_ids and attention_mask, optionally token_type_ids")


def graph_task(graph: dict, name: str, task: str | None) -> tuple[str, str]:
    """(task, the output that computes it): the task the outputs declare; task= may only agree with it (or ask
    for encode where the graph also has a 3-D output)."""
    outputs = {k: v for k, v in graph["outputs"].items() if v[0] in FLOATS}
    by_head: dict[str, str] = {}  # head -> the output that computes it (logits: its width names the task)
    for output, (_, dims) in outputs.items():
        if output == "sentence_embedding" or len(dims) == 2 and output != "logits":
            by_head.setdefault("pooled", output)
        elif output == "logits" and len(dims) == 2:
            by_head.setdefault("logits", output)
        elif output == "last_hidden_state" or len(dims) == 3:
            by_head.setdefault("tokens", output)
    if "sentence_embedding" in outputs:
        by_head["pooled"] = "sentence_embedding"
    if "last_hidden_state" in outputs and len(outputs["last_hidden_state"][1]) == 3:
        by_head["tokens"] = "last_hidden_state"
    width = outputs[by_head["logits"]][1][1] if "logits" in by_head else 0
    by_task = {name: by_head[entry.head] for name, entry in TASKS.items()
               if entry.head in by_head and name == of_head(entry.head, width)}
    declared = next(iter(by_task), None)
    if declared is None:
        shown = ", ".join(f"{k} {v[0]} {v[1]}" for k, v in graph["outputs"].items())
        raise UserError(f"model file '{name}' has no output corescale can measure ({shown}); expected "
                        "sentence_embedding or another 2-D float output (embed), logits (rerank, classify), or "
                        "last_hidden_state (encode)")
    if task is None or task == declared:
        return declared, by_task[declared]
    if task in by_task:  # the graph computes both (a Sentence-Transformers export with its token states)
        return task, by_task[task]
    raise UserError(f"model file '{name}' computes task={declared} (output '{by_task[declared]}'); it cannot do "
                    f"task={task}: a model file is measured as exported, no head is added")


def tokenizer_vocab(folder: Path | None) -> int | None:
    """The vocabulary size of a fast tokenizer (tokenizer.json), or None."""
    if folder is None or not (folder / "tokenizer.json").is_file():
        return None
    from tokenizers import Tokenizer

    file = folder / "tokenizer.json"
    try:
        return int(Tokenizer.from_file(str(file)).get_vocab_size(with_added_tokens=True))
    except Exception as exc:  # the Rust library raises its own exception type for any bad file
        raise UserError(f"{file} is not a readable fast tokenizer: {str(exc).splitlines()[0][:160]}") from None
