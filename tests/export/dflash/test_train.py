"""Training DFlash drafts (specrt/export/dflash/train.py, its objective in losses.py): the block mask, the many-block
training pass against the reference draft run block by block, the loss's targets and weights, and short runs on the
demo target (seconds each) that write a folder read_draft reads back."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from specrt.cli import main
from specrt.errors import ConfigError
from specrt.export.dflash import losses as dl
from specrt.export.dflash.checkpoint import read_draft
from specrt.export.dflash.config import DFlashConfig
from specrt.export.dflash.model import DFlashDraft
from specrt.export.dflash.new_draft import choose_mask_token
from specrt.export.dflash.train import CACHE_NAME, CHECKPOINT_NAME, WORK_DIR, optimizer, train_dflash, train_step
from specrt.export.dflash.train_config import DFlashTrainConfig, default_gamma
from specrt.export.eagle.data import SequenceCache

DEMO = Path(__file__).resolve().parents[3] / "demo" / "hf" / "target"  # a tiny Llama: 8 layers, 512 wide, 4096 ids
PROMPTS = ["def fib(n):", "for i in range(10):", "class Point:", "import os", "x = 1", "print(i)", "return n",
           "with open(path) as f:"]
# seconds on 2 cores: 8 prompts, 32-token sequences, a few steps
SMALL = DFlashTrainConfig(steps=6, batch_size=2, anchors=8, block_size=8, layers=1, seq_len=32, num_sequences=6,
                          draft_vocab=512, topk=16, heldout_fraction=0.25, checkpoint_every=3, compute="float32",
                          device="cpu", keep_checkpoint=True)


def tiny_cfg(**changes) -> DFlashConfig:
    fields = dict(hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                  rms_norm_eps=1e-6, rope_theta=10000.0, block_size=4, mask_token_id=15, target_layer_ids=(1, 2),
                  vocab_size=16, max_position_embeddings=256)
    return DFlashConfig(**{**fields, **changes})


def random_draft(cfg: DFlashConfig, dtype=torch.float64) -> DFlashDraft:
    """Random weights, norms away from 1, so a skipped norm or a mixed-up row shows."""
    g = torch.Generator().manual_seed(0)
    state = {name: (1 + 0.3 * torch.randn(t.shape, generator=g)) if name.endswith("norm.weight")
             else 0.3 * torch.randn(t.shape, generator=g) for name, t in DFlashDraft(cfg).state_dict().items()}
    return DFlashDraft.from_state(cfg, state, dtype=dtype)


# ------------------------------------------------------------------------------------------ the mask and the pass


def test_the_block_mask_sees_earlier_context_and_its_own_block_only():
    anchors = torch.tensor([[2, 5, 6]])
    got = dl.block_mask(anchors, 7, 3)[0]  # [9, 7 + 9]
    want = torch.zeros(9, 16, dtype=torch.bool)
    for row in range(9):
        j = row // 3
        want[row, :int(anchors[0, j])] = True  # context keys strictly before the anchor
        want[row, 7 + 3 * j:7 + 3 * j + 3] = True  # its own block, every slot (no causal order)
    assert torch.equal(got, want)
    assert not got[0, 2] and got[0, 1]  # the anchor's own state is not context yet
    assert not got[3:6, 7:10].any() and not got[3:6, 13:].any()  # block 1 sees neither block 0 nor block 2
    assert dl.block_mask(torch.tensor([[1], [4]]), 5, 2).shape == (2, 2, 7)


def _reference_block(draft: DFlashDraft, features: torch.Tensor, block: torch.Tensor, p: int) -> torch.Tensor:
    """One drafting step as the runtime runs it: the context's K/V of positions < p, then the block over them."""
    k, v = draft.context_kv(draft.context(features[:p]), torch.arange(p))
    return draft(block, torch.arange(p, p + len(block)), k, v)


