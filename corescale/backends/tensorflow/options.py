"""Options of the TensorFlow backends (`backend=tensorflow|tensorflow_graph|tensorflow_xla`): none yet."""

from __future__ import annotations

from corescale.backends.options import without_options

# the backend first: it sets TensorFlow's log level before importing it (so its time includes TensorFlow's)
WORKER_MODULES = ("corescale.backends.tensorflow.backend", "tensorflow")
TensorFlowOptions = without_options("tensorflow", "TensorFlowOptions", __name__, worker_modules=WORKER_MODULES)
TensorFlowGraphOptions = without_options("tensorflow_graph", "TensorFlowGraphOptions", __name__,
                                         worker_modules=WORKER_MODULES)
TensorFlowXlaOptions = without_options("tensorflow_xla", "TensorFlowXlaOptions", __name__,
                                       worker_modules=WORKER_MODULES)
