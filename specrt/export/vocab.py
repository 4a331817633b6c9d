"""Draft/target vocabulary agreement: speculative decoding compares distributions id by id."""

from __future__ import annotations

from typing import Any

from ..errors import VocabMismatchError


def compare_vocab(target_tok: Any, draft_tok: Any, target_vocab: int, draft_vocab: int) -> dict[str, Any]:
    """Refuse any id whose string differs; tolerate (and record) padded embedding rows.

    ``target_vocab``/``draft_vocab`` are the models' logit widths, which may exceed the tokenizer's
    size by padding (e.g. Qwen2 1.5B vs 72B); those ids never come out of the tokenizer.
    """
    t = {i: s for s, i in target_tok.get_vocab().items()}
    d = {i: s for s, i in draft_tok.get_vocab().items()}
    differing = sorted(i for i in t.keys() | d.keys() if t.get(i) != d.get(i))
    if differing:
        shown = ", ".join(f"{i} ({t.get(i)!r} vs {d.get(i)!r})" for i in differing[:5])
        more = f" and {len(differing) - 5} more" if len(differing) > 5 else ""
        raise VocabMismatchError(f"target and draft tokenizers differ at {len(differing)} ids: {shown}{more}")
    tokenizer_size = len(t)
    for name, width in (("target", target_vocab), ("draft", draft_vocab)):
        if width < tokenizer_size:
            raise VocabMismatchError(f"the {name} model has {width} output logits but the tokenizer has "
                                     f"{tokenizer_size} tokens")
    return {"tokenizer_size": tokenizer_size, "target_logits": target_vocab, "draft_logits": draft_vocab,
            "padded": target_vocab != draft_vocab or target_vocab != tokenizer_size}