def test_the_training_pass_is_the_reference_draft_block_by_block():
    """Many blocks at once under the mask give each block's rows as the reference draft computes it alone: a query
    that saw a later context key, or a key of another block, would move its rows."""
    cfg = tiny_cfg()
    draft = random_draft(cfg)
    g = torch.Generator().manual_seed(1)
    b, s, size = 2, 12, cfg.block_size
    features = torch.randn(b, s, cfg.feature_width, generator=g, dtype=torch.float64)
    anchors = torch.tensor([[1, 4, 9], [3, 5, 11]])
    blocks = torch.randn(b, 3 * size, cfg.hidden_size, generator=g, dtype=torch.float64)
    positions = (anchors[..., None] + torch.arange(size)).view(b, -1)
    with torch.no_grad():
        got = dl.draft_hidden(draft, features, blocks, positions, dl.block_mask(anchors, s, size))
        for i in range(b):
            for j, p in enumerate(anchors[i].tolist()):
                rows = slice(j * size, (j + 1) * size)
                want = _reference_block(draft, features[i], blocks[i, rows], p)
                torch.testing.assert_close(got[i, rows], want, rtol=1e-10, atol=1e-10)
        # a later context state (position >= the anchor) moves no row of that block; an earlier one moves them all
        later = features.clone()
        later[0, 4:] += 1.0
        moved = dl.draft_hidden(draft, later, blocks, positions, dl.block_mask(anchors, s, size))
        torch.testing.assert_close(moved[0, :2 * size], got[0, :2 * size], rtol=1e-12, atol=1e-12)
        assert ((moved[0, 2 * size:] - got[0, 2 * size:]).abs().amax(-1) > 1e-6).all()


def _cache(vocab: int, cfg: DFlashConfig, seed: int = 2) -> SequenceCache:
    """Two cached sequences of 12 rows over the whole vocabulary (top-k = V: the KL is exact)."""
    g = torch.Generator().manual_seed(seed)
    n, t = 2, 12
    logp = torch.log_softmax(2 * torch.randn(n, t, vocab, generator=g), -1).sort(-1, descending=True)
    return SequenceCache(tokens=torch.randint(0, vocab - 1, (n, t), generator=g, dtype=torch.int32),
                         length=torch.tensor([12, 10], dtype=torch.int32),
                         start=torch.tensor([2, 1], dtype=torch.int32), stop=torch.tensor([12, 9], dtype=torch.int32),
                         taps=torch.randn(n, t, cfg.feature_width, generator=g).half(), logp=logp.values.half(),
                         ids=logp.indices.int(), top1=logp.indices[..., 0].int())


def _frozen(cfg: DFlashConfig, dtype=torch.float64) -> dl.Frozen:
    g = torch.Generator().manual_seed(3)
    v, h = cfg.vocab_size, cfg.hidden_size
    return dl.Frozen(embed=torch.randn(v, h, generator=g, dtype=dtype), head_weight=torch.randn(v, h, generator=g,
                     dtype=dtype), head_bias=None, d2t=torch.zeros(v, dtype=torch.long),
                     t2d=torch.ones(v, dtype=torch.bool), mask_token_id=cfg.mask_token_id)


