"""TensorFlow: eager, graph (tf.function) and XLA (jit_compile) runs of the encoder in encoder.py.

Needs only `tensorflow-cpu`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # hide TF's INFO lines in the instance logs

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from corescale.backends.base import TimedStages, require_precision, unbind_calling_thread  # noqa: E402
from corescale.backends.tensorflow.encoder import Encoder, encoder_weights  # noqa: E402

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig


def set_tf_threads(threads: int, interop_threads: int) -> None:
    """Must run before TensorFlow's runtime initialises (its first op); afterwards it can only be checked."""
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(interop_threads)
    except RuntimeError:
        current = (tf.config.threading.get_intra_op_parallelism_threads(),
                   tf.config.threading.get_inter_op_parallelism_threads())
        if current != (threads, interop_threads):
            raise RuntimeError(f"TensorFlow already runs with threads {current}, not {(threads, interop_threads)}; "
                               "thread counts are fixed once per process") from None

class EagerBackend(TimedStages):
    name = "tensorflow"
    mode = "eager"
    first_call_stage = "first_call"  # what the first call does: nothing special, tracing, XLA compilation

    def load(self, spec, cfg: BenchmarkConfig, threads, inputs) -> None:
        require_precision(self.name, cfg.precision)
        set_tf_threads(threads, cfg.interop_threads)  # before any TF op initialises the runtime
        from corescale.workload.models import build_torch_model

        with self.stage("build_model"):
            torch_model = build_torch_model(spec, cfg.seed, cfg.trust_remote_code, cfg.allow_pickle)
        unbind_calling_thread()  # TF's pools start with the first op, below, inheriting this thread's CPUs
        with self.stage("convert"):
            self.encoder = Encoder(encoder_weights(torch_model))
        del torch_model
        self.function = self.build(inputs)
        with self.stage(self.first_call_stage):
            self.forward(self.prepare(inputs))

    def build(self, inputs):
        """The callable forward() runs: the module itself, eagerly."""
        return self.encoder

    def prepare(self, inputs):
        return {name: tf.constant(array) for name, array in inputs.items()}

    def forward(self, prepared):
        return self.function(**prepared)

    def to_numpy(self, output) -> np.ndarray:
        return output.numpy().astype(np.float32, copy=False)

    def info(self) -> dict:
        return {
            "framework": "tensorflow",
            "version": tf.__version__,
            "mode": self.mode,
            "intra_op_parallelism_threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter_op_parallelism_threads": tf.config.threading.get_inter_op_parallelism_threads(),
            "onednn_opts": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default (on)"),
        }


class GraphBackend(EagerBackend):
    name = "tensorflow_graph"
    mode = "graph"
    first_call_stage = "trace"
    jit_compile = False

    def build(self, inputs):
        signature = [tf.TensorSpec([None, None], tf.as_dtype(inputs[name].dtype), name=name) for name in inputs]
        names = list(inputs)

        def run(*tensors):
            return self.encoder(**dict(zip(names, tensors)))

        function = tf.function(run, input_signature=signature, jit_compile=self.jit_compile)
        return lambda **kwargs: function(*(kwargs[name] for name in names))


class XlaBackend(GraphBackend):
    name = "tensorflow_xla"
    mode = "xla"
    first_call_stage = "compile"
    jit_compile = True
