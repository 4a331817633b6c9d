"""Training EAGLE-3 heads (specrt/export/eagle/train.py, its data in eagle_data.py): the training step, batches, the
data pieces, and short end-to-end runs on tiny targets (seconds each). The unrolled steps, loss and acceptance
measure: test_eagle_ttt.py."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file
from support.models import CHAT_TEMPLATE, make_tokenizer, save_model, save_pattern_target, tiny_head_and_batch

from specrt.errors import ConfigError, ModelLoadError, TrainingDivergedError
from specrt.export.eagle import data as ed
from specrt.export.eagle import generate as eg
from specrt.export.eagle import train as et
from specrt.export.eagle.checkpoint import load_eagle3
from specrt.export.eagle.prune import read_counts
from specrt.export.eagle.train import EagleTrainConfig, train_eagle
from specrt.export.eagle.vocab import token_counts
from specrt.export.precision import generating

PROMPTS = ["def fib(n):", "for i in range(10):", "class Point:", "The quick brown fox", "import os", "x = 1",
           "print(i)", "return n"]
# seconds on 2 cores: 8 prompts, 32-token sequences, batches of 4
SMALL = EagleTrainConfig(steps=30, lr=3e-3, batch_size=4, seq_len=32, num_sequences=16, draft_vocab=64, topk=16,
                         checkpoint_every=10, heldout_fraction=0.25, compute="float32")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A tiny random llama (4 layers: the fewest a head can tap) with a 288-id vocabulary."""
    tok = make_tokenizer(vocab=280)
    return save_model(tmp_path_factory.mktemp("eagle-train") / "target", "llama", seed=1, vocab=288, layers=4,
                      hidden=32, heads=2, kv_heads=1, tokenizer=tok)


@pytest.fixture(scope="module")
def pattern_target(tmp_path_factory):
    return save_pattern_target(tmp_path_factory.mktemp("eagle-pattern") / "target")


@pytest.fixture(scope="module")
def trained(target, tmp_path_factory):
    """One short run on the random target, from prompts and a text file (one document per line). From a
    random head: one started as the target's last layer already matches a random target's near-flat
    output, so the held-out loss could not show that training generalises."""
    root = tmp_path_factory.mktemp("eagle-trained")
    text = root / "notes.txt"
    text.write_text("Speculative decoding drafts tokens cheaply.\nThe target verifies them in one pass.\n"
                    "def add(a, b):\n")
    calls = []
    out = root / "head"
    record = train_eagle(target, out, replace(SMALL, data_format="lines", init_from_target=False), prompts=PROMPTS,
                         data_files=[text],
                         progress=lambda *a: calls.append(a))
    return out, record, calls


# --------------------------------------------------------------------------- the step and its batches


def test_a_train_step_lowers_the_loss_and_refuses_a_non_finite_one_before_updating():
    """The step the training loop and benchmarks/eagle/eagle_train_speed.py share: the learning rate of its step
    (warm-up from near zero), clipped gradients, and nothing applied when the loss is not finite."""
    head, embed, t2d, b = tiny_head_and_batch()
    cfg = EagleTrainConfig(steps=40, lr=1e-2, ttt_steps=3, seq_len=10, compute="float32")
    opt = et.optimizer(head, cfg)
    first = et.train_step(head, opt, embed, t2d, b, cfg, "float32", 0)
    assert len(first) == 3 and opt.param_groups[0]["lr"] == cfg.lr_at(0) < cfg.lr
    for step in range(1, 30):
        last = et.train_step(head, opt, embed, t2d, b, cfg, "float32", step)
    assert last[0] < 0.5 * first[0]
    before = {k: v.clone() for k, v in head.state_dict().items()}
    b.taps[0, 3, 0] = float("nan")
    with pytest.raises(TrainingDivergedError, match="diverged at step 31"):
        et.train_step(head, opt, embed, t2d, b, cfg, "float32", 30)
    assert all(torch.equal(v, head.state_dict()[k]) for k, v in before.items())


