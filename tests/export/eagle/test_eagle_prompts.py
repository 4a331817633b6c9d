"""--self-prompts: user messages the target writes itself after its chat template's user-turn prefix (Magpie)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
import torch
from support.models import CHAT_TEMPLATE, make_tokenizer, save_model

from specrt.errors import ConfigError
from specrt.export.eagle import prompts as ep
from specrt.export.eagle.data import _split
from specrt.export.eagle.generate import TargetSequence
from specrt.export.eagle.train import WRITTEN_NAME, EagleTrainConfig, train_eagle

SMALL = EagleTrainConfig(steps=6, lr=3e-3, batch_size=4, seq_len=96, num_sequences=16, draft_vocab=64, topk=16,
                         heldout_fraction=0.25, compute="float32", init_from_target=False)
PROMPTS = ["def fib(n):", "for i in range(10):", "class Point:", "The quick brown fox"]


def _chat_tokenizer(closer_special: bool):
    tok = make_tokenizer(vocab=280)
    tok.chat_template = CHAT_TEMPLATE
    if closer_special:
        tok.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    return tok


@pytest.mark.parametrize("closer_special", [True, False])
def test_the_user_turn_is_the_template_cut_where_the_message_begins(closer_special):
    tok = _chat_tokenizer(closer_special)
    prefix, closers = ep.user_turn(tok)
    assert prefix.count(tok.bos_token_id) == 1 and prefix[0] == tok.bos_token_id
    assert tok.decode(prefix[1:]) == "<|im_start|>user\n"
    # the message ends at the template's closing special token, where it has one; else at the end ids alone
    assert closers == ([tok.convert_tokens_to_ids("<|im_end|>")] if closer_special else [])


def test_a_tokenizer_without_a_chat_template_is_refused():
    with pytest.raises(ConfigError, match="chat template"):
        ep.user_turn(make_tokenizer(vocab=280))


def test_written_prompts_end_their_message_hold_words_and_repeat_nothing(monkeypatch):
    """Scripted rows stand in for the target: cut-off, too-short, repeated and excluded messages are dropped,
    and drawing stops at DRAWS_PER_PROMPT rows per prompt asked for."""
    tok = _chat_tokenizer(True)
    prefix, (end,) = ep.user_turn(tok)

    def ids(text: str) -> list[int]:
        return tok(text, add_special_tokens=False).input_ids

    rows = [ids("How do I sort a list?") + [end], ids("an unfinished request that runs on"),  # not ended
            ids("Hi there") + [end], ids("how do  I sort a LIST?") + [end],  # too short; a repeat
            ids("Write a poem about the sea.") + [end], ids("Explain recursion to a child.") + [end],
            ids("Explain recursion to a child.") + [1]]  # a repeat, ended by the EOS id
    calls = []

    def scripted(model, prompts, max_len, temperature, end_ids, gen, taps, until=None):
        calls.append((len(prompts), max_len, temperature, sorted(end_ids)))
        assert all(p == prefix for p in prompts)
        return [TargetSequence(prefix + r, len(prefix) - 1, torch.zeros(0), torch.zeros(0), torch.zeros(0)) for r in rows]

    monkeypatch.setattr(ep, "continue_prompts", scripted)
    reports = []
    got = ep.write_prompts(None, tok, 2, [1], torch.Generator(), [1, 2, 3], exclude=["write a poem about the SEA."],
                           batch=5, progress=lambda *a: reports.append(a))
    assert got == ["How do I sort a list?", "Explain recursion to a child."]
    assert calls[0] == (5, len(prefix) + ep.MESSAGE_TOKENS, ep.TEMPERATURE, sorted({1, end}))
    assert reports[-1] == ("prompts", 2, 2, None)
    calls.clear()
    got = ep.write_prompts(None, tok, 5, [1], torch.Generator(), [1, 2, 3], batch=8)
    assert len(got) == 3 and [c[0] for c in calls] == [8, 8, 4]  # 20 rows at most for 5 prompts, then it stops


@pytest.fixture(scope="module")
def chat_target(tmp_path_factory):
    """A tiny random llama whose tokenizer has the ChatML template and <|im_end|> as a special token."""
    tok = _chat_tokenizer(True)
    return save_model(tmp_path_factory.mktemp("eagle-self") / "target", "llama", seed=1, vocab=288, layers=4,
                      hidden=32, heads=2, kv_heads=1, tokenizer=tok)


def test_a_run_with_self_prompts_trains_on_them_lists_them_and_keeps_the_seed_split(chat_target, tmp_path):
    plain = train_eagle(chat_target, tmp_path / "plain", SMALL, prompts=PROMPTS)
    cfg = replace(SMALL, self_prompts=12)
    record = train_eagle(chat_target, tmp_path / "head", cfg, prompts=PROMPTS)
    written = json.loads((tmp_path / "head" / WRITTEN_NAME).read_text())
    data = record["data"]
    assert 1 < len(written) <= 12 and data["prompts_written"] == len(written)
    assert data["prompts"] == len(PROMPTS) + len(written) and not set(written) & set(PROMPTS)
    assert record["config"]["self_prompts"] == 12 and record["time_s"]["prompts"] > 0
    # the seed prompts are split as without written ones; the written ones add held-out prompts of their own
    assert data["prompts_heldout"] == plain["data"]["prompts_heldout"] + len(_split(len(written), 0.25, 0)[1])
    assert not (tmp_path / "plain" / WRITTEN_NAME).exists()


def test_self_prompts_without_a_chat_template_fail_before_any_work(tmp_path):
    folder = save_model(tmp_path / "target", "llama", seed=1, vocab=288, layers=4, hidden=32, heads=2, kv_heads=1,
                        tokenizer=make_tokenizer(vocab=280))
    with pytest.raises(ConfigError, match="chat template"):
        train_eagle(folder, tmp_path / "head", replace(SMALL, self_prompts=4), prompts=PROMPTS)
    assert not (tmp_path / "head").exists()
    shutil.rmtree(folder)


def test_the_cli_trains_with_self_prompts_and_names_the_list(chat_target, tmp_path):
    from click.testing import CliRunner

    from specrt.cli import main

    seeds = tmp_path / "seeds.json"
    seeds.write_text(json.dumps(PROMPTS))
    args = ["eagle", "train", str(chat_target), "-o", str(tmp_path / "head"), "--prompts", str(seeds),
            "--self-prompts", "12", "--sequences", "16", "--seq-len", "96", "--batch-size", "4", "--steps", "4",
            "--draft-vocab", "64", "--compute", "float32"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    written = json.loads((tmp_path / "head" / WRITTEN_NAME).read_text())
    assert f"the target wrote {len(written)} of the 12 prompts asked for" in r.output
    assert "eagle train: on cpu, float32 matmuls" in r.output  # where it runs, said before the work
    plain = save_model(tmp_path / "plain", "llama", seed=1, vocab=288, layers=4, hidden=32, heads=2, kv_heads=1,
                       tokenizer=make_tokenizer(vocab=280))
    r = CliRunner().invoke(main, [*args[:2], str(plain), "-o", str(tmp_path / "head2"), *args[5:]])
    assert r.exit_code != 0 and "chat template" in r.output and "Traceback" not in r.output
