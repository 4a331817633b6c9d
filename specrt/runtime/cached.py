"""A decoder together with its cache and the shared sampling config."""

from __future__ import annotations

import time

import numpy as np

from ..bundle import contract as C
from .backends import Decoder
from .masks import speculation_mask
from .rows import LogitRows
from .sampling import SamplingConfig


class CachedModel:
    """Feeds a decoder whatever its cache lacks and returns its rows of logits, warped on demand into
    distributions over ``vocab`` ids (a draft whose padded vocabulary differs is cut or zero-extended).

    Invariant: the cache holds K/V for ``tokens[:cache.length]`` of the context it was fed.
    """

    def __init__(self, decoder: Decoder, max_context: int, vocab: int) -> None:
        self.decoder = decoder
        self.cache = decoder.new_cache(max_context)
        self.vocab = vocab
        self.passes = 0
        self.forward_s = 0.0  # time inside the engine (DecoderOutput.engine_s); the rest of a step is host work
        self._copied = 0  # device-to-host bytes of the outputs of passes before the last one
        self._device = None  # the last pass's logits when they stayed on the device
        self._serial = 0
        self.hidden = np.zeros((0, decoder.entry.dims.hidden_size))  # rows of the last `last` fed tokens
        # The graph computes only the rows' logits it is asked for (contract.LOGITS_INDEX)
        self._indexed = bool(getattr(decoder.entry, "logits_index", False))
        # A target with an EAGLE-3 tap output: the taps of consecutive positions from taps_start on, as the
        # passes made them (one array each, [rows, tap_width]), kept until the head has read them (release_taps):
        # a head that sat out some plain steps catches up over all their rows at once
        self._taps: list[np.ndarray] = []
        self.taps_start = 0

    def run(self, tokens: list[int], positions: np.ndarray, mask: np.ndarray, sampling: SamplingConfig,
            last: int, extra: dict[str, np.ndarray] | None = None) -> LogitRows:
        """One forward pass over ``tokens`` appended after ``cache.length``; the last ``last`` rows of
        logits, valid until this model's next pass. All fed entries become valid; a caller that
        rejects some rolls back the cache. ``extra``: further inputs by contract name (an EAGLE-3 head's)."""
        q_len = len(tokens)
        t0 = time.perf_counter()
        args = (self.cache, np.asarray(tokens, np.int64), positions, mask)
        kwargs: dict = {"extra": extra} if extra else {}
        if self._indexed:
            kwargs["logits_rows"] = last
        out = self.decoder.forward(*args, **kwargs)
        self.forward_s += out.engine_s if out.engine_s is not None else time.perf_counter() - t0
        self._copied += out.copied_bytes + (self._device.copied_bytes if self._device is not None else 0)
        # Only the rows the caller reads are summarised on the device (a prefill's last, not the prompt's).
        self._device = out.device_logits.tail(last) if out.device_logits is not None else None
        self.cache.advance(q_len)
        self.passes += 1
        self._serial += 1  # never reset: tells rows of this pass from rows of any later one
        self.hidden = out.hidden[q_len - last:].copy()  # small: Medusa reads one row of it
        if C.EAGLE_TAPS in out.extra:
            self._keep_taps(self.cache.length - q_len, out.extra[C.EAGLE_TAPS].copy())
        made_at = self._serial
        valid = lambda: self._serial == made_at  # noqa: E731
        if self._device is not None:
            return LogitRows(None, sampling, self.vocab, valid, device=self._device, count=last)
        return LogitRows(out.logits[len(out.logits) - last:], sampling, self.vocab, valid)

    def feed(self, tokens: list[int], sampling: SamplingConfig, last: int = 1,
             tree_parents: list[int] | tuple[int, ...] = (), extra: dict[str, np.ndarray] | None = None) -> LogitRows:
        """Feed context ``tokens`` causally, optionally followed by a token tree hanging below the last
        of them (``tree_parents`` covers the final ``len(tree_parents)`` entries of ``tokens``)."""
        prefix = len(tokens) - len(tree_parents)
        mask, positions = speculation_mask(self.cache.length, prefix, tree_parents)
        return self.run(tokens, positions, mask, sampling, last, extra)

    @property
    def taps_stop(self) -> int:
        """One past the last position whose taps are held."""
        return self.taps_start + sum(len(t) for t in self._taps)

    def _keep_taps(self, start: int, new: np.ndarray) -> None:
        """Taps of positions from ``start`` on are ``new`` now; those below it stay where they continue."""
        if not self.taps_start <= start <= self.taps_stop:  # not adjacent to what is held (a reset cache)
            self._taps, self.taps_start = [new], start
            return
        kept, end = [], self.taps_start
        for chunk in self._taps:
            if end >= start:
                break
            kept.append(chunk[:start - end])
            end += len(kept[-1])
        self._taps = kept + [new]

    def taps_at(self, start: int, stop: int) -> np.ndarray:
        """The EAGLE-3 taps of positions [start, stop), from the passes since the head last read them."""
        if not self._taps or start < self.taps_start or stop > self.taps_stop:
            raise RuntimeError(f"taps of positions [{start}, {stop}) are not among those held, "
                               f"[{self.taps_start}, {self.taps_stop if self._taps else self.taps_start})")
        return self._held()[start - self.taps_start:stop - self.taps_start]

    def _held(self) -> np.ndarray:
        """The held taps as one array [rows, tap_width], the passes' chunks joined once."""
        if len(self._taps) > 1:
            self._taps = [np.concatenate(self._taps)]
        return self._taps[0]

    def release_taps(self, before: int) -> None:
        """Forget the taps of positions below ``before``: the head's rows there are final."""
        if self._taps and before > self.taps_start:
            held = self._held()
            cut = min(before - self.taps_start, len(held))
            self._taps, self.taps_start = [held[cut:]], self.taps_start + cut

    def compact(self, start: int, keep: list[int]) -> None:
        """Keep the entries at ``start + keep[j]`` as ``start + j`` (a tree's accepted path), taps included."""
        self.cache.compact(start, keep)
        if self._taps and start >= self.taps_start:
            held = self._held()
            src = start - self.taps_start + np.asarray(keep, np.int64)
            self._taps = [np.concatenate([held[:start - self.taps_start], held[src]])]

    @property
    def copied_bytes(self) -> int:
        """Device-to-host bytes of every pass so far, including rows copied up after the pass."""
        return self._copied + (self._device.copied_bytes if self._device is not None else 0)

    def reset(self, keep: int = 0) -> None:
        """A new generation: the per-generation figures cleared, the cache cut to its first ``keep`` entries."""
        self.cache.truncate(min(keep, self.cache.length))
        self.passes = 0
        self._copied, self._device = 0, None
        self.forward_s = 0.0
        self._taps, self.taps_start = [], 0
