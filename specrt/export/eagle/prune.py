"""A trained EAGLE-3 head with a smaller draft vocabulary: its N most frequent draft ids kept, the rest of its LM
head dropped (FR-Spec: Zhao et al. 2025, "Frequency-Ranked Speculative Sampling").

Why: the draft LM head is most of a small head's pass (SmolLM2-135M's: 9.4 M of its ~15 M weights at 16,384
ids), and the ids a head rarely sees in its target's text are ids it rarely drafts right. Nothing else changes:
the kept rows of the LM head are the trained ones, so the head's distribution over the kept ids is its old one
renormalised, and verification stays exact (it needs only the q the head proposes from).

The frequencies are counts of the target ids in text like the target's: those ``specrt eagle train`` records
(:data:`COUNTS_NAME`, from the replies the head trained on), or a tokenised corpus given here. The target's end
ids are always kept, as the trainer keeps them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import torch

from ...bundle.safety import write_atomic
from ...errors import ConfigError, EagleHeadError, OutputPathError
from .config import DTYPES
from .head import Eagle3Head
from .checkpoint import CONFIG_NAME, WEIGHTS_NAME, load_eagle3, save_eagle3
from .vocab import ranked_ids, token_counts

COUNTS_NAME = "draft_counts.json"  # beside a head: how often the target wrote each draft id
COUNTS_FORMAT = 1
OWN_FILES = {CONFIG_NAME, WEIGHTS_NAME, COUNTS_NAME}  # what a pruned head's folder holds (written again by a rerun)


def write_counts(folder: str | os.PathLike, counts: torch.Tensor, end_ids: Sequence[int], source: str,
                 **more: Any) -> None:
    """Write ``COUNTS_NAME`` into a head's folder: ``counts`` per draft id (in draft-id order), the target's end ids
    and where the counts come from."""
    record = {"format": COUNTS_FORMAT, "from": source, "end_ids": [int(i) for i in end_ids], **more,
              "counts": [int(c) for c in counts.tolist()]}
    write_atomic(Path(folder) / COUNTS_NAME, json.dumps(record, indent=0) + "\n")


def read_counts(folder: str | os.PathLike, draft_vocab: int) -> dict | None:
    """The ``COUNTS_NAME`` record of a head's folder (``counts`` as an int64 tensor), or None when it has none."""
    path = Path(folder) / COUNTS_NAME
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        counts = torch.tensor(record["counts"], dtype=torch.long)
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as e:
        raise EagleHeadError(f"{path} is not a draft-count record ({type(e).__name__}: {e})") from None
    if counts.shape != (draft_vocab,) or bool((counts < 0).any()):
        raise EagleHeadError(f"{path} holds {len(counts)} counts for a head of {draft_vocab} draft ids")
    return {**record, "counts": counts}


def pruned_head(head: Eagle3Head, d2t: torch.Tensor, keep: torch.Tensor
                ) -> tuple[Eagle3Head, torch.Tensor, torch.Tensor]:
    """``head`` with only the draft ids ``keep`` (ascending): (the new head, its d2t, its t2d)."""
    cfg = replace(head.cfg, draft_vocab_size=len(keep))
    small = Eagle3Head(cfg, with_embedding=head.embed_tokens is not None)
    state = head.state_dict()
    state["lm_head.weight"] = state["lm_head.weight"][keep].clone()
    small.load_state_dict(state, strict=True)
    targets = (keep + d2t[keep]).to(torch.int64)  # in the old draft order (ascending where it was)
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[targets] = True
    return small.eval(), targets - torch.arange(len(keep)), t2d


@dataclass(frozen=True)
class PruneResult:
    """What :func:`prune_eagle` kept, and how much of the counted text the head's ids covered before and after."""

    kept: int
    draft_vocab: int  # the head's before
    counted: int  # tokens counted (all target ids)
    coverage_before: float  # share of the counted tokens that are draft ids of the old head
    coverage_after: float  # ... of the new one
    counts_from: str