def test_batches_group_similar_lengths_and_depend_on_the_step_alone():
    lengths = torch.randint(5, 200, (203,), generator=torch.Generator().manual_seed(0))
    sampler = ed.BatchSampler(lengths, 4, seed=3)
    assert sampler.per_epoch == 50
    epoch = [sampler.batch(s) for s in range(50)]
    seen = [i for b in epoch for i in b]
    assert len(seen) == len(set(seen)) == 200  # an epoch visits 50 whole batches, each sequence at most once
    spread = sum(int(lengths[b].max() - lengths[b].min()) for b in epoch) / 50
    assert spread < 30  # random batches of 4 over lengths 5..200 spread ~100
    again = ed.BatchSampler(lengths, 4, seed=3)
    assert [again.batch(s) for s in (120, 3, 51)] == [sampler.batch(s) for s in (120, 3, 51)]
    assert ed.BatchSampler(lengths, 4, seed=4).batch(0) != sampler.batch(0)
    assert ed.BatchSampler(torch.tensor([9, 3]), 4, seed=0).batch(0) == [1, 1, 0, 0]  # fewer than a batch: repeated


# --------------------------------------------------------------------------------------- data pieces


@pytest.mark.parametrize("arch", ["llama", "phi3", "qwen3"])
def test_a_fresh_head_starts_as_the_targets_last_layer(arch):
    """Its decoder layer is the target's last one over the fused features (fc passes the last tap through),
    and its output is the target's own: at step 0 the head maps the last tap as the target's last layer would."""
    from support.models import FACTORIES

    from specrt.export.eagle.init import head_config, new_head

    torch.manual_seed(0)
    model = FACTORIES[arch](96, 4, 64, 4, 2).eval()
    cfg = head_config(model.config, 40)
    targets = torch.arange(40) * 2
    head = new_head(cfg, model, targets, seed=0, from_target=True)
    last, mid = model.model.layers[-1], head.midlayer
    torch.testing.assert_close(mid.mlp.down_proj.weight, last.mlp.down_proj.weight)
    torch.testing.assert_close(mid.post_attention_layernorm.weight, last.post_attention_layernorm.weight)
    torch.testing.assert_close(mid.hidden_norm.weight, last.input_layernorm.weight)
    q = last.self_attn.qkv_proj.weight[:cfg.num_attention_heads * cfg.head_dim] if arch == "phi3" \
        else last.self_attn.q_proj.weight
    torch.testing.assert_close(mid.self_attn.q_proj.weight[:, 64:], q)
    torch.testing.assert_close(head.lm_head.weight, model.get_output_embeddings().weight[targets])
    taps = torch.randn(1, 3, 3 * 64)
    torch.testing.assert_close(head.fuse(taps), taps[..., 128:])  # the last tap, as it is
    plain = new_head(cfg, model, targets, seed=0, from_target=False)
    assert not torch.equal(plain.midlayer.mlp.down_proj.weight, last.mlp.down_proj.weight)


def test_draft_vocab_is_the_most_frequent_predicted_tokens_plus_the_end_ids():
    # (tokens, first scored target position): the predicted tokens are tokens[start + 1:]
    seqs = [([0, 9, 3, 3, 3, 4, 4, 5], 1),  # 3 x3, 4 x2, 5 x1 (9 is the prompt's)
            ([0, 7, 5], 1)]  # 5: now 5 and 4 tie at 2
    counts = token_counts([tokens[start + 1:] for tokens, start in seqs], 12)
    d2t, t2d, coverage = ed.choose_draft_vocab(counts, 3, end_ids=[1])
    assert (torch.arange(3) + d2t).tolist() == [1, 3, 4]  # EOS, then 3 and 4 (5 ties 4 on count, loses on id)
    assert t2d.nonzero().flatten().tolist() == [1, 3, 4]
    assert coverage == pytest.approx(5 / 7)
    d2t, t2d, coverage = ed.choose_draft_vocab(counts, None, end_ids=[1])
    assert d2t.tolist() == [0] * 12 and bool(t2d.all()) and coverage == 1.0


def test_chat_prompts_are_encoded_as_the_runtime_encodes_them():
    tok = make_tokenizer(vocab=280)
    assert ed._encode_prompt(tok, "hi", chat=True) == tok("hi").input_ids  # no template: plain encoding
    tok.chat_template = CHAT_TEMPLATE
    ids = ed._encode_prompt(tok, "hi", chat=True)
    assert ids.count(tok.bos_token_id) == 1 and ids[0] == tok.bos_token_id  # the template's BOS, not a second
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")


