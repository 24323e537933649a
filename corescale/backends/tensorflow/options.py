"""Options of the TensorFlow backends (`backend=tensorflow|tensorflow_graph|tensorflow_xla`): none yet."""

from __future__ import annotations

from corescale.backends.options import without_options

TensorFlowOptions = without_options("tensorflow", "TensorFlowOptions", __name__)
TensorFlowGraphOptions = without_options("tensorflow_graph", "TensorFlowGraphOptions", __name__)
TensorFlowXlaOptions = without_options("tensorflow_xla", "TensorFlowXlaOptions", __name__)
