"""Incremental detokenisation: pieces pushed in any chunking join to the full decode; stop strings cut
at the same place as on the whole text."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from specrt import demo
from specrt.runtime.generator import _TextTracker


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(demo.bundle_path() / "tokenizer.json"))


def _chunks(ids: list[int], rng: np.random.Generator):
    i = 0
    while i < len(ids):
        n = int(rng.integers(1, 6))
        yield ids[i:i + n]
        i += n


def test_pieces_join_to_the_full_decode(tokenizer):
    rng = np.random.default_rng(0)
    texts = ["def f(x):\n    return x * 2  # café ü 日本語 🙂\n", "naïve — résumé «quotes» ∑ π ≈ 3.14159"]
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        for _ in range(20):
            t = _TextTracker(tokenizer, ())
            streamed = "".join(t.push(c) for c in _chunks(ids, rng)) + t.flush()
            assert streamed == tokenizer.decode(ids, skip_special_tokens=True) == t.text
    # Random ids (byte pieces that split multi-byte characters anywhere) too.
    for _ in range(50):
        ids = rng.integers(0, tokenizer.get_vocab_size(), 40).tolist()
        t = _TextTracker(tokenizer, ())
        streamed = "".join(t.push(c) for c in _chunks(ids, rng)) + t.flush()
        full = tokenizer.decode(ids, skip_special_tokens=True)
        assert full.startswith(streamed) and (streamed == full or full.endswith("\ufffd"))


def test_stop_strings_cut_where_the_whole_text_would(tokenizer):
    rng = np.random.default_rng(1)
    text = "x = 1\nprint(x)\n# end of block\ny = 2\n"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    for stop in ("print", "\n#", "block\ny", "zzz"):
        for _ in range(10):
            t = _TextTracker(tokenizer, (stop,))
            streamed = ""
            for c in _chunks(ids, rng):
                streamed += t.push(c)
                if t.stopped:
                    break
            streamed += t.flush()
            expected = text[:text.find(stop)] if stop in text else text
            assert streamed == expected == t.text
            assert tokenizer.decode(t.ids).startswith(expected)


def test_a_sentencepiece_style_decoder_keeps_its_spaces_across_pieces():
    """Metaspace decoders drop the leading space of what they decode alone: streamed pieces keep it."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    corpus = ["the quick brown fox jumps over the lazy dog", "speculative decoding keeps the target's text",
              "a draft proposes and the target verifies"] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>"], show_progress=False))
    rng = np.random.default_rng(2)
    for text in corpus[:3]:
        ids = tok.encode(text).ids
        for _ in range(10):
            t = _TextTracker(tok, ())
            streamed = "".join(t.push(c) for c in _chunks(ids, rng)) + t.flush()
            assert streamed == tok.decode(ids, skip_special_tokens=True) == t.text
