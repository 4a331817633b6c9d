"""A decoder together with its cache and the shared sampling config."""

from __future__ import annotations

import numpy as np

from .backends import Decoder
from .masks import causal_mask
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

    def feed(self, tokens: list[int], sampling: SamplingConfig, last: int = 1) -> np.ndarray:
        """Run ``tokens`` (the ones after ``cache.length``) in ONE pass; probabilities of the last ``last`` rows.

        All fed entries become valid; a caller that rejects some rolls back with ``cache.truncate``.
        """
        start, q_len = self.cache.length, len(tokens)
        out = self.decoder.forward(self.cache, np.asarray(tokens, np.int64), np.arange(start, start + q_len),
                                   causal_mask(q_len, start))
        self.cache.advance(q_len)
        self.passes += 1
        return probs_from_logits(align_vocab(out.logits[q_len - last:], self.vocab), sampling)

    def reset(self) -> None:
        self.cache.truncate(0)
        self.passes = 0
