"""Graphs: each architecture as traceable PyTorch over the contract (explicit K/V, tree mask, taps), traced to ONNX,
checked against Hugging Face, and rewritten (fused ops, GroupQueryAttention with the cache in place, skip norms,
the logits summary graph). Imports only bundle/, runtime/ (to run what it checks) and itself."""