def test_slot_k_learns_the_targets_distribution_at_p_plus_k_minus_1_with_decayed_weights():
    """The loss written out anchor by anchor with the reference draft: slot k's KL to the cached distribution at
    position p+k-1, weighed exp(-(k-1)/gamma), slot 0 and slots past the sequence's last scored position left out,
    normalised by the weights counted."""
    cfg = tiny_cfg()
    draft, frozen = random_draft(cfg), _frozen(cfg)
    batch = _cache(cfg.vocab_size, cfg)
    train = DFlashTrainConfig(block_size=cfg.block_size, gamma=2.0)
    anchors, valid = torch.tensor([[2, 9, 0], [1, 7, 8]]), torch.tensor([[True, True, False], [True, True, True]])
    with torch.no_grad():
        loss, slots = dl.block_loss(draft, frozen, batch, anchors, valid, train)
    total = norm = 0.0
    for i in range(2):
        for p, ok in zip(anchors[i].tolist(), valid[i].tolist()):
            ids = torch.tensor([int(batch.tokens[i, p])] + [cfg.mask_token_id] * (cfg.block_size - 1))
            with torch.no_grad():
                h = _reference_block(draft, batch.taps[i].double(), frozen.embed[ids], p)
            for k in range(1, cfg.block_size):
                if not ok or p + k - 1 >= int(batch.stop[i]):
                    continue
                target = torch.zeros(cfg.vocab_size, dtype=torch.float64)
                target[batch.ids[i, p + k - 1].long()] = batch.logp[i, p + k - 1].double()
                logq = torch.log_softmax(h[k] @ frozen.head_weight.T, -1)
                kl = float((target.exp() * (target - logq)).sum())
                w = math.exp(-(k - 1) / 2.0)
                total, norm = total + w * kl, norm + w
    assert math.isclose(float(loss), total / norm, rel_tol=1e-5)
    assert len(slots) == cfg.block_size - 1


def test_slot_weights_and_the_default_decay():
    assert default_gamma(8) == 4 and default_gamma(16) == 7  # speculators' and SpecForge's defaults
    w = DFlashTrainConfig(block_size=8).slot_weights()
    assert w[0] == 0 and w[1] == 1 and math.isclose(w[5], math.exp(-1)) and len(w) == 8
    assert DFlashTrainConfig(block_size=4, gamma=1.0).slot_weights()[3] == pytest.approx(math.exp(-2))


def test_anchors_are_scored_positions_drawn_by_the_step_alone():
    cfg = tiny_cfg()
    batch = _cache(cfg.vocab_size, cfg)
    a, ok = dl.sample_anchors(batch, 20, dl.anchor_generator(0, 5))
    assert a.shape == (2, 12) and ok.sum(1).tolist() == [10, 8]  # all of [start, stop): 2..11 and 1..8
    a, ok = dl.sample_anchors(batch, 4, dl.anchor_generator(0, 5))
    assert ok.all() and (a[:, 1:] > a[:, :-1]).all()
    assert ((a >= batch.start[:, None]) & (a < batch.stop[:, None])).all()
    again, _ = dl.sample_anchors(batch, 4, dl.anchor_generator(0, 5))
    assert torch.equal(a, again) and not torch.equal(a, dl.sample_anchors(batch, 4, dl.anchor_generator(0, 6))[0])


def test_the_mask_token_is_a_spare_row_else_the_rarest_id():
    counts = torch.tensor([5, 0, 3, 0, 9])
    assert choose_mask_token(6, 5, counts)[0] == 5
    mask, why = choose_mask_token(5, 5, counts)
    assert mask == 3 and "rarest" in why  # ties: the highest id


def test_a_train_step_lowers_the_loss_on_a_fixed_batch():
    cfg = tiny_cfg()
    draft, frozen = random_draft(cfg, torch.float32), _frozen(cfg, torch.float32)
    batch = _cache(cfg.vocab_size, cfg)
    train = DFlashTrainConfig(block_size=cfg.block_size, anchors=6, steps=60, lr=3e-3)
    opt = optimizer(draft, train)
    first, _ = train_step(draft, opt, frozen, batch, train, "float32", 0, 60)
    for step in range(1, 60):
        last, _ = train_step(draft, opt, frozen, batch, train, "float32", step, 60)
    assert last < 0.5 * first


# ------------------------------------------------------------------------------------------ runs on the demo target


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("dflash-trained") / "draft"
    said, calls = [], []
    record = train_dflash(DEMO, out, SMALL, prompts=PROMPTS, progress=lambda *a: calls.append(a), say=said.append)
    return out, record, said, calls


