"""The torch side: Hugging Face checkpoints to checked ONNX bundles, quantization, Medusa and demo training,
TensorRT engine builds, and the PyTorch backend (found by the runtime by its dotted name, never imported by it)."""
