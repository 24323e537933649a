"""A small BERT encoder in TensorFlow ops that takes a PyTorch BERT's state dict.

transformers 5 has no TensorFlow models, so the encoder is written here (embeddings, self-attention, exact GELU,
post-LayerNorm: BERT, RoBERTa and DistilBERT layouts): same weights, same activation, outputs comparable with the
PyTorch backends. Model code, not a backend: backend.py runs it eagerly, as a graph or through XLA.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from corescale.errors import UserError

ACTIVATIONS = {
    "gelu": lambda x: tf.nn.gelu(x, approximate=False),
    "gelu_pytorch_tanh": lambda x: tf.nn.gelu(x, approximate=True),
    "gelu_new": lambda x: tf.nn.gelu(x, approximate=True),
    "relu": tf.nn.relu,
}


@dataclass(frozen=True)
class Layout:
    """Where an architecture keeps its weights in the PyTorch state dict."""

    layer: str
    q: str
    k: str
    v: str
    attn_out: str
    attn_norm: str
    ffn_in: str
    ffn_out: str
    ffn_norm: str
    activation_key: str


_BERT = Layout("encoder.layer.{}.", "attention.self.query", "attention.self.key", "attention.self.value",
               "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense", "output.dense",
               "output.LayerNorm", "hidden_act")
_DISTILBERT = Layout("transformer.layer.{}.", "attention.q_lin", "attention.k_lin", "attention.v_lin",
                     "attention.out_lin", "sa_layer_norm", "ffn.lin1", "ffn.lin2", "output_layer_norm", "activation")
LAYOUTS = {"bert": _BERT, "roberta": _BERT, "xlm-roberta": _BERT, "camembert": _BERT, "distilbert": _DISTILBERT}
ROBERTA_POSITIONS = ("roberta", "xlm-roberta", "camembert")  # positions count from padding_idx + 1


def encoder_weights(torch_model) -> dict:
    """The PyTorch model's weights as numpy, Linear weights transposed to [in, out], Q/K/V concatenated."""
    config = torch_model.config
    model_type = config.model_type
    if model_type not in LAYOUTS:
        raise UserError(f"the tensorflow backends support model types {', '.join(LAYOUTS)} (got '{model_type}')")
    if getattr(config, "position_embedding_type", "absolute") not in (None, "absolute"):
        raise UserError(f"the tensorflow backends support absolute position embeddings only "
                        f"(got '{config.position_embedding_type}')")
    layout = LAYOUTS[model_type]
    activation = getattr(config, layout.activation_key)
    if activation not in ACTIVATIONS:
        raise UserError(f"the tensorflow backends support activations {', '.join(ACTIVATIONS)} (got '{activation}')")
    state = {k: v.detach().float().numpy() for k, v in torch_model.state_dict().items()}

    def linear(prefix):
        return state[prefix + ".weight"].T.copy(), state[prefix + ".bias"]

    def norm(prefix):
        return state[prefix + ".weight"], state[prefix + ".bias"]

    layers = []
    for i in range(config.num_hidden_layers if layout is _BERT else config.n_layers):
        p = layout.layer.format(i)
        (q, qb), (k, kb), (v, vb) = linear(p + layout.q), linear(p + layout.k), linear(p + layout.v)
        layers.append({"qkv": (np.concatenate([q, k, v], 1), np.concatenate([qb, kb, vb])),
                       "attn_out": linear(p + layout.attn_out), "attn_norm": norm(p + layout.attn_norm),
                       "ffn_in": linear(p + layout.ffn_in), "ffn_out": linear(p + layout.ffn_out),
                       "ffn_norm": norm(p + layout.ffn_norm)})
    return {
        "word": state["embeddings.word_embeddings.weight"],
        "position": state["embeddings.position_embeddings.weight"],
        "token_type": state.get("embeddings.token_type_embeddings.weight"),
        "embed_norm": norm("embeddings.LayerNorm"),
        "layers": layers,
        "heads": config.num_attention_heads if layout is _BERT else config.n_heads,
        "eps": float(getattr(config, "layer_norm_eps", 1e-12)),
        "activation": activation,
        "padding_idx": config.pad_token_id if model_type in ROBERTA_POSITIONS else None,
    }


class Encoder(tf.Module):
    """Last hidden state of a post-LayerNorm transformer encoder, computed on [batch * sequence, hidden] rows."""

    def __init__(self, weights: dict):
        super().__init__()

        def var(array):
            return tf.Variable(array, trainable=False)

        self.word, self.position = var(weights["word"]), var(weights["position"])
        self.token_type = None if weights["token_type"] is None else var(weights["token_type"])
        self.embed_norm = tuple(map(var, weights["embed_norm"]))
        self.layers = [{name: tuple(map(var, pair)) for name, pair in layer.items()} for layer in weights["layers"]]
        self.heads, self.eps, self.padding_idx = weights["heads"], weights["eps"], weights["padding_idx"]
        self.activation = ACTIVATIONS[weights["activation"]]

    def norm(self, x, params):
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(variance + self.eps) * params[0] + params[1]

    @staticmethod
    def dense(x, params):
        return tf.matmul(x, params[0]) + params[1]

    def embed(self, input_ids, token_type_ids):
        if self.padding_idx is None:
            positions = tf.range(tf.shape(input_ids)[1])[tf.newaxis, :]
        else:
            real = tf.cast(tf.not_equal(input_ids, self.padding_idx), input_ids.dtype)
            positions = tf.cumsum(real, axis=1) * real + self.padding_idx
        x = tf.gather(self.word, input_ids) + tf.gather(self.position, positions)
        if self.token_type is not None:
            types = tf.zeros_like(input_ids) if token_type_ids is None else token_type_ids
            x += tf.gather(self.token_type, types)
        return self.norm(x, self.embed_norm)

    def __call__(self, input_ids, attention_mask, token_type_ids=None):
        batch, length = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
        hidden = self.word.shape[1]
        size = hidden // self.heads
        x = tf.reshape(self.embed(input_ids, token_type_ids), [batch * length, hidden])
        # masked keys get the dtype's minimum added to their scores, as transformers' eager attention does
        bias = (1.0 - tf.cast(attention_mask, tf.float32))[:, tf.newaxis, tf.newaxis, :] * tf.float32.min
        for layer in self.layers:
            qkv = tf.reshape(self.dense(x, layer["qkv"]), [batch, length, 3, self.heads, size])
            q, k, v = tf.unstack(tf.transpose(qkv, [2, 0, 3, 1, 4]))  # each [batch, heads, length, size]
            scores = tf.matmul(q, k, transpose_b=True) * (size ** -0.5) + bias
            context = tf.matmul(tf.nn.softmax(scores, axis=-1), v)
            context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [batch * length, hidden])
            x = self.norm(x + self.dense(context, layer["attn_out"]), layer["attn_norm"])
            inner = self.activation(self.dense(x, layer["ffn_in"]))
            x = self.norm(x + self.dense(inner, layer["ffn_out"]), layer["ffn_norm"])
        return tf.reshape(x, [batch, length, hidden])
