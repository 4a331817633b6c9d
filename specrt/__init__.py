"""specrt: speculative decoding, exported to ONNX and run by a lean numpy + ONNX Runtime runtime."""

__version__ = "0.1.0"