def test_the_written_folder_reads_back_and_reproduces_the_held_out_figures(trained):
    out, record, said, calls = trained
    cfg, state, vocab_map = read_draft(out)
    raw = json.loads((out / "config.json").read_text())
    assert raw["architectures"] == ["DFlashDraftModel"] and raw["num_target_layers"] == 8
    assert raw["dflash_config"] == {"mask_token_id": record["mask_token_id"], "target_layer_ids": [4]}
    assert (cfg.block_size, cfg.num_layers, cfg.hidden_size, cfg.vocab_size, cfg.target_layer_ids) == (8, 1, 512,
                                                                                                      4096, (4,))
    assert record["taps"] == [5] and "rarest" in record["mask_token"]  # the demo's vocabulary has no spare row
    # at most --draft-vocab ids, those the replies predict (eagle's rule): a d2t is written beside the body
    assert vocab_map is not None and len(vocab_map) == record["draft_vocab_size"] <= 512
    assert (vocab_map[1:] > vocab_map[:-1]).all()
    assert not any(k.startswith(("embed", "lm_head")) for k in state)
    # the saved draft, read back, gives the held-out figures the run measured with its saved copy
    from specrt.export.loading import load_causal_lm

    cached = torch.load(out / WORK_DIR / CACHE_NAME, weights_only=True)
    target = load_causal_lm(str(DEMO), "float32")
    ids = torch.as_tensor(vocab_map)
    frozen = dl.Frozen(embed=target.get_input_embeddings().weight.detach(),
                       head_weight=target.get_output_embeddings().weight.detach()[ids], head_bias=None,
                       d2t=ids - torch.arange(len(ids)), t2d=cached["t2d"], mask_token_id=cfg.mask_token_id)
    again = dl.evaluate(DFlashDraft.from_state(cfg, state), frozen, SequenceCache(**cached["heldout"]), SMALL)
    assert again.keys() == record["heldout"].keys()
    for key, value in record["heldout"].items():
        assert again[key] == pytest.approx(value, rel=1e-6), key
    assert len(record["heldout"]["accept_by_slot"]) == 7 and record["heldout"]["anchors"] > 0
    assert record["heldout"]["tokens_per_pass"] == pytest.approx(1 + sum(record["heldout"]["accept_by_slot"]))
    assert any("1-layer draft" in line and "[4]" in line for line in said)
    assert {c[0] for c in calls} >= {"generate", "cache", "train", "evaluate"}


def test_the_cached_taps_are_the_states_after_the_named_layer(trained):
    """target_layer_ids 4 is Hugging Face's output_hidden_states[5]: the states eagle's data caches for the draft."""
    from specrt.export.loading import load_causal_lm

    out, record, _, _ = trained
    held = SequenceCache(**torch.load(out / WORK_DIR / CACHE_NAME, weights_only=True)["heldout"])
    n = int(held.length[0])
    target = load_causal_lm(str(DEMO), "float32")
    with torch.no_grad():
        states = target(input_ids=held.tokens[:1, :n].long(), output_hidden_states=True).hidden_states
    torch.testing.assert_close(held.taps[0, :n].float(), states[5][0], rtol=2e-2, atol=2e-2)
    assert not torch.allclose(held.taps[0, :n].float(), states[4][0], rtol=2e-2, atol=2e-2)


def test_resume_continues_and_ends_where_an_uninterrupted_run_does(trained, tmp_path):
    """Interrupted after step 4 (the checkpoint holds step 3), then resumed: the same losses, draft and figures."""
    out, record, _, _ = trained

    class Stop(Exception):
        pass

    def stop_after_4(phase, done, total, loss):
        if phase == "train" and done == 4:
            raise Stop

    with pytest.raises(Stop):
        train_dflash(DEMO, tmp_path / "d", SMALL, prompts=PROMPTS, progress=stop_after_4)
    assert (tmp_path / "d" / WORK_DIR / CHECKPOINT_NAME).is_file() and not (tmp_path / "d" / "config.json").exists()
    again = train_dflash(DEMO, tmp_path / "d", SMALL, prompts=PROMPTS, resume=True)
    assert again["resumed_from"] == 3 and again["loss"]["history"] == record["loss"]["history"]
    assert again["heldout"] == record["heldout"]
    mine, theirs = read_draft(tmp_path / "d")[1], read_draft(out)[1]
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