def test_the_cache_holds_the_targets_own_states_and_draft_log_probs(target):
    """Generation records taps, the last hidden state and the argmax from its own incremental passes; they
    match one full forward over the finished sequence, and the cached log-probs are the target's logits at
    the draft ids, renormalised over the draft vocabulary."""
    from specrt.export.loading import load_causal_lm

    model = load_causal_lm(str(target), "float32")
    taps = (1, 2, 3)
    prompt = [0, 70, 71, 72]
    (q,) = eg.continue_prompts(model, [prompt], 20, 0.0, [1], torch.Generator(), taps)
    with torch.no_grad():
        full = model(input_ids=torch.tensor([q.tokens]), output_hidden_states=True)
    want = torch.cat([full.hidden_states[i] for i in taps], -1)[0]
    torch.testing.assert_close(q.taps.float(), want, rtol=1e-2, atol=2e-3)  # fp16 storage
    gen = slice(len(prompt) - 1, len(q.tokens) - 1)
    assert q.top1[gen].tolist() == full.logits[0, gen].argmax(-1).tolist() == q.tokens[len(prompt):]  # greedy path

    targets = torch.tensor([1, 5, 70, 71, 72, 73, 100, 200])
    c = ed._cache([q], model.get_output_embeddings(), targets, 32, 8, [1], lambda *a: None, 0, 1)
    m = len(q.tokens)
    scored = ed.scored_rows(c)[0, :m]
    assert scored.tolist() == [False] * (len(prompt) - 1) + [True] * (m - len(prompt) + 1)
    logp = torch.log_softmax(full.logits[0][:, targets], -1)  # k = D here: the whole row
    got = torch.full_like(logp, float("-inf")).scatter(-1, c.ids[0, :m].long(), c.logp[0, :m].float())
    torch.testing.assert_close(got[scored], logp[scored], rtol=1e-3, atol=2e-3)


@pytest.mark.parametrize("block,scale", [(256, 1.0), (2, 1.0), (2, 7.5)])
def test_sampled_rows_follow_each_rows_distribution(block, scale):
    """The generator's sampler (inverse CDF, one uniform a row, over blocks of ids then one block's ids) draws
    each row from its own distribution, normalised or not: empirical frequencies of 40,000 draws within 4
    standard errors of p, zero-probability ids never drawn, the first and last ids reachable (the last in a
    padded block of 2), and a fixed generator seed repeats the draws."""
    p = torch.tensor([[0.5, 0.0, 0.2, 0.3, 0.0], [0.0, 0.1, 0.0, 0.0, 0.9], [0.25, 0.25, 0.25, 0.0, 0.25]])
    n = 40_000
    draws = eg.sample_rows(scale * p.repeat(n, 1), torch.Generator().manual_seed(3), block).view(n, 3)
    for row in range(3):
        freq = torch.bincount(draws[:, row], minlength=5).double() / n
        se = (p[row].double() * (1 - p[row].double()) / n).sqrt()
        assert bool((freq - p[row]).abs().le(4 * se + 1e-12).all()), (row, freq, p[row])
        assert bool(freq[p[row] == 0].eq(0).all())
    again = eg.sample_rows(scale * p.repeat(n, 1), torch.Generator().manual_seed(3), block).view(n, 3)
    assert torch.equal(draws, again)


def test_prompts_of_unequal_length_batched_together_continue_as_they_would_alone(target):
    """Generation batches rows across prompts, left-padded: each row's tokens, taps, last states and argmaxes
    are the ones it gets alone, and a row that ends (end id or max_len) stops while the others go on."""
    from specrt.export.loading import load_causal_lm

    model = load_causal_lm(str(target), "float32")
    taps = (1, 2, 3)
    prompts = [[0, 70, 71, 72, 73, 74, 75], [0, 90], [0, 100, 101, 102]]
    together = eg.continue_prompts(model, prompts, 14, 0.0, [1], torch.Generator(), taps)
    for prompt, q in zip(prompts, together):
        (alone,) = eg.continue_prompts(model, [prompt], 14, 0.0, [1], torch.Generator(), taps)
        assert q.tokens == alone.tokens and q.start == len(prompt) - 1
        assert len(q.tokens) <= 14 and q.tokens[:len(prompt)] == prompt
        torch.testing.assert_close(q.taps.float(), alone.taps.float(), rtol=1e-2, atol=2e-3)
        torch.testing.assert_close(q.final, alone.final, rtol=1e-4, atol=1e-4)
        assert q.top1.tolist() == alone.top1.tolist()
    assert not any(bool(torch.isnan(q.taps.float()).any()) for q in together)


