"""PyTorch family: eager, TorchScript, torch.compile."""
