"""A decoder together with its cache and the shared sampling config."""

from __future__ import annotations

import numpy as np

from .backends import Decoder
from .masks import speculation_mask
from .sampling import SamplingConfig, probs_from_logits


def align_vocab(logits: np.ndarray, width: int) -> np.ndarray:
    """Cut or pad (with -inf) logits [N, V'] to [N, width]: padded embedding rows differ between models."""
    v = logits.shape[-1]
    if v == width:
        return logits
    if v > width:
        return logits[:, :width]
    return np.concatenate([logits, np.full((logits.shape[0], width - v), -np.inf, logits.dtype)], axis=1)


class CachedModel:
    """Feeds a decoder whatever its cache lacks and returns probabilities over ``vocab`` ids.

    Invariant: the cache holds K/V for ``tokens[:cache.length]`` of the context it was fed.
    """

    def __init__(self, decoder: Decoder, max_context: int, vocab: int) -> None:
        self.decoder = decoder
        self.cache = decoder.new_cache(max_context)
        self.vocab = vocab
        self.passes = 0
        self.hidden = np.zeros((0, decoder.entry.dims.hidden_size))  # rows of the last `last` fed tokens

    def run(self, tokens: list[int], positions: np.ndarray, mask: np.ndarray, sampling: SamplingConfig,
            last: int) -> np.ndarray:
        """One forward pass over ``tokens`` appended after ``cache.length``; probabilities of the last
        ``last`` rows. All fed entries become valid; a caller that rejects some rolls back the cache."""
        q_len = len(tokens)
        out = self.decoder.forward(self.cache, np.asarray(tokens, np.int64), positions, mask)
        self.cache.advance(q_len)
        self.passes += 1
        self.hidden = out.hidden[q_len - last:].copy()  # small: Medusa reads one row of it
        return probs_from_logits(align_vocab(out.logits[q_len - last:], self.vocab), sampling)

    def feed(self, tokens: list[int], sampling: SamplingConfig, last: int = 1,
             tree_parents: list[int] | tuple[int, ...] = ()) -> np.ndarray:
        """Feed context ``tokens`` causally, optionally followed by a token tree hanging below the last
        of them (``tree_parents`` covers the final ``len(tree_parents)`` entries of ``tokens``)."""
        prefix = len(tokens) - len(tree_parents)
        mask, positions = speculation_mask(self.cache.length, prefix, tree_parents)
        return self.run(tokens, positions, mask, sampling, last)

    def reset(self) -> None:
        self.cache.truncate(0)
        self.passes = 0
