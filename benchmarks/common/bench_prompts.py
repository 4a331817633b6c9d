"""The prompts a benchmark decodes on a bundle: the held-out chat prompts, rendered in the bundle's chat
template, where it has one; specrt's shipped code prompts otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import specrt.data

HELDOUT = Path(__file__).resolve().parents[1] / "prompts" / "chat-heldout.json"


def bundle_prompts(gen, path: str | Path | None = None) -> tuple[list[str], bool]:
    """The prompts for ``gen``'s bundle (those in ``path``, a JSON list, where given) and whether they are chat
    messages (the bundle has a chat template)."""
    chat = gen.manifest.tokenizer.chat_template is not None
    path = path or (HELDOUT if chat else None)
    return (json.loads(Path(path).read_text()) if path else specrt.data.prompts("code")), chat


def encoded_prompts(gen) -> tuple[list[list[int]], bool]:
    """:func:`bundle_prompts` as token ids, chat prompts rendered as one user message each."""
    prompts, chat = bundle_prompts(gen)
    return [gen.encode_chat([{"role": "user", "content": p}]) if chat else gen.encode(p) for p in prompts], chat