def _text_counts(tok: Any, text_files: Sequence[str], vocab_size: int) -> tuple[torch.Tensor, str]:
    from ..medusa import read_texts

    texts = [t for f in text_files for t in read_texts(Path(f), option="--text")]
    if not any(t.strip() for t in texts):
        raise ConfigError(f"eagle prune: no text in {', '.join(map(str, text_files))}")
    counts = token_counts([tok(t, add_special_tokens=False).input_ids for t in texts], vocab_size)
    return counts, f"text: {', '.join(str(f) for f in text_files)}"


def prune_eagle(model: str, head_dir: str | os.PathLike, out_dir: str | os.PathLike, keep: int,
                text_files: Sequence[str] = ()) -> PruneResult:
    """Write to ``out_dir`` the head of ``head_dir`` (made for the target ``model``: a Hugging Face folder or hub
    id) with its ``keep`` most frequent draft ids, in its precision (as ``save_eagle3`` lays heads out), and its
    counts beside it.

    The counts are those of ``text_files`` tokenised by the target's tokenizer, or without them those the head's
    folder records (:data:`COUNTS_NAME`, written by ``specrt eagle train``)."""
    from .data import target_end_ids
    from ..loading import load_config, load_tokenizer

    src, out = Path(head_dir), Path(out_dir)
    if out.exists() and not out.is_dir():
        raise OutputPathError(f"{out} exists and is not a folder")
    if out.exists() and src.exists() and out.resolve() == src.resolve():
        raise OutputPathError(f"eagle prune: -o must be a new folder, not the head itself ({src})")
    other = sorted(p.name for p in out.iterdir() if p.name not in OWN_FILES) if out.is_dir() else []
    if other:  # another head's training.json or a bundle: not ours to mix with
        raise OutputPathError(f"eagle prune: {out} holds {', '.join(other[:3])}; give a new or empty folder")
    target_config = load_config(model)
    cfg, head, d2t, t2d = load_eagle3(src, target_config)
    if not 1 <= keep < cfg.draft_vocab_size:
        raise ConfigError(f"eagle prune: --draft-vocab must be between 1 and {cfg.draft_vocab_size - 1} (the head "
                          f"has {cfg.draft_vocab_size} draft ids), got {keep}")
    recorded = read_counts(src, cfg.draft_vocab_size)
    if not text_files and recorded is None:
        raise ConfigError(f"eagle prune: {src} records no token counts ({COUNTS_NAME}, written by `specrt eagle "
                          "train` since 2026-12-05): pass --text FILE with text like the target's replies")
    ends = [int(i) for i in recorded["end_ids"]] if recorded is not None and recorded.get("end_ids") else None
    tok = load_tokenizer(model) if text_files or ends is None else None  # read once, for either
    targets = torch.arange(cfg.draft_vocab_size) + d2t
    if text_files:
        counts, source = _text_counts(tok, text_files, cfg.vocab_size)
    else:
        counts = torch.zeros(cfg.vocab_size, dtype=torch.long)
        counts[targets] = recorded["counts"]
        source = str(recorded.get("from", COUNTS_NAME))
    if int(counts.sum()) == 0:
        raise ConfigError(f"eagle prune: no token counted ({source})")
    if ends is None:
        ends = target_end_ids(model, target_config, tok)
    always = torch.isin(targets, torch.tensor(ends, dtype=torch.long))
    if int(always.sum()) > keep:
        raise ConfigError(f"eagle prune: --draft-vocab {keep} is fewer than the target's {int(always.sum())} end ids")
    kept = ranked_ids(counts[targets], keep, always)
    small, new_d2t, new_t2d = pruned_head(head, d2t, kept)
    dtype = json.loads((src / CONFIG_NAME).read_text()).get("torch_dtype")
    save_eagle3(out, small.cfg, small, new_d2t, new_t2d, dtype=dtype if dtype in DTYPES else "float32")
    total = int(counts.sum())
    result = PruneResult(kept=keep, draft_vocab=cfg.draft_vocab_size, counted=total,
                         coverage_before=int(counts[targets].sum()) / total,
                         coverage_after=int(counts[targets[kept]].sum()) / total, counts_from=source)
    write_counts(out, counts[targets[kept]], ends, source, pruned_from=str(src),
                 draft_vocab_before=cfg.draft_vocab_size, coverage_before=result.coverage_before,
                 coverage_after=result.coverage_after)
    return result
