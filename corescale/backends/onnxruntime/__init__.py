"""ONNX Runtime on the cached ONNX export."""
