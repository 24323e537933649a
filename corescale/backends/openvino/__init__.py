"""OpenVINO's CPU plugin on the cached ONNX export."""