def test_bfloat16_generation_reads_the_targets_states_to_bfloat16_precision(target):
    """compute bfloat16 generates with a bfloat16 copy of the target (the target itself stays fp32): on the
    same tokens its taps and last hidden states match the fp32 target's to bfloat16's precision."""
    from specrt.export.loading import load_causal_lm

    model = load_causal_lm(str(target), "float32")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    (q,) = eg.continue_prompts(model, [[0, 70, 71, 72]], 20, 0.0, [1], torch.Generator(), (1, 2, 3))
    low = generating(model, "bfloat16")
    assert low.get_decoder().embed_tokens.weight.dtype == torch.bfloat16
    (b,) = eg.teacher_forced(low, [q.tokens], (1, 2, 3), 4)
    (f,) = eg.teacher_forced(model, [q.tokens], (1, 2, 3), 4)
    torch.testing.assert_close(f.taps.float(), q.taps.float(), rtol=1e-2, atol=2e-3)  # fp32 paths agree
    torch.testing.assert_close(b.taps.float(), f.taps.float(), rtol=0.05, atol=0.05)
    torch.testing.assert_close(b.final, f.final, rtol=0.05, atol=0.05)
    assert (b.taps.float() - f.taps.float()).abs().max() > 0  # it did run in another precision
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert generating(model, "float32") is model


def test_compute_auto_is_bfloat16_only_where_the_cpu_has_it(monkeypatch):
    from specrt.export import precision

    assert isinstance(precision.native_bf16(), bool)
    for native, expected in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(precision, "native_bf16", lambda native=native: native)
        assert precision.resolve_compute("auto") == expected
        assert precision.resolve_compute("float32") == "float32"
        assert precision.resolve_compute("bfloat16") == "bfloat16"


def test_a_bfloat16_run_trains_and_records_its_compute(target, tmp_path):
    record = train_eagle(target, tmp_path / "head", replace(SMALL, compute="bfloat16", steps=12), prompts=PROMPTS)
    assert record["compute"] == "bfloat16" and record["config"]["compute"] == "bfloat16"
    assert record["heldout"]["kl"] < record["heldout_init"]["kl"]
    load_eagle3(tmp_path / "head")


@pytest.mark.parametrize("bad", [
    {"steps": 0}, {"steps": True}, {"steps": 2.5}, {"lr": 0.0}, {"lr": 1.5}, {"lr": float("nan")},
    {"batch_size": 0}, {"ttt_steps": 0}, {"ttt_steps": 17}, {"seq_len": 5}, {"draft_vocab": 0}, {"seed": -1},
    {"heldout_fraction": 0.0}, {"heldout_fraction": 1.0}, {"checkpoint_every": 0}, {"num_sequences": 0},
    {"temperature": -0.1}, {"topk": 0}, {"loss_decay": 0.0}, {"loss_decay": 1.5}, {"grad_clip": 0.0},
    {"data_format": "xml"}, {"dtype": "int8"}, {"chat_template": "yes"}, {"compute": "float16"},
])
def test_bad_config_values_raise_a_config_error(bad):
    with pytest.raises(ConfigError):
        EagleTrainConfig(**bad)


def test_bad_inputs_are_refused_before_training(target, tmp_path):
    with pytest.raises(ModelLoadError, match="never downloads"):
        train_eagle(tmp_path / "nowhere", tmp_path / "head", SMALL, prompts=PROMPTS)
    with pytest.raises(ConfigError, match="at least two"):
        train_eagle(target, tmp_path / "head", SMALL, prompts=["only one"])
    with pytest.raises(ConfigError):
        train_eagle(target, tmp_path / "head", SMALL, prompts=["ok", ""])
    assert not (tmp_path / "head").exists()  # nothing written, not even the work folder


