"""A bundle's tokenizer.json, bounded in what the ``tokenizers`` library would build from it before it builds it.

The file's size limit (:data:`safety.MAX_TOKENIZER_BYTES`) does not bound its cost: ``tokenizers`` builds a matcher
over the added tokens at ~75 bytes per character (one 200 MiB added token: 15.6 GB and 70 s) and holds each merge
at ~40x its JSON. So the JSON is read here first (Python's parser costs a few times the file, freed at once) and
refused in one line beyond figures no real tokenizer reaches; the text read is what the library then parses, so
it sees exactly what was checked. Measured on the tokenizers of the models specrt exports: Llama 3's 256 added
tokens are ~30 characters each; its 280k merges are 2.2 per token of its vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import BundleError
from . import safety

MAX_ADDED_TOKEN_CHARS = 4096  # a special token is a short marker; ~300 KB of matcher at this length
MAX_ADDED_TOKENS_CHARS = 2 << 20  # every added token together: ~150 MB of matcher at most
MERGES_PER_TOKEN = 4  # BPE merges per id of the target's vocabulary (Llama 3: 2.2)


def tokenizer_text(path: Path, vocab_size: int) -> str:
    """The text of the tokenizer.json at ``path``, refused unless what it makes is bounded: its longest added token,
    all its added tokens together, and its vocabulary and merges against ``vocab_size`` (the target's logits:
    an id beyond them could never be fed to the model anyway)."""
    safety.checked_size(path, safety.MAX_TOKENIZER_BYTES, "tokenizer")
    try:
        text = path.read_text(encoding="utf-8")
        raw = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise BundleError(f"cannot read {path.name}: {str(e).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise BundleError(f"{path.name} is not a tokenizers JSON file (its top level is not an object)")
    _check_added(path.name, raw.get("added_tokens"))
    _check_model(path.name, raw.get("model"), vocab_size)
    return text


def _check_added(name: str, added: Any) -> None:
    if added is None:
        return
    if not isinstance(added, list) or not all(isinstance(t, dict) and isinstance(t.get("content"), str)
                                              for t in added):
        raise BundleError(f"{name}: added_tokens must be a list of tokens with a 'content' string each")
    longest = max((len(t["content"]) for t in added), default=0)
    if longest > MAX_ADDED_TOKEN_CHARS:
        raise BundleError(f"{name} adds a token of {longest} characters; more than {MAX_ADDED_TOKEN_CHARS} is refused "
                          "as corrupt or hostile (the tokenizers library would spend ~75 bytes per character on it)")
    total = sum(len(t["content"]) for t in added)
    if total > MAX_ADDED_TOKENS_CHARS or len(added) > safety.MAX_DIM["vocab_size"]:
        raise BundleError(f"{name} adds {len(added)} tokens of {total} characters in all; more than "
                          f"{MAX_ADDED_TOKENS_CHARS} characters is refused as corrupt or hostile")


def _check_model(name: str, model: Any, vocab_size: int) -> None:
    if not isinstance(model, dict):
        return  # not a tokenizer the library can build: it says so in one line
    vocab, merges = model.get("vocab"), model.get("merges")
    tokens = len(vocab) if isinstance(vocab, (dict, list)) else 0  # BPE/WordPiece/WordLevel: a dict; Unigram: a list
    if tokens > vocab_size:
        raise BundleError(f"{name} holds {tokens} tokens but the target's logits cover {vocab_size} ids: the "
                          "tokenizer is not this model's")
    count = len(merges) if isinstance(merges, list) else 0
    if count > MERGES_PER_TOKEN * vocab_size:
        raise BundleError(f"{name} holds {count} merges for a vocabulary of {vocab_size}; more than "
                          f"{MERGES_PER_TOKEN} per token is refused as corrupt or hostile")
