"""Options of the TensorFlow backends (`backend=tensorflow|tensorflow_graph|tensorflow_xla`): none yet."""

from __future__ import annotations

import dataclasses

from corescale.backends.options import BackendEntry, without_options

TensorFlowOptions = without_options("tensorflow", "TensorFlowOptions", __name__)
TensorFlowGraphOptions = without_options("tensorflow_graph", "TensorFlowGraphOptions", __name__)
TensorFlowXlaOptions = without_options("tensorflow_xla", "TensorFlowXlaOptions", __name__)

_BACKEND = "corescale.backends.tensorflow.backend"
TENSORFLOW = BackendEntry(
    options=TensorFlowOptions, backend=f"{_BACKEND}:EagerBackend", extra="tensorflow", requires=("tensorflow",),
    precisions=("fp32",), openmp=False,
    forkable=False,  # TensorFlow starts threads on import: a fork would hold dead copies of them
    # its encoder takes the PyTorch model's weights; the backend before tensorflow: it sets TF's log level first
    worker_modules=("torch", "transformers", _BACKEND, "tensorflow"),
    artifacts=(),
    profiler=None,  # its profiler writes TensorBoard traces without per-call op times corescale can add up
    libraries=("tensorflow",), recorded=("keras", "keras-hub"), snippet="corescale.backends.tensorflow.recipe:snippet",
    onednn_linear=False, heads=("tokens",))
TENSORFLOW_GRAPH = dataclasses.replace(TENSORFLOW, options=TensorFlowGraphOptions, backend=f"{_BACKEND}:GraphBackend")
TENSORFLOW_XLA = dataclasses.replace(TENSORFLOW, options=TensorFlowXlaOptions, backend=f"{_BACKEND}:XlaBackend")
