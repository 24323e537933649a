"""TensorFlow eager, graph and XLA runs of a small BERT encoder written in TF ops."""