def test_text_files_are_documents_per_file_or_per_line(tmp_path):
    (tmp_path / "a.txt").write_text("first line\n\nsecond line\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# notes\n")
    files = [tmp_path / "a.txt", tmp_path / "docs"]
    assert ed.read_documents(files, "chunks") == ["first line\n\nsecond line\n", "# notes\n"]
    assert ed.read_documents(files, "lines") == ["first line", "second line", "# notes"]
    with pytest.raises(ConfigError):
        ed.read_documents([tmp_path / "missing.txt"], "chunks")


# ------------------------------------------------------------------------------------ end-to-end runs


def test_training_reduces_the_loss_and_writes_a_loadable_head(trained, target):
    from transformers import AutoConfig

    out, record, _ = trained
    history = record["loss"]["history"]
    assert len(history) == SMALL.steps
    assert sum(history[-5:]) < sum(history[:5])
    assert record["heldout"]["kl"] < record["heldout_init"]["kl"]
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "draft_counts.json", "model.safetensors",
                                                     "training.json"]
    assert json.loads((out / "training.json").read_text()) == record

    cfg, head, d2t, t2d = load_eagle3(out, AutoConfig.from_pretrained(target))
    assert cfg.draft_vocab_size == record["draft_vocab_size"] <= SMALL.draft_vocab
    assert cfg.taps == (1, 2, 3)  # a 4-layer target: explicit taps, recorded in the head's config
    draft_targets = torch.arange(cfg.draft_vocab_size) + d2t
    assert bool((draft_targets[1:] > draft_targets[:-1]).all())  # ascending, as the runtime needs
    assert t2d.nonzero().flatten().tolist() == draft_targets.tolist()
    assert all(bool(t2d[i]) for i in record["end_ids"])
    counts = read_counts(out, cfg.draft_vocab_size)  # what `specrt eagle prune` ranks the draft ids by
    assert counts["end_ids"] == record["end_ids"] and int(counts["counts"].sum()) > 0
    # in draft-id order: every id but the end ids is in the vocabulary because the replies predicted it
    ends = torch.isin(draft_targets, torch.tensor(record["end_ids"]))
    assert bool((counts["counts"][~ends] > 0).all()) and len(counts["counts"]) == cfg.draft_vocab_size
    assert load_file(str(out / "model.safetensors"))["fc.weight"].dtype == torch.float16
    assert head.embed_tokens is None  # the target's frozen table, not a copy
    data = record["data"]
    assert data["documents"] == 3 and data["text_windows"] >= 3  # a line longer than seq_len makes two
    assert data["sequences_train"] > 0 and data["sequences_heldout"] > 0 and data["cache_bytes"] > 0
    assert record["config"]["steps"] == SMALL.steps and record["time_s"]["train"] > 0


def test_a_trained_head_prunes_by_the_counts_it_recorded(trained, target, tmp_path):
    from click.testing import CliRunner
    from transformers import AutoConfig

    from specrt.cli import main

    out, record, _ = trained
    res = CliRunner().invoke(main, ["eagle", "prune", str(target), str(out), "-o", str(tmp_path / "small"),
                                    "--draft-vocab", "8"])
    assert res.exit_code == 0, res.output
    assert "counted in the " in res.output and "sequences it trained on" in res.output
    cfg, _, d2t, _ = load_eagle3(out, AutoConfig.from_pretrained(target))
    small_cfg, _, small_d2t, _ = load_eagle3(tmp_path / "small", AutoConfig.from_pretrained(target))
    counts = read_counts(out, cfg.draft_vocab_size)["counts"]
    targets, kept = torch.arange(cfg.draft_vocab_size) + d2t, torch.arange(8) + small_d2t
    best = set(targets[torch.argsort(-counts, stable=True)].tolist()[:8]) | set(record["end_ids"])
    assert small_cfg.draft_vocab_size == 8 and set(kept.tolist()) <= best
    assert set(record["end_ids"]) <= set(kept.tolist())


