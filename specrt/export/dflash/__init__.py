"""DFlash block drafts (arXiv 2602.06036): config, published checkpoint layouts, the PyTorch reference draft."""
