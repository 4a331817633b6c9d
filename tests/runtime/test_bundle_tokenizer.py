"""A tokenizer.json under the size limit can still cost 60-80x its size to build (one 200 MiB added token: 15.6 GB,
70 s): what ``tokenizers`` would build is bounded from the JSON first, and beyond the bounds refused in one line
before the library sees the file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.refusals import assert_refused_in_one_line
import tokenizers

import specrt
from specrt.errors import BundleError


def _added(content: str, i: int = 0) -> dict:
    return {"id": 320 + i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def _long_added_token(tok: dict) -> None:
    tok["added_tokens"].append(_added("a" * (1 << 20)))  # 1 MiB: ~75 MB and a quarter second to build


def _many_added_tokens(tok: dict) -> None:
    tok["added_tokens"] += [_added(f"<{i:04d}>" + "b" * 4000, i) for i in range(600)]


def _many_merges(tok: dict) -> None:
    tok["model"]["merges"] += [tok["model"]["merges"][0]] * (4 * 336)


def _more_tokens_than_logits(tok: dict) -> None:
    vocab = tok["model"]["vocab"]
    vocab.update({f"extra{i}": len(vocab) + i for i in range(20)})


BAD = {
    "one long added token": (_long_added_token, "adds a token of 1048576 characters; more than 4096 is refused"),
    "added tokens of 2.4 M characters in all": (_many_added_tokens, "adds 602 tokens of 2403607 characters in all"),
    "more merges than 4 per token": (_many_merges, "holds 1406 merges for a vocabulary of 336"),
    "more tokens than the model has logits": (_more_tokens_than_logits, "holds 340 tokens but the target's logits "
                                                                        "cover 336 ids"),
    "a list, not a tokenizer": (lambda tok: [], "tokenizer.json is not a tokenizers JSON file"),
}


class _Unbuildable:
    """Stands in for tokenizers.Tokenizer: a refused file must never reach the library."""

    @staticmethod
    def from_str(text):
        raise AssertionError("tokenizers was asked to build a tokenizer that should have been refused")

    from_file = from_str


@pytest.mark.parametrize("case", BAD)
def test_a_tokenizer_that_would_cost_too_much_is_refused_before_it_is_built(llama_bundle, tmp_path, monkeypatch,
                                                                           case):
    bundle = tmp_path / "bundle"
    shutil.copytree(llama_bundle, bundle)
    tok = json.loads((bundle / "tokenizer.json").read_text())
    change, message = BAD[case]
    replaced = change(tok)  # None: changed in place
    (bundle / "tokenizer.json").write_text(json.dumps(tok if replaced is None else replaced))
    with monkeypatch.context() as m:  # the library is never asked to build what was refused, by load or by run
        m.setattr(tokenizers, "Tokenizer", _Unbuildable)
        assert_refused_in_one_line(bundle, message)


def test_tokenizers_within_the_bounds_load_as_before(llama_bundle, tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(llama_bundle, bundle)
    before = specrt.load(bundle, threads=1).generate("hello x", max_new_tokens=4, method="none").token_ids
    tok = json.loads((bundle / "tokenizer.json").read_text())
    tok["added_tokens"] += [_added("<|reserved_special_token_%d|>" % i, i) for i in range(16)]  # Llama 3's kind
    (bundle / "tokenizer.json").write_text(json.dumps(tok))
    gen = specrt.load(bundle, threads=1)
    assert gen.tokenizer.get_vocab_size() == 336
    assert gen.generate("hello x", max_new_tokens=4, method="none").token_ids == before


def test_the_checked_text_is_what_the_library_builds(tmp_path):
    from specrt.bundle import tokenizer_file

    path = Path(tmp_path) / "tokenizer.json"
    path.write_text(json.dumps({"added_tokens": [_added("<x>")],
                                "model": {"type": "WordLevel", "vocab": {"a": 0, "b": 1}, "unk_token": "a"}}))
    assert tokenizer_file.tokenizer_text(path, vocab_size=336) == path.read_text()
    with pytest.raises(BundleError, match="holds 2 tokens but the target's logits cover 1 ids"):
        tokenizer_file.tokenizer_text(path, vocab_size=1)
