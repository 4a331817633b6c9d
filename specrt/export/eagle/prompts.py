"""Seed prompts the target writes itself (Magpie: Xu et al., 2024, "Alignment Data Synthesis from Scratch by
Prompting Aligned LLMs with Nothing"): an instruct model's chat template cut where a user's message begins,
sampled on from there, yields a user message drawn from the requests the model was tuned to answer. A head
trained on the target's replies to them needs no seed prompts from the user, and as many as it can afford.

On SmolLM2-135M-Instruct at T 1, three rows in four end their message within 96 tokens, none of 128 repeat
another, and they read like chat requests (coherent or not: it is the model's own idea of one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ...errors import ConfigError
from . import budget
from .generate import continue_prompts

MESSAGE_TOKENS = 96  # the longest user message kept; a row that has not ended its message by then is dropped
TEMPERATURE = 1.0  # Magpie samples the query at T 1: the model's own spread of requests
MIN_WORDS = 3
DRAWS_PER_PROMPT = 4  # give up after this many rows per prompt asked for (a template the model will not fill)
_SENTINEL = "\x00specrt user message\x00"


def with_bos(tok: Any, ids: list[int]) -> list[int]:
    """``ids`` of templated text with the BOS the tokenizer's plain encoding would put first (the runtime's rule)."""
    bos = tok.bos_token_id
    if bos is not None and tok("x").input_ids[:1] == [bos] and ids[:1] != [bos]:
        return [bos] + ids
    return ids


def user_turn(tok: Any) -> tuple[list[int], list[int]]:
    """(the ids of the chat template up to where a user's message begins, the ids that end a message): the
    special token that follows the message in the template, when one does (``<|im_end|>``, ``<|eot_id|>``)."""
    if not getattr(tok, "chat_template", None):
        raise ConfigError("--self-prompts needs a chat template: this tokenizer has none (pass --prompts instead)")
    text = tok.apply_chat_template([{"role": "user", "content": _SENTINEL}], add_generation_prompt=True,
                                   tokenize=False)
    if _SENTINEL not in text:
        raise ConfigError("--self-prompts: this chat template does not show the user's message as written")
    cut = text.index(_SENTINEL)
    prefix = with_bos(tok, tok(text[:cut], add_special_tokens=False).input_ids)
    after = tok(text[cut + len(_SENTINEL):], add_special_tokens=False).input_ids[:1]
    special = set(tok.all_special_ids)
    return prefix, [i for i in after if i in special]


def _key(text: str) -> str:
    return " ".join(text.lower().split())


def write_prompts(model: Any, tok: Any, n: int, end_ids: Sequence[int], gen: torch.Generator, taps: Sequence[int],
                  exclude: Sequence[str] = (), batch: int = 128, max_tokens: int = MESSAGE_TOKENS,
                  progress: Callable[[str, int, int, float | None], None] | None = None, until: float | None = None
                  ) -> list[str]:
    """Up to ``n`` distinct user messages the target (``model``, as it generates) writes after its template's
    user-turn prefix, in batches of ``batch`` rows; a message must end (an end id within ``max_tokens``), hold
    MIN_WORDS words and differ from the others and from ``exclude`` (case and spacing aside). Stops after
    DRAWS_PER_PROMPT · n rows, so a model that rarely ends its messages yields fewer. Reports
    ``progress("prompts", kept, n, None)`` after each batch. ``until``: a ``budget.clock()`` reading after
    which no further batch starts (the first always runs) and the batch running stops its token steps (its rows
    that had not ended their message are dropped, as any unended row is)."""
    prefix, closers = user_turn(tok)
    ends = sorted(set(end_ids) | set(closers))
    seen = {_key(p) for p in exclude}
    kept: list[str] = []
    drawn = 0
    while len(kept) < n and drawn < DRAWS_PER_PROMPT * n and not (drawn and until is not None and
                                                                 budget.clock() >= until):
        rows = min(batch, DRAWS_PER_PROMPT * n - drawn)
        for q in continue_prompts(model, [prefix] * rows, len(prefix) + max_tokens, TEMPERATURE, ends, gen, taps,
                                  until):
            message = q.tokens[len(prefix):]
            if not message or message[-1] not in ends:
                continue  # cut off by max_tokens: half a request
            text = tok.decode(message[:-1], skip_special_tokens=True).strip()
            if len(text.split()) >= MIN_WORDS and _key(text) not in seen:
                seen.add(_key(text))
                kept.append(text)
        drawn += rows
        if progress:
            progress("prompts", min(len(kept), n), n, None)
    return kept[:n]
