"""DFlash drafts: both published config layouts read to one config, every refusal a one-line DFlashDraftError, the
checkpoint's key set and shapes, and the reference draft against a naive float64 computation written out here."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from specrt.errors import DFlashDraftError
from specrt.export.dflash.checkpoint import read_draft
from specrt.export.dflash.config import DFlashConfig, check_against_target, default_target_layer_ids
from specrt.export.dflash.model import DFlashDraft, RMSNorm, rope

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, BLOCK, VOCAB, TARGET_LAYERS = 32, 2, 4, 2, 8, 4, 64, 4
IDS = (1, 2)  # z-lab's after-layer ids; speculators writes (2, 3)
MASK = 63
TARGET = {"hidden_size": HIDDEN, "vocab_size": VOCAB, "num_hidden_layers": TARGET_LAYERS}


def zlab_config(**changes) -> dict:
    """z-lab's config.json: a Qwen3 config plus block_size and dflash_config."""
    raw = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": BLOCK,
           "num_target_layers": TARGET_LAYERS, "dflash_config": {"mask_token_id": MASK, "target_layer_ids": list(IDS)},
           "hidden_size": HIDDEN, "intermediate_size": 64, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
           "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "max_position_embeddings": 256, "layer_types": ["full_attention"] * LAYERS, "sliding_window": None,
           "attention_bias": False, "hidden_act": "silu", "vocab_size": VOCAB}
    return {**raw, **changes}


def speculators_config(**changes) -> dict:
    """The speculators ``dflash`` format of the same draft: the Qwen3 fields nested, layer ids + 1."""
    layer = {k: v for k, v in zlab_config().items()
             if k not in ("architectures", "block_size", "num_target_layers", "dflash_config")}
    raw = {"speculators_model_type": "dflash", "architectures": ["DFlashSpeculator"],
           "transformer_layer_config": layer, "draft_vocab_size": VOCAB, "block_size": BLOCK,
           "target_hidden_size": None, "aux_hidden_state_layer_ids": [i + 1 for i in IDS], "mask_token_id": MASK,
           "sliding_window_non_causal": False, "sample_from_anchor": False,
           "speculators_config": {"algorithm": "dflash", "default_proposal_method": "greedy"}}
    return {**raw, **changes}


@pytest.fixture
def cfg() -> DFlashConfig:
    return DFlashConfig.from_json(zlab_config(), "test")


@pytest.fixture
def state(cfg) -> dict[str, torch.Tensor]:
    """Random weights, the norms away from 1 so that a skipped or swapped norm shows."""
    g = torch.Generator().manual_seed(0)
    out = {}
    for name, t in DFlashDraft(cfg).state_dict().items():
        noise = torch.randn(t.shape, generator=g, dtype=torch.float32)
        out[name] = 1 + 0.3 * noise if name.endswith("norm.weight") else 0.3 * noise
    return out


