"""GPU engines: TensorRT builds (coming) and the PyTorch backend that runs the exported model's own
Hugging Face checkpoint, on CUDA with the verification step captured in CUDA graphs."""