def test_heldout_acceptance_figures(trained):
    _, record, _ = trained
    for key in ("heldout_init", "heldout"):
        m = record[key]
        assert m["roots"] > 0 and m["depth"] == SMALL.ttt_steps
        assert all(0 <= a <= 1 for a in [m["alpha1"], m["acceptance_rate"], *m["alpha_by_depth"]])
        assert 0 <= m["accepted_per_proposal"] <= SMALL.ttt_steps
        assert m["tokens_per_pass"] == pytest.approx(1 + m["accepted_per_proposal"])


def test_progress_reports_every_phase_and_step(trained):
    _, _, calls = trained
    assert calls[0][0] == "generate"
    assert {c[0] for c in calls} == {"generate", "text", "cache", "train", "evaluate"}
    text = [c[1:3] for c in calls if c[0] == "text"]  # the documents' forward passes, to the last window
    assert text[-1][0] == text[-1][1] and [d for d, _ in text] == sorted(d for d, _ in text)
    steps = [c for c in calls if c[0] == "train"]
    assert [c[1] for c in steps] == list(range(1, SMALL.steps + 1))
    assert all(c[2] == SMALL.steps and isinstance(c[3], float) for c in steps)


def test_a_head_for_a_repeating_target_learns_it(pattern_target, tmp_path):
    cfg = replace(SMALL, steps=40, draft_vocab=None)
    record = train_eagle(pattern_target, tmp_path / "head", cfg, prompts=PROMPTS)
    assert record["draft_vocab_size"] == 288  # no reduction: d2t all zero
    before, after = record["heldout_init"], record["heldout"]
    assert after["alpha1"] > before["alpha1"] + 0.2
    assert after["tokens_per_pass"] > before["tokens_per_pass"]


def test_a_warm_start_keeps_the_heads_vocabulary_and_starts_where_it_ended(pattern_target, tmp_path):
    """--init: the head starts as the given one (its held-out figures before training are the given head's on
    the new data), keeps its draft vocabulary even where the new data would choose another, and trains on."""
    first = train_eagle(pattern_target, tmp_path / "first", replace(SMALL, steps=40, draft_vocab=None),
                        prompts=PROMPTS)
    cfg = replace(SMALL, steps=10, lr=1e-3, draft_vocab=16, seed=1, init=str(tmp_path / "first"))
    record = train_eagle(pattern_target, tmp_path / "second", cfg, prompts=PROMPTS[::-1])
    assert record["draft_vocab_size"] == first["draft_vocab_size"] == 288  # not the 16 asked
    assert record["config"]["init"] == str(tmp_path / "first")
    assert record["heldout_init"]["alpha1"] > 0.5  # the trained head, not a fresh one (0 on this target)
    assert record["heldout"]["alpha1"] >= record["heldout_init"]["alpha1"] - 0.1
    _, _, d2t, _ = load_eagle3(tmp_path / "second")
    assert d2t.tolist() == load_eagle3(tmp_path / "first")[2].tolist()


def test_a_warm_start_from_a_head_for_another_target_is_refused(pattern_target, target, trained, tmp_path):
    head, _, _ = trained  # made for `target` (hidden 32); pattern_target is 64 wide
    with pytest.raises(ConfigError, match="--init"):
        train_eagle(pattern_target, tmp_path / "h", replace(SMALL, init=str(head)), prompts=PROMPTS)
    with pytest.raises(ConfigError, match="--init"):
        train_eagle(target, tmp_path / "h", replace(SMALL, init=str(tmp_path / "missing")), prompts=PROMPTS)
    assert not (tmp_path / "h").exists()


class _Stop(Exception):
    pass


def _stop_at(step: int):
    def progress(phase, done, total, loss):
        if phase == "train" and done == step:
            raise _Stop

    return progress


