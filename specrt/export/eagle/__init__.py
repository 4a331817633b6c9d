"""EAGLE-3 heads: the config, the PyTorch reference head and its layers, the published formats (EAGLE's flat layout,
speculators), the exported head graph, and training (data the target writes, the unrolled loss, time budget,
pruning the draft vocabulary). Imports graph/, quant/ (a GGUF target), the top-level helpers and bundle/."""
