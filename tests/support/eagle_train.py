"""What the time-limit tests of EAGLE-3 training share: seed prompts, a small config and a tiny target."""

from __future__ import annotations

from pathlib import Path

from support.models import make_tokenizer, save_model

from specrt.export.eagle.train import EagleTrainConfig

PROMPTS = ["def fib(n):", "for i in range(10):", "class Point:", "The quick brown fox", "import os", "x = 1",
           "print(i)", "return n", "while True:", "a, b = b, a"]
SMALL = EagleTrainConfig(steps=30, lr=3e-3, batch_size=4, seq_len=32, num_sequences=40, draft_vocab=64, topk=16,
                         checkpoint_every=5, heldout_fraction=0.2, compute="float32")


def small_target(folder: Path) -> Path:
    """A 4-layer llama small enough to train a head for in seconds."""
    return save_model(folder, "llama", seed=1, vocab=288, layers=4, hidden=32, heads=2, kv_heads=1,
                      tokenizer=make_tokenizer(vocab=280))