def test_a_time_limit_below_the_least_a_run_needs_is_refused_in_one_line(tmp_path):
    from specrt.export.eagle.forecast import TimeLimitTooShortError

    with pytest.raises(TimeLimitTooShortError, match=r"^dflash train: --time-limit 0.01 is below") as info:
        train_dflash(DEMO, tmp_path / "d", DFlashTrainConfig(time_limit=0.01), prompts=PROMPTS)
    assert "\n" not in str(info.value) and not (tmp_path / "d").exists()
    r = CliRunner().invoke(main, ["dflash", "train", str(DEMO), "-o", str(tmp_path / "d"), "--time-limit", "0.01"])
    assert r.exit_code == 1 and r.output.startswith("Error: dflash train: --time-limit 0.01 is below")
    assert len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("option, value", [("--block-size", "0"), ("--block-size", "1"), ("--block-size", "65"),
                                           ("--layers", "0"), ("--target-layers", "a,b")])
def test_the_cli_refuses_bad_options_in_one_line(tmp_path, option, value):
    r = CliRunner().invoke(main, ["dflash", "train", str(DEMO), "-o", str(tmp_path / "d"), option, value])
    assert r.exit_code == 2 and option in r.output and "Traceback" not in r.output
    assert sum(line.startswith("Error") for line in r.output.splitlines()) == 1 and not (tmp_path / "d").exists()


@pytest.mark.parametrize("change, match", [({"block_size": 1}, "block_size must be an integer in .2, 64."),
                                           ({"block_size": 65}, "block_size"), ({"layers": 0}, "layers"),
                                           ({"target_layer_ids": (-1,)}, "target_layer_ids"),
                                           ({"gamma": 0.0}, "gamma")])
def test_bad_config_values_raise_one_line(change, match):
    with pytest.raises(ConfigError, match=f"^dflash train: {match}") as info:
        DFlashTrainConfig(**change)
    assert "\n" not in str(info.value)


def test_a_tap_on_the_last_layer_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="target layer 7 cannot be tapped.*use 0..6"):
        train_dflash(DEMO, tmp_path / "d", DFlashTrainConfig(target_layer_ids=(2, 7)), prompts=PROMPTS)


def test_the_cli_trains_and_says_the_next_command(tmp_path):
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps(PROMPTS))
    out = tmp_path / "draft"
    r = CliRunner().invoke(main, ["dflash", "train", str(DEMO), "-o", str(out), "--prompts", str(prompts),
                                  "--steps", "2", "--seq-len", "24", "--sequences", "4", "--batch-size", "2",
                                  "--anchors", "4", "--block-size", "4", "--layers", "1", "--draft-vocab", "0",
                                  "--device", "cpu", "--compute", "float32", "--heldout", "0.25"])
    assert r.exit_code == 0, r.output
    assert "held-out greedy acceptance by block slot" in r.output and "tokens per target pass at block 4" in r.output
    assert f"next: specrt export {DEMO} --dflash {out} -o BUNDLE" in r.output
    cfg, _, vocab_map = read_draft(out)
    assert cfg.block_size == 4 and vocab_map is None  # --draft-vocab 0: the whole vocabulary, no d2t written
    assert not (out / WORK_DIR).exists()


def test_written_weights_get_the_mode_the_umask_gives_new_files(trained):
    """safetensors writes private files (0600); a draft is an ordinary file others on the machine may read."""
    import os
    import stat

    out = trained[0]
    umask = os.umask(0)
    os.umask(umask)
    for name in ("model.safetensors", "config.json"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o666 & ~umask, name
