"""DFlash block drafting: one pass of a small non-causal draft proposes a whole block.

The draft reads the target's taps of every committed position (its cache holds their K/V, appended as the
target commits them, never rolled back) and the block [last token, MASK x (B-1)] at the next positions; slot
k's logits give the token k positions on. The slots are drafted independently of each other from one pass, so
each drafted token's q is that slot's warped distribution whatever the tokens before it: verification keeps x
with probability min(1, p(x)/q(x)) exactly as for a chain drawn one token at a time, and the output is
distributed as the target's (greedy: the longest prefix the target agrees with, then its own token).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from ..bundle.contract import tap_columns
from ..bundle.manifest import Manifest
from ..errors import ConfigError
from .cached import CachedModel
from .eagle import read_vocab_map, to_target
from .proposal import Drafter, DrafterContext, Proposal
from .rows import LogitRows
from .sampling import SamplingConfig


@dataclass(frozen=True)
class DFlashParts:
    """What a bundle's DFlash draft brings to its drafter (the generator loads them on first use)."""

    # backends.ort_dflash.OrtDFlash: one pass per step (run), the context's K/V cached (length, truncate, reset),
    # its engine seconds since the last reset (forward_s)
    runner: object
    vocab_map: np.ndarray  # int64 [D_v]: the target id of each draft id, ascending
    block: int  # B: the slots of one pass (the last token, then B - 1 masks)
    mask_id: int  # the target's embedding row that fills the masked slots
    columns: np.ndarray | None  # the target tap columns the draft reads, in its order (None: all of them)


class DFlashDrafter(Drafter):
    """Drafts up to ``block - 1`` tokens per step in one pass of the bundle's DFlash draft (``draft``:
    :class:`~specrt.runtime.backends.ort_dflash.OrtDFlash`); ``columns``: the target tap columns it reads, in its
    order (None: all of them)."""

    needs_dflash: ClassVar[bool] = True
    drafts_in_one_pass: ClassVar[bool] = True

    def __init__(self, draft, target: CachedModel, vocab_map: np.ndarray, vocab: int, block: int, mask_id: int,
                 columns: np.ndarray | None = None, stop: float = 0.0) -> None:
        self.draft, self.target, self.vocab_map, self.vocab = draft, target, vocab_map, vocab
        self.block, self.mask_id, self.columns, self.stop = block, mask_id, columns, stop
        self._serial = 0

    @classmethod
    def build(cls, ctx: DrafterContext) -> "DFlashDrafter":
        d = ctx.dflash
        return cls(d.runner, ctx.target, d.vocab_map, ctx.vocab, d.block, d.mask_id, d.columns, ctx.draft_stop)

    def prefill(self, tokens: list[int], sampling: SamplingConfig) -> None:
        # What the target was fed again (a kept prefix ends where its taps start) is context the draft re-reads
        self.draft.truncate(min(self.draft.length, self.target.taps_start))

    def propose(self, tokens: list[int], gamma: int, sampling: SamplingConfig, rng: np.random.Generator) -> Proposal:
        k = min(gamma, self.block - 1)
        if k <= 0:
            return Proposal([], [])
        start = len(tokens) - 1  # the last token's position: the target has not run it, so it has no taps yet
        done = self.draft.length
        self.target.release_taps(done)  # the draft's context below done is final
        taps = self.target.taps_at(done, start)
        if self.columns is not None:
            taps = taps[:, self.columns]
        # The whole block, as the draft was trained, even where fewer tokens are wanted: its slots attend to each other
        logits = self.draft.run([tokens[-1]] + [self.mask_id] * (self.block - 1), start, taps)
        self._serial += 1
        made = self._serial
        rows = LogitRows(logits[:k], sampling, len(self.vocab_map), lambda: self._serial == made)
        drafted, dists = [], []
        for i in range(k):
            q = to_target(rows[i], self.vocab_map, self.vocab)
            drafted.append(q.sample(rng))
            dists.append(q)
            if not rows.confident(i, self.stop):
                break
        return Proposal(drafted, dists, passes=1)

    def rollback(self, valid: int) -> None:
        self.draft.truncate(valid)


def load_dflash(bundle: Path, manifest: Manifest, target: object, threads: int | None) -> DFlashParts:
    """The bundle's DFlash draft made ready: its session and context cache, its vocabulary map and the target tap
    columns it reads; one-line errors for a bundle without one or a ``target`` decoder whose backend cannot run
    it."""
    entry = manifest.dflash
    if entry is None:
        raise ConfigError("method 'dflash' needs a DFlash draft and this bundle has none "
                          "(specrt export MODEL --dflash DRAFT)")
    if not getattr(target, "supports_dflash", False):  # the target's decoder: what its backend runs beside it
        raise ConfigError(f"the {getattr(target, 'provider', 'chosen')} backend does not run DFlash drafts yet; "
                          "use --backend onnxruntime")
    from .backends.ort_dflash import OrtDFlash

    vocab_map = read_vocab_map(bundle, entry.vocab_map, entry.dims.vocab_size, manifest.target.dims.vocab_size)
    taps = manifest.target.eagle_taps
    # Manifest checked each is among the target's; reading all of them in order needs no column copy
    columns = None if entry.eagle_taps == taps else np.asarray(
        tap_columns(taps, entry.eagle_taps, manifest.target.dims.hidden_size))
    runner = OrtDFlash(bundle, entry, manifest.max_context, threads)
    return DFlashParts(runner, vocab_map, entry.block_size, entry.mask_token_id, columns)

