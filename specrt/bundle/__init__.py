"""What the export side writes and the runtime reads: the ONNX contract, the manifest, logit parity and
graph costs. numpy and the standard library only (``onnx`` lazily, where a graph is read)."""
