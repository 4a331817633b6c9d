"""The demo's tokenizer (byte-level BPE trained on the corpus) and its token stream cut into training windows."""

from __future__ import annotations

from typing import Iterable, Iterator

import torch

from ...errors import ConfigError

BOS, EOS = "<s>", "</s>"
BOS_ID, EOS_ID = 0, 1


def train_tokenizer(texts: Iterable[str], vocab_size: int):
    """A byte-level BPE (every byte is a token, so nothing is ever unknown) whose encodings start with <s>."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, BOS_ID)])
    if tok.token_to_id(BOS) != BOS_ID or tok.token_to_id(EOS) != EOS_ID:
        raise AssertionError("the BPE trainer must give the special tokens the first ids")
    return tok


def wrap_tokenizer(tok, max_length: int):
    """The Hugging Face tokenizer saved next to each model (what AutoTokenizer and specrt export load)."""
    from transformers import PreTrainedTokenizerFast

    # clean_up_tokenization_spaces would turn "a ." into "a." and break decode(encode(code)) == code.
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, model_max_length=max_length,
                                   clean_up_tokenization_spaces=False)


def token_stream(tok, texts: Iterable[str]) -> torch.Tensor:
    """One long int64 stream: <s> file </s> <s> file </s> ...

    Every file starts like an inference prompt does (the tokenizer prepends <s>) and ends with </s>, so the
    models learn both where code starts and where a file ends.
    """
    ids: list[int] = []
    for enc in tok.encode_batch(list(texts), add_special_tokens=False):
        ids.append(BOS_ID)
        ids.extend(enc.ids)
        ids.append(EOS_ID)
    return torch.tensor(ids, dtype=torch.long)


def random_windows(stream: torch.Tensor, seq_len: int, batch_size: int, gen: torch.Generator) -> Iterator[torch.Tensor]:
    """Endless (batch, seq_len + 1) windows at offsets drawn from ``gen``: the data order is the seed's."""
    last_start = len(stream) - (seq_len + 1)
    offsets = torch.arange(seq_len + 1)
    while True:
        starts = torch.randint(0, last_start + 1, (batch_size,), generator=gen)
        yield stream[starts[:, None] + offsets]


def fixed_windows(stream: torch.Tensor, seq_len: int, batch_size: int, batches: int) -> list[torch.Tensor]:
    """``batches`` batches of windows at evenly spaced offsets over the whole validation stream (so every
    held-out file is sampled, not just the first few), the same at every evaluation."""
    last_start = len(stream) - (seq_len + 1)
    starts = torch.linspace(0, last_start, batch_size * batches).round().long()
    return list(stream[starts[:, None] + torch.arange(seq_len + 1)].split(batch_size))


def check_stream(name: str, stream: torch.Tensor, seq_len: int) -> None:
    if len(stream) < seq_len + 1:
        raise ConfigError(f"the {name} split has {len(stream)} tokens, fewer than seq_len + 1 = {seq_len + 1}; "
                          "raise max_corpus_bytes or lower seq_len")
