"""Op classes of a profiled call: every framework's op or layer name -> one of a few classes people reason about.

A table of rules over the op's type (its kernel or layer type, namespace dropped) and, for matrix products, the
shape of its second operand: a product with a 2-D (weight) operand, or with only one listed input (ONNX Runtime
does not list initializers), is a linear layer; one between two activations is attention (OpenVINO lists no
shapes: it turns every weight product into FullyConnected, so its MatMul is attention).
Names are used only where a framework says nothing else (OpenVINO's fused `Subgraph`, gathers of an embedding
table). What no rule claims is `other` (shown, never hidden); `overhead` is the call's wall time that no
op accounts for (dispatch, Python, the framework's own bookkeeping).
"""

from __future__ import annotations

OP_CLASSES = ("gemm", "attention", "norm_activation", "embedding", "data_movement", "other")
LABELS = {"gemm": "GEMM / linear", "attention": "attention", "norm_activation": "normalisation + activation",
          "embedding": "embedding", "data_movement": "data movement / reorders", "other": "other ops",
          "overhead": "framework overhead"}
ALL_CLASSES = (*OP_CLASSES, "overhead")

GEMM = {"addmm", "mm", "linear", "_linear_pointwise", "fullyconnected", "gemm", "matmulinteger",
        "dynamicquantizematmul", "linear_dynamic", "linear_prepack", "_mkl_linear", "mkldnn_linear"}
PRODUCTS = {"matmul", "fusedmatmul", "bmm", "baddbmm", "einsum"}  # linear or attention: decided by the shapes
ATTENTION = {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
             "_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention", "softmax", "_softmax",
             "attention", "multiheadattention", "scaleddotproductattention", "mha", "_safe_softmax"}
NORM_ACTIVATION = {"layer_norm", "native_layer_norm", "layernormalization", "skiplayernormalization", "mvn",
                   "gelu", "biasgelu", "fastgelu", "erf", "tanh", "relu", "sigmoid", "add", "add_", "mul", "mul_",
                   "div", "div_", "sub", "sqrt", "rsqrt", "pow", "multiply", "divide", "subtract", "power",
                   "eltwise", "dropout", "addcmul", "reciprocal"}
EMBEDDING = {"embedding", "embedlayernormalization", "embedding_bag"}
DATA_MOVEMENT = {"reorder", "transpose", "permute", "reshape", "view", "_reshape_alias", "contiguous", "copy_",
                 "clone", "cat", "concat", "split", "slice", "expand", "to", "_to_copy", "unsqueeze", "squeeze",
                 "flatten", "shape", "shapeof", "convert", "cast", "broadcast", "where", "select", "range", "arange",
                 "constant", "constantofshape", "as_strided", "empty", "empty_like", "zeros", "ones", "fill_",
                 "full", "gather", "unbind", "chunk", "narrow", "t", "equal", "eq", "ne", "greaterorequal",
                 "greaterequal", "and", "logicaland", "abs", "clamp", "reduceprod", "index_select", "masked_fill",
                 "item", "_local_scalar_dense", "resize_", "detach", "alias", "lift_fresh", "select_backward",
                 "expand_as", "new_ones", "ge", "bitwise_and", "__and__", "le", "lt", "gt", "bitwise_not",
                 "result", "parameter", "tensorrt", "memcpy", "identity", "tile", "repeat", "pad"}


def op_type(op: str) -> str:
    """`aten::addmm` -> `addmm`, `mkldnn::_linear_pointwise` -> `_linear_pointwise`, `MatMul` -> `matmul`."""
    return op.rsplit("::", 1)[-1].strip().lower()


def classify(op: str, name: str = "", shapes: list | None = None) -> str:
    """The class of one op: its type, then (for products) its operands' shapes, then (fused layers) its name."""
    kind, where = op_type(op), name.lower()
    if kind in GEMM:
        return "gemm"
    if kind in PRODUCTS:  # a weight operand: 2-D, or a constant the profiler does not list (ORT initializers)
        if shapes is not None and (len(shapes) == 1 or (len(shapes) > 1 and len(shapes[1]) == 2)):
            return "gemm"
        return "attention"
    if kind in ATTENTION:
        return "attention"
    if kind == "subgraph":  # OpenVINO's fused snippets: what they came from is only in the name
        return "attention" if "attention/self" in where else "norm_activation"
    if kind in EMBEDDING or (kind == "gather" and "embedding" in where):
        return "embedding"
    if kind in NORM_ACTIVATION:
        return "norm_activation"
    if kind in DATA_MOVEMENT:
        return "data_movement"
    return "other"


def check_filter(names: list[str]) -> tuple[str, ...]:
    """`explain --op-class a,b`: known classes only (one line otherwise)."""
    from corescale.errors import UserError

    unknown = [n for n in names if n not in ALL_CLASSES]
    if unknown:
        raise UserError(f"unknown op class {', '.join(unknown)}; allowed: {', '.join(ALL_CLASSES)}")
    return tuple(names)


def breakdown(ops: list[dict], wall_us: float) -> dict:
    """Time by class for one call (µs): every op's exclusive time in its class, overhead = wall - sum of ops."""
    times = dict.fromkeys(OP_CLASSES, 0.0)
    for op in ops:
        times[op["class"]] += op["us"]
    times["overhead"] = wall_us - sum(times[c] for c in OP_CLASSES)
    return times
