"""What is run: models, inputs, FLOPs."""