def write(folder: Path, config: dict | str, state: dict[str, torch.Tensor]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    # each tensor its own copy: safetensors refuses two names on one storage (a test reuses a tensor)
    save_file({k: v.clone().contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    return folder


def refused(match: str, fn, *args) -> None:
    with pytest.raises(DFlashDraftError, match=match) as info:
        fn(*args)
    assert "\n" not in str(info.value)


# --- the two layouts -------------------------------------------------------------------------------------------

def test_zlab_and_speculators_layouts_read_to_the_same_draft(tmp_path, cfg, state):
    zcfg, zbody, _ = read_draft(write(tmp_path / "zlab", zlab_config(), state))
    # speculators: a consistent prefix and copies of the verifier's embedding, head and vocabulary maps
    extras = {"model.embed_tokens.weight": torch.zeros(VOCAB, HIDDEN), "lm_head.weight": torch.zeros(VOCAB, HIDDEN),
              "verifier_norm.weight": torch.ones(HIDDEN), "d2t": torch.zeros(VOCAB, dtype=torch.int64),
              "t2d": torch.ones(VOCAB, dtype=torch.bool)}
    prefixed = {"model." + k: v for k, v in state.items()} | extras
    scfg, sbody, _ = read_draft(write(tmp_path / "spec", speculators_config(), prefixed))
    assert zcfg == scfg == cfg
    assert cfg.target_layer_ids == IDS and cfg.block_size == BLOCK and cfg.mask_token_id == MASK
    assert cfg.feature_width == len(IDS) * HIDDEN
    for body in (zbody, sbody):
        assert body.keys() == state.keys()
        assert all(torch.equal(body[k], state[k]) for k in state)


def test_zlab_variants_block_size_in_dflash_config_rope_parameters_and_default_ids():
    raw = zlab_config(block_size=None, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                      num_target_layers=36, num_hidden_layers=5, layer_types=None,
                      dflash_config={"mask_token_id": MASK, "block_size": 16})
    raw.pop("block_size")
    raw.pop("rope_theta")
    got = DFlashConfig.from_json(raw, "test")
    assert (got.block_size, got.rope_theta, got.target_layer_ids) == (16, 1e6, (1, 9, 17, 25, 33))


def test_default_target_layer_ids_follow_zlab():
    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)  # Qwen3-4B/8B
    assert default_target_layer_ids(24, 5) == (1, 6, 11, 16, 21)  # Qwen2.5-0.5B
    assert default_target_layer_ids(36, 1) == (18,)


# --- refusals ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw, match", [
    (zlab_config(dflash_config={"target_layer_ids": [1, 2]}), "no dflash_config.mask_token_id"),
    (zlab_config(architectures=["LlamaForCausalLMEagle3"]), "EAGLE-3 head.*--eagle"),
    ({**zlab_config(architectures=["LlamaForCausalLM"]), "eagle_config": {}}, "EAGLE-3 head.*--eagle"),
    (speculators_config(speculators_model_type="eagle3"), "EAGLE-3 head.*--eagle"),
    (speculators_config(speculators_model_type="mtp"), "speculators 'mtp' checkpoint"),
    (zlab_config(architectures=["LlamaForCausalLM"], dflash_config=None), "not a DFlash draft config"),
    (zlab_config(layer_types=["full_attention", "sliding_attention"]), "sliding-window"),
    (zlab_config(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope type 'yarn'"),
    (zlab_config(dflash_config={"mask_token_id": MASK, "target_layer_ids": [1, 2], "block_size": 8}),
     "block_size 4 at the top level but 8"),
    (zlab_config(num_attention_heads=3), "not a multiple of num_key_value_heads"),
    (zlab_config(dflash_config={"mask_token_id": MASK, "target_layer_ids": [-1, 2]}), "must be >= 0"),
    (zlab_config(dflash_config={"mask_token_id": MASK, "target_layer_ids": "1,2"}), "list of layer indices"),
    (speculators_config(aux_hidden_state_layer_ids=[0, 2]), "embeddings .id 0."),
    (speculators_config(sample_from_anchor=True), "sample_from_anchor"),
    (speculators_config(target_hidden_size=48), "target_hidden_size 48"),
    (speculators_config(transformer_layer_config=None), "no transformer_layer_config"),
])
def test_config_refusals(raw, match):
    refused(match, DFlashConfig.from_json, raw, "test")


@pytest.mark.parametrize("change, match", [
    ({"hidden_size": 48}, "48 wide, the target 32.*another target"),
    ({"vocab_size": 128}, "vocabulary has 128 tokens.*another target"),
    ({"target_layer_ids": (1, 4)}, "reads target layer 4 but the target has 4 layers"),
    ({"mask_token_id": VOCAB}, "mask token 64 is outside the target's vocabulary"),
    ({"block_size": 1}, "block size is 1"),
    ({"block_size": 65}, "block size is 65"),
])
def test_refuses_a_draft_for_another_target(cfg, change, match):
    bad = replace(cfg, **change)
    target = {**TARGET, "vocab_size": bad.vocab_size} if "mask_token_id" in change else TARGET
    refused(match, check_against_target, bad, target)


def test_accepts_its_target_as_a_dict_an_object_or_a_multimodal_wrapper(cfg):
    for target in (TARGET, SimpleNamespace(**TARGET), {"text_config": TARGET}):
        check_against_target(cfg, target)
    check_against_target(replace(cfg, target_layer_ids=(0, TARGET_LAYERS - 1), block_size=64), TARGET)  # the edges
    refused("lacks hidden_size", check_against_target, cfg, {"hidden_size": HIDDEN})


def _eagle_weights(state):
    return {"midlayer.self_attn.q_proj.weight": state["layers.0.self_attn.q_proj.weight"],
            "fc.weight": state["fc.weight"], "norm.weight": state["norm.weight"]}


@pytest.mark.parametrize("config, weights, match", [
    (zlab_config(architectures=["LlamaForCausalLM"], dflash_config=None), _eagle_weights, "EAGLE-3 head.*--eagle"),
    (zlab_config(), lambda s: {"fc.weight": s["fc.weight"], "d2t": torch.zeros(4, dtype=torch.int64)},
     "EAGLE-3 head.*--eagle"),
    (zlab_config(), lambda s: {k: v for k, v in s.items() if k != "layers.1.mlp.up_proj.weight"},
     "lacks layers.1.mlp.up_proj.weight"),
    (zlab_config(), lambda s: s | {"layers.2.mlp.up_proj.weight": s["layers.1.mlp.up_proj.weight"]},
     "unexpected weights layers.2.mlp.up_proj.weight"),
    (zlab_config(), lambda s: s | {"fc.weight": s["fc.weight"][:, :HIDDEN]}, r"fc.weight is \[32, 32\].*\[32, 64\]"),
    (zlab_config(), lambda s: s | {"norm.weight": torch.ones(HIDDEN, dtype=torch.int32)}, "not a float tensor"),
    (zlab_config(), lambda s: s | {"model.hidden_norm.weight": s["hidden_norm.weight"]}, "several"),
    (zlab_config(), lambda s: {k: v for k, v in s.items() if k != "hidden_norm.weight"}, "no hidden_norm.weight"),
    (speculators_config(), lambda s: {"model." + k: v for k, v in s.items()} | {"other.weight": torch.ones(2)},
     "outside the draft body .other.weight."),
    ("{not json", lambda s: s, "not valid JSON"),
])
def test_checkpoint_refusals(tmp_path, state, config, weights, match):
    refused(match, read_draft, write(tmp_path / "draft", config, weights(state)))


def test_folder_refusals(tmp_path, state):
    refused("folder not found", read_draft, tmp_path / "missing")
    refused("no config.json", read_draft, tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(zlab_config()))
    refused("no model.safetensors", read_draft, tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    refused("could not read", read_draft, tmp_path)


# --- the reference draft -----------------------------------------------------------------------------------------

def test_loads_strictly_and_casts(cfg, state):
    draft = DFlashDraft.from_state(cfg, {k: v.to(torch.bfloat16) for k, v in state.items()})
    assert not draft.training and draft.fc.weight.dtype == torch.float32
    assert torch.equal(draft.fc.weight, state["fc.weight"].to(torch.bfloat16).float())
    refused("do not fit this DFlash config", DFlashDraft.from_state, cfg,
            {k: v for k, v in state.items() if k != "norm.weight"})


def test_rope_and_norm_match_transformers_qwen3():
    """The naive reference below shares this file's reading of the maths; pin both pieces to Qwen3's own code."""
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, Qwen3RotaryEmbedding, apply_rotary_pos_emb

    hf = Qwen3Config(hidden_size=HIDDEN, num_attention_heads=HEADS, head_dim=HEAD_DIM,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    g = torch.Generator().manual_seed(1)
    x = torch.randn(HEADS, 6, HEAD_DIM, generator=g)
    positions = torch.tensor([0, 3, 7, 100, 2047, 5])
    cos, sin = Qwen3RotaryEmbedding(hf)(x, positions[None])
    want, _ = apply_rotary_pos_emb(x[None], x[None], cos, sin)
    torch.testing.assert_close(rope(x, positions, 10000.0), want[0], rtol=1e-5, atol=1e-5)
    norm, ref = RMSNorm(HIDDEN, 1e-6), Qwen3RMSNorm(HIDDEN, 1e-6)
    weight = torch.randn(HIDDEN, generator=g)
    norm.weight.data.copy_(weight)
    ref.weight.data.copy_(weight)
    y = torch.randn(5, HIDDEN, generator=g)
    torch.testing.assert_close(norm(y), ref(y))


def naive_draft(cfg: DFlashConfig, state: dict[str, torch.Tensor], features: np.ndarray, context_positions,
                block: np.ndarray, block_positions) -> np.ndarray:
    """z-lab's draft in float64, head by head and pair by pair: [context ; block] keys, no mask, no norm on V."""
    w = {k: v.double().numpy() for k, v in state.items()}
    d, group = cfg.head_dim, cfg.num_heads // cfg.num_kv_heads

    def rms(x, weight):
        return weight * x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.rms_norm_eps)

    def rotate(x, positions):  # x [T, d]: dims j and j + d/2 turn together by position * theta^(-2j/d)
        out = x.copy()
        for t, p in enumerate(positions):
            for j in range(d // 2):
                a = p * cfg.rope_theta ** (-2 * j / d)
                x1, x2 = x[t, j], x[t, j + d // 2]
                out[t, j], out[t, j + d // 2] = x1 * math.cos(a) - x2 * math.sin(a), x2 * math.cos(a) + x1 * math.sin(a)
        return out

    context = rms(features @ w["fc.weight"].T, w["hidden_norm.weight"])
    x = block.copy()
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        wq, wk, wv = (w[p + f"self_attn.{n}_proj.weight"] for n in "qkv")
        qn, kn = w[p + "self_attn.q_norm.weight"], w[p + "self_attn.k_norm.weight"]
        h = rms(x, w[p + "input_layernorm.weight"])
        attn = np.zeros((len(block), cfg.num_heads * d))
        for head in range(cfg.num_heads):
            qs, ks = slice(head * d, (head + 1) * d), slice(head // group * d, (head // group + 1) * d)
            q = rotate(rms(h @ wq[qs].T, qn), block_positions)
            k = np.concatenate([rotate(rms(context @ wk[ks].T, kn), context_positions),  # no input_layernorm
                                rotate(rms(h @ wk[ks].T, kn), block_positions)])
            v = np.concatenate([context @ wv[ks].T, h @ wv[ks].T])
            scores = q @ k.T / math.sqrt(d)
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            attn[:, qs] = (probs / probs.sum(-1, keepdims=True)) @ v
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        m = rms(x, w[p + "post_attention_layernorm.weight"])
        gate = m @ w[p + "mlp.gate_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * (m @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    return rms(x, w["norm.weight"])


def _step(draft: DFlashDraft, features: torch.Tensor, block: torch.Tensor, block_positions: torch.Tensor):
    """One drafting step as a runtime runs it: the context's K/V first, then the block over them."""
    past_k, past_v = draft.context_kv(draft.context(features), torch.arange(len(features)))
    return draft(block, block_positions, past_k, past_v)


def _inputs(cfg: DFlashConfig, context_len: int, seed: int = 2):
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(context_len, cfg.feature_width, generator=g, dtype=torch.float64)
    block = torch.randn(cfg.block_size, cfg.hidden_size, generator=g, dtype=torch.float64)
    # the block after the context (with a context, far after it: rope turns fast there, which a wrong pairing shows)
    positions = torch.arange(cfg.block_size) + context_len + (1000 if context_len else 0)
    return features, block, positions


@pytest.mark.parametrize("context_len", [0, 1, 5])
def test_matches_a_naive_float64_computation(cfg, state, context_len):
    draft = DFlashDraft.from_state(cfg, state, dtype=torch.float64)
    features, block, positions = _inputs(cfg, context_len)
    with torch.no_grad():
        got = _step(draft, features, block, positions).numpy()
    want = naive_draft(cfg, state, features.numpy(), range(context_len), block.numpy(), positions.tolist())
    assert got.shape == (cfg.block_size, cfg.hidden_size)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_the_block_is_not_causal_and_the_context_enters_through_its_keys(cfg, state):
    draft = DFlashDraft.from_state(cfg, state, dtype=torch.float64)
    features, block, positions = _inputs(cfg, 5)
    with torch.no_grad():
        base = _step(draft, features, block, positions)
        later = block.clone()
        later[3] += 1.0  # a later slot of the block: a causal mask would hide it from row 1
        changed = _step(draft, features, later, positions)
        assert (changed[1] - base[1]).abs().max() > 1e-3
        other = features.clone()
        other[0] += 1.0  # the first context token: every block row reads it, through K/V only
        moved = _step(draft, other, block, positions)
        assert ((moved - base).abs().amax(-1) > 1e-3).all()
        # rows are tied to their positions, not to their index: shuffled rows give the same rows, shuffled
        # (a causal mask by index would let the first row of each order see different keys)
        order = torch.tensor([2, 0, 3, 1])
        shuffled = _step(draft, features, block[order], positions[order])
        torch.testing.assert_close(shuffled, base[order], rtol=1e-12, atol=1e-12)
        # context_kv holds everything the context contributes: a call without it sees the block alone
        empty = [torch.zeros(cfg.num_kv_heads, 0, cfg.head_dim, dtype=torch.float64)] * cfg.num_layers
        alone = draft(block, positions, empty, empty)
        assert ((alone - base).abs().amax(-1) > 1e-3).all()
    refused("given context K/V for 1", draft, block, positions, empty[:1], empty[:1])


def test_the_committed_demo_draft_fits_the_demo_target():
    """benchmarks/heads/demo-target-dflash, which the docs tell users to export with the demo target, reads and
    passes every check against it (width, vocabulary, layer ids, block, mask token)."""
    from pathlib import Path

    from transformers import AutoConfig

    from specrt.export.dflash.graph import read_dflash

    root = Path(__file__).resolve().parents[3]
    info = read_dflash(root / "benchmarks" / "heads" / "demo-target-dflash",
                       AutoConfig.from_pretrained(root / "demo" / "hf" / "target"))
    assert info.config.block_size == 8 and info.config.num_layers == 1 and info.vocab_map is None
    assert info.taps == (5,)  # after target layer 4: the state entering layer 5