def test_resume_continues_and_ends_where_an_uninterrupted_run_does(target, tmp_path, trained):
    cfg = replace(SMALL, steps=20, checkpoint_every=5)
    whole = train_eagle(target, tmp_path / "whole", cfg, prompts=PROMPTS)

    out = tmp_path / "resumed"
    shutil.copytree(trained[0], out)  # an earlier head there must survive an interrupted run untouched
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(_Stop):
        train_eagle(target, out, cfg, prompts=PROMPTS, progress=_stop_at(12))
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert not list(out.rglob("*.tmp"))
    assert torch.load(out / et.WORK_DIR / et.CHECKPOINT_NAME, weights_only=True)["step"] == 10

    with pytest.raises(ConfigError, match="other data or settings.*delete it to train on the cached data"):
        train_eagle(target, out, replace(cfg, lr=1e-3), prompts=PROMPTS, resume=True)  # another optimisation
    with pytest.raises(ConfigError, match="another target, data"):
        train_eagle(target, out, replace(cfg, seed=1), prompts=PROMPTS, resume=True)

    calls = []
    resumed = train_eagle(target, out, replace(cfg, checkpoint_every=7), prompts=PROMPTS,
                          progress=lambda *a: calls.append(a), resume=True)
    train_calls = [c for c in calls if c[0] == "train"]
    assert train_calls[0] == ("train", 10, 20, None) and train_calls[1][1] == 11
    assert "generate" not in {c[0] for c in calls}  # the cache was reused
    assert resumed["resumed_from"] == 10 and whole["resumed_from"] is None
    assert resumed["loss"]["history"] == whole["loss"]["history"]
    assert resumed["heldout"] == whole["heldout"]
    a, b = load_file(str(tmp_path / "whole" / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not (out / et.WORK_DIR).exists()


def test_a_kept_cache_trains_again_with_other_settings_without_generating(target, tmp_path):
    """keep_checkpoint leaves .train/ after a finished run; with its checkpoint deleted, a resumed run with
    another lr and step count reads the cached data back (no "generate" phase) and trains from the start."""
    cfg = replace(SMALL, steps=6, checkpoint_every=3, keep_checkpoint=True)
    first = train_eagle(target, tmp_path / "head", cfg, prompts=PROMPTS)
    work = tmp_path / "head" / et.WORK_DIR
    assert (work / et.CACHE_NAME).is_file() and (work / et.CHECKPOINT_NAME).is_file()
    (work / et.CHECKPOINT_NAME).unlink()
    calls = []
    again = train_eagle(target, tmp_path / "head", replace(cfg, steps=4, lr=1e-3), prompts=PROMPTS, resume=True,
                        progress=lambda *a: calls.append(a))
    assert "generate" not in {c[0] for c in calls} and again["resumed_from"] is None
    assert len(again["loss"]["history"]) == 4 and again["data"] == first["data"]


def test_a_fresh_run_ignores_a_stale_checkpoint(target, tmp_path):
    cfg = replace(SMALL, steps=6, checkpoint_every=2)
    with pytest.raises(_Stop):
        train_eagle(target, tmp_path / "head", cfg, prompts=PROMPTS, progress=_stop_at(5))
    record = train_eagle(target, tmp_path / "head", cfg, prompts=PROMPTS)  # resume=False: starts over
    assert record["resumed_from"] is None and len(record["loss"]["history"]) == 6


def test_progress_without_a_terminal_is_one_line_per_tenth(capsys):
    """A run logged to a file (nohup, CI) must still say how far it is: rich draws nothing off a terminal."""
    from specrt.export.progress import rich_progress

    with rich_progress() as update:
        for i in range(101):
            update("train", i, 100, 1.0)
    err = capsys.readouterr().err
    assert err.count("train:") == 11 and "train: 100/100, loss 1.0000" in err


def test_a_target_whose_logits_are_not_its_lm_head_is_refused(target):
    """The cache's log-probabilities are the LM head on the last hidden state: a target that scales or caps its
    logits after the head (a stand-in wrapping the tiny llama) is refused before anything is generated."""
    from specrt.export.loading import load_causal_lm

    model = load_causal_lm(str(target), "float32")
    eg.check_logits_are_lm_head(model, [0, 70, 71])

    class Capped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def get_output_embeddings(self):
            return model.get_output_embeddings()

        def forward(self, **kwargs):
            out = model(**kwargs)
            out.logits = 3.0 * torch.tanh(out.logits / 3.0)
            return out

    with pytest.raises(ConfigError, match="not its LM head"):
        eg.check_logits_are_lm_head(Capped(), [0, 70, 71])
