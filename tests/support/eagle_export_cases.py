"""The tiny target and heads `specrt export --eagle`'s tests share (tests/export/eagle/conftest.py builds them)."""

from __future__ import annotations

from specrt.export.eagle.config import tap_layers

LAYERS, HIDDEN, DRAFT_VOCAB = 5, 64, 96
TAPS = tap_layers(LAYERS)  # (1, 2, 4)
EXPLICIT_TAPS = (1, 3, 4)
