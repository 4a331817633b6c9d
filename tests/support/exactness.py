"""What exactness tests compare against: the target's own distribution over short continuations."""

from __future__ import annotations

from specrt.check.verify import exact_distribution

PROMPTS = ["def fib(n):", "import os\nimport sys\n", "class Point:\n    def __init__(self"]


def exact_sequence_distribution(gen, prompt_ids, length, cfg) -> dict[tuple[int, ...], float]:
    """P(next `length` tokens) under the target alone, by enumerating the warped support (no cache)."""
    return exact_distribution(gen, list(prompt_ids), length, cfg)
