"""The deployment snippet of the TensorFlow backends: TensorFlow's thread pools as corescale measured them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig


def snippet(cfg: BenchmarkConfig, threads: int, model: str) -> str:
    return (f"import tensorflow as tf\n\n{model}tf.config.threading.set_intra_op_parallelism_threads({threads})\n"
            f"tf.config.threading.set_inter_op_parallelism_threads({cfg.interop_threads})\n"
            "# build the Keras/TF model here; corescale's backend: corescale/backends/tensorflow/\n")
