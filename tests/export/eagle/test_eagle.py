"""EAGLE-3 heads: the published layout read and written, the reference forward, and the refusals.

Heads here are tiny and random, written in the layout published heads use (config.json +
model.safetensors with fc / midlayer.* / norm / lm_head / d2t / t2d), see docs/design/eagle3.md.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file
from support.eagle_heads import (D, HEADS, INNER, KV, H, V, config_json, published_state, random_head, vocab_map,
                                 write_published)

from specrt.errors import ConfigError, EagleHeadError
from specrt.export.eagle.config import Eagle3Config, tap_layers
from specrt.export.eagle.checkpoint import read_config
from specrt.export.eagle.native import native_json
from specrt.export.eagle.head import Eagle3Head
from specrt.export.eagle.vocab import (
    draft_logits_to_target,
    draft_to_target_ids,
    target_logits_to_draft,
    validate_vocab_map,
)
from specrt.export.eagle.checkpoint import check_target, load_eagle3, save_eagle3

# the published Llama-3.1-8B head's config (SpecForge configs/llama3-8B-eagle3.json)
LLAMA31_8B = {"architectures": ["LlamaForCausalLMEagle3"], "bos_token_id": 128000, "eos_token_id": 128001,
              "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
              "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": 32,
              "num_key_value_heads": 8, "num_hidden_layers": 1, "pad_token_id": 0, "rms_norm_eps": 1e-05,
              "tie_word_embeddings": False, "torch_dtype": "float16", "transformers_version": "4.28.1",
              "use_cache": True, "vocab_size": 128256, "draft_vocab_size": 32000}


def causal(b: int, t: int, past: int = 0) -> torch.Tensor:
    allowed = torch.ones(t, past + t, dtype=torch.bool).tril(past)
    return torch.zeros(b, 1, t, past + t).masked_fill(~allowed, torch.finfo(torch.float32).min)


def inputs(cfg: Eagle3Config, b: int, t: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    taps = torch.randn(b, t, 3 * cfg.target_hidden_size, generator=g)
    embeds = torch.randn(b, t, cfg.hidden_size, generator=g)
    return taps, embeds, torch.arange(t).expand(b, t)


# --- config and tap layers -------------------------------------------------------------------------


def test_published_config_reads_with_its_defaults():
    cfg = read_config(LLAMA31_8B)
    assert (cfg.hidden_size, cfg.target_hidden_size, cfg.head_dim) == (4096, 4096, 128)
    assert (cfg.vocab_size, cfg.draft_vocab_size, cfg.num_key_value_heads) == (128256, 32000, 8)
    assert cfg.rope_theta == 10000.0  # no rope_theta in the file: the head's own default, not the target's
    assert cfg.taps is None and cfg.norm_before_residual is False
    again = read_config(native_json(cfg))
    assert again == cfg
    assert "target_hidden_size" not in native_json(cfg)  # EAGLE skips the target's embedding when it is present
    gemma = read_config(config_json(hidden_size=1152, num_attention_heads=4, num_key_value_heads=1,
                                               head_dim=256, rope_theta=1e6, rope_scaling=None,
                                               target_hidden_size=2048, sliding_window=512,
                                               use_sliding_window=False))
    assert (gemma.head_dim, gemma.rope_theta, gemma.target_hidden_size) == (256, 1e6, 2048)
    assert read_config(native_json(gemma)) == gemma


def test_flat_configs_name_the_tap_norms_as_vllm_and_specforge_do(tmp_path):
    """vLLM's norm_before_fc (also inside NVIDIA's eagle_config) is one norm over the taps' concatenation
    (weight input_norm); SpecForge's fc_norm one per tap (fc_norm.0-2): read as the speculators format's."""
    assert read_config(config_json(norm_before_fc=True)).tap_norm == "joint"
    assert read_config(config_json(eagle_config={"norm_before_fc": True})).tap_norm == "joint"
    cfg = read_config(config_json(fc_norm=True))
    assert cfg.tap_norm == "each"
    state = published_state(read_config(config_json()))
    state.update({f"fc_norm.{i}.weight": 1 + torch.rand(H) for i in range(3)})
    write_published(tmp_path / "specforge", config_json(fc_norm=True), state)
    _, head, _, _ = load_eagle3(tmp_path / "specforge")
    torch.testing.assert_close(head.fc_norm[2].weight, state["fc_norm.2.weight"])
    del state["fc_norm.1.weight"]
    write_published(tmp_path / "short", config_json(fc_norm=True), state)
    with pytest.raises(EagleHeadError, match="lacks fc_norm.1.weight"):
        load_eagle3(tmp_path / "short")


def test_tap_layers_convention():
    assert tap_layers(32) == (2, 16, 29)  # Llama-3.1-8B
    assert tap_layers(30) == (2, 15, 27)  # SmolLM2-135M
    assert tap_layers(8) == (2, 4, 5)  # the demo target
    assert tap_layers(7) == (2, 3, 4)
    assert [tap_layers(n) for n in (4, 5, 6)] == [(1, 2, 3), (1, 2, 4), (1, 3, 5)]
    with pytest.raises(EagleHeadError, match="too few"):
        tap_layers(3)
    # SpecForge's Qwen3-235B config: nested ids are layer OUTPUTS (SGLang adds 1); 94 layers
    nested = read_config(config_json(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 46, 90],
                                                              "use_aux_hidden_state": True}))
    assert nested.taps == (2, 47, 91) == tap_layers(94)
    top = read_config(config_json(eagle_aux_hidden_state_layer_ids=[2, 47, 91]))  # vLLM's, as is
    assert top.taps == nested.taps
    assert read_config(native_json(nested)).taps == (2, 47, 91)
    with pytest.raises(EagleHeadError, match="different layers"):
        read_config(config_json(eagle_aux_hidden_state_layer_ids=[1, 46, 90],
                                           eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 46, 90]}))
    with pytest.raises(EagleHeadError, match="made for another target"):
        nested.tap_layers_for(32)
    with pytest.raises(EagleHeadError, match="strictly increasing"):
        read_config(config_json(eagle_aux_hidden_state_layer_ids=[5, 2, 9]))


def test_tap_index_is_hf_output_hidden_states_index():
    """Index i = the stream ENTERING layer i = HF output_hidden_states[i] (what the head is fed)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=8,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    entering = {}
    for i, layer in enumerate(model.model.layers):
        layer.register_forward_pre_hook(lambda m, args, kwargs, i=i: entering.__setitem__(i, kwargs.get(
            "hidden_states", args[0] if args else None)), with_kwargs=True)
    with torch.no_grad():
        hs = model(torch.tensor([[3, 1, 4, 1, 5]]), output_hidden_states=True).hidden_states
    for i in tap_layers(8):
        torch.testing.assert_close(hs[i], entering[i])


# --- the checkpoint folder -------------------------------------------------------------------------


def test_save_load_round_trip(tmp_path):
    cfg = read_config(config_json())
    head = random_head(cfg)
    d2t, t2d = vocab_map()
    save_eagle3(tmp_path / "h", cfg, head, d2t, t2d)
    files = load_file(str(tmp_path / "h" / "model.safetensors"))
    assert set(files) == set(head.state_dict()) | {"d2t", "t2d"}
    assert files["fc.weight"].shape == (H, 3 * H) and files["lm_head.weight"].shape == (D, H)
    assert files["midlayer.self_attn.q_proj.weight"].shape == (H, 2 * H)
    assert files["d2t"].dtype == torch.int64 and files["t2d"].dtype == torch.bool
    assert json.loads((tmp_path / "h" / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]

    cfg2, head2, d2t2, t2d2 = load_eagle3(tmp_path / "h")
    assert cfg2 == cfg and torch.equal(d2t2, d2t) and torch.equal(t2d2, t2d)
    for k, v in head.state_dict().items():
        assert torch.equal(head2.state_dict()[k], v), k

    save_eagle3(tmp_path / "h16", cfg, head, d2t, t2d, dtype="float16")
    assert load_file(str(tmp_path / "h16" / "model.safetensors"))["fc.weight"].dtype == torch.float16
    _, head16, _, _ = load_eagle3(tmp_path / "h16")
    assert head16.fc.weight.dtype == torch.float32
    torch.testing.assert_close(head16.fc.weight, head.fc.weight, atol=1e-3, rtol=1e-3)


def test_reads_pytorch_bin_and_an_own_embedding(tmp_path):
    cfg = read_config(config_json(target_hidden_size=64))  # head narrower than its target
    head = random_head(cfg, with_embedding=True)
    state = {**head.state_dict(), "d2t": vocab_map()[0], "t2d": vocab_map()[1]}
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "config.json").write_text(json.dumps(native_json(cfg)))
    torch.save(state, tmp_path / "bin" / "pytorch_model.bin")
    cfg2, head2, _, _ = load_eagle3(tmp_path / "bin", {"hidden_size": 64, "vocab_size": V, "num_hidden_layers": 8})
    assert cfg2.target_hidden_size == 64 and head2.embed_tokens is not None
    assert torch.equal(head2.embed_tokens.weight, head.embed_tokens.weight)
    # the same head without its embedding cannot take the target's (64 wide, the head is 48)
    write_published(tmp_path / "noemb", native_json(cfg), {k: v for k, v in state.items() if k != "embed_tokens.weight"})
    with pytest.raises(EagleHeadError, match="ships no embed_tokens"):
        load_eagle3(tmp_path / "noemb", {"hidden_size": 64, "vocab_size": V})


def test_full_vocab_head_needs_no_maps(tmp_path):
    cfg = read_config(config_json(draft_vocab_size=None))
    write_published(tmp_path / "h", config_json(draft_vocab_size=None), random_head(cfg).state_dict())
    _, _, d2t, t2d = load_eagle3(tmp_path / "h")  # EAGLE drops d2t/t2d when D == V (ea_model.py)
    assert torch.equal(d2t, torch.zeros(V, dtype=torch.int64)) and bool(t2d.all())


def test_check_target_with_an_hf_config():
    from transformers import LlamaConfig

    cfg = read_config(config_json())
    target = LlamaConfig(vocab_size=V, hidden_size=H, num_hidden_layers=30, num_attention_heads=4)
    assert check_target(cfg, target) == (2, 15, 27)


# --- the forward -----------------------------------------------------------------------------------


def test_forward_shapes():
    cfg = read_config(config_json(target_hidden_size=40))
    head = random_head(cfg)
    taps, embeds, pos = inputs(cfg, 2, 5)
    out = head(taps, embeds, pos, causal(2, 5))
    assert out.logits.shape == (2, 5, D) and out.hidden.shape == (2, 5, H)
    assert out.key.shape == out.value.shape == (2, 5, KV, H // HEADS)
    # a deeper step takes the previous hidden (before the final norm) as its features
    deeper = head.step(out.hidden[:, -1:], embeds[:, :1], torch.full((2, 1), 5), causal(2, 1, past=5),
                       out.key, out.value)
    assert deeper.logits.shape == (2, 1, D) and deeper.key.shape == (2, 1, KV, H // HEADS)
    with pytest.raises(ConfigError, match="taps have width"):
        head(embeds, embeds, pos, causal(2, 5))
    with pytest.raises(ConfigError, match="attention_mask"):
        head(taps, embeds, pos, causal(2, 4))


def test_cached_steps_equal_the_full_forward():
    cfg = read_config(config_json())
    head = random_head(cfg)
    taps, embeds, pos = inputs(cfg, 2, 7)
    with torch.no_grad():
        full = head(taps, embeds, pos, causal(2, 7))
        first = head(taps[:, :4], embeds[:, :4], pos[:, :4], causal(2, 4))
        rest = head(taps[:, 4:], embeds[:, 4:], pos[:, 4:], causal(2, 3, past=4), first.key, first.value)
        as_bool = head(taps, embeds, pos, causal(2, 7) == 0)
    for name in ("logits", "hidden", "key", "value"):
        both = torch.cat([getattr(first, name), getattr(rest, name)], dim=1)
        torch.testing.assert_close(both, getattr(full, name), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(getattr(as_bool, name), getattr(full, name), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("norm_before_residual, qk_norm", [(False, False), (True, False), (False, True)])
def test_forward_matches_a_step_by_step_computation(norm_before_residual, qk_norm):
    """The architecture written out with plain ops, in float64, on the same weights (``qk_norm``: the Qwen3
    layer a speculators head may have, each query and key head normalised before rope)."""
    cfg = read_config(config_json(target_hidden_size=40, norm_before_residual=norm_before_residual,
                                             rope_theta=5000.0))
    cfg = Eagle3Config(**{**cfg.__dict__, "qk_norm": qk_norm})
    head = random_head(cfg, seed=3)
    t = 6
    taps, embeds, _ = inputs(cfg, 1, t, seed=4)
    positions = torch.tensor([[0, 1, 2, 3, 4, 4]])  # a tree: nodes 4 and 5 are siblings at one depth
    allowed = torch.ones(t, t, dtype=torch.bool).tril()
    allowed[5, 4] = False  # siblings do not see each other
    additive = torch.zeros(1, 1, t, t).masked_fill(~allowed, torch.finfo(torch.float32).min)
    with torch.no_grad():
        out = head(taps, embeds, positions, additive)

    w = {k: v.double() for k, v in head.state_dict().items()}
    eps, d, group = cfg.rms_norm_eps, cfg.head_dim, HEADS // KV

    def rms(x, weight):
        return weight * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)

    def rope(x, pos):  # x [T, d]: pair i with i + d/2
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        ang = pos[:, None].double() * inv[None, :]
        cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
        x1, x2 = x[:, : d // 2], x[:, d // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    fused = taps[0].double() @ w["fc.weight"].T  # 1. fc: 3*H_t -> H
    normed = rms(fused, w["midlayer.hidden_norm.weight"])
    x = torch.cat([rms(embeds[0].double(), w["midlayer.input_layernorm.weight"]), normed], -1)  # 2. [emb ‖ feat]
    q, k, v = (x @ w[f"midlayer.self_attn.{n}_proj.weight"].T for n in "qkv")
    if qk_norm:  # per head of d values
        q = torch.cat([rms(q[:, j * d:(j + 1) * d], w["midlayer.self_attn.q_norm.weight"]) for j in range(HEADS)], -1)
        k = torch.cat([rms(k[:, j * d:(j + 1) * d], w["midlayer.self_attn.k_norm.weight"]) for j in range(KV)], -1)
    heads_out = []
    for hq in range(HEADS):  # 3. attention, query head hq reads KV head hq // group
        hk = hq // group
        qh = rope(q[:, hq * d:(hq + 1) * d], positions[0])
        kh = rope(k[:, hk * d:(hk + 1) * d], positions[0])
        scores = (qh @ kh.T / math.sqrt(d)).masked_fill(~allowed, float("-inf"))
        heads_out.append(torch.softmax(scores, -1) @ v[:, hk * d:(hk + 1) * d])
    attn = torch.cat(heads_out, -1) @ w["midlayer.self_attn.o_proj.weight"].T
    h = (normed if norm_before_residual else fused) + attn  # 4. residual on the H-wide features
    m = rms(h, w["midlayer.post_attention_layernorm.weight"])  # 5. SwiGLU MLP
    gate, up = m @ w["midlayer.mlp.gate_proj.weight"].T, m @ w["midlayer.mlp.up_proj.weight"].T
    h = h + (gate * torch.sigmoid(gate) * up) @ w["midlayer.mlp.down_proj.weight"].T
    logits = rms(h, w["norm.weight"]) @ w["lm_head.weight"].T  # 6. final norm, draft-vocab head

    torch.testing.assert_close(out.hidden[0].double(), h, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.logits[0].double(), logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.key[0].reshape(t, -1).double(),
                               torch.cat([rope(k[:, j * d:(j + 1) * d], positions[0]) for j in range(KV)], -1),
                               atol=1e-5, rtol=1e-5)


def test_a_static_rope_scaling_rotates_as_published():
    """Llama 3.1's rope (the llama3 scaling, which speculators copies from a Llama-3.x verifier into its
    heads) against its formula written out in float64, and yarn's attention factor on cos/sin."""
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    cfg = read_config(config_json(rope_theta=50000.0, rope_scaling=scaling))
    assert cfg.rope_scaling == scaling and read_config(native_json(cfg)) == cfg
    d = cfg.head_dim
    inv = 1.0 / 50000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    wavelen = 2 * math.pi / inv
    low, high = 64 / 1.0, 64 / 4.0  # wavelengths beyond low are divided by the factor, below high kept
    smooth = (64 / wavelen - 1.0) / (4.0 - 1.0)
    want = torch.where(wavelen > low, inv / 8.0,
                       torch.where(wavelen < high, inv, (1 - smooth) * inv / 8.0 + smooth * inv))
    pos = torch.arange(200)[None]
    cos, sin = Eagle3Head(cfg).rotary(torch.zeros(1, 1, H), pos)
    angles = pos[0, :, None].double() * want[None]
    torch.testing.assert_close(cos[0, :, : d // 2].double(), angles.cos(), atol=1e-5, rtol=0)
    torch.testing.assert_close(sin[0, :, : d // 2].double(), angles.sin(), atol=1e-5, rtol=0)
    yarn = read_config(config_json(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                                               "original_max_position_embeddings": 64}))
    cos0 = Eagle3Head(yarn).rotary(torch.zeros(1, 1, H), torch.zeros(1, 1, dtype=torch.long))[0]
    torch.testing.assert_close(cos0, torch.full_like(cos0, 0.1 * math.log(4.0) + 1.0))  # yarn's mscale


# --- the draft vocabulary --------------------------------------------------------------------------


def test_draft_vocab_maps_like_the_published_code():
    d2t, t2d = vocab_map()
    g = torch.Generator().manual_seed(5)
    draft_logits = torch.randn(3, 4, D, generator=g)
    full = draft_logits_to_target(draft_logits, d2t, V)
    assert full.shape == (3, 4, V)
    assert bool(torch.isinf(full[..., ~t2d]).all()) and not bool(torch.isinf(full[..., t2d]).any())
    # greedy: the argmax over target ids is the draft argmax mapped through d2t (EAGLE's topk + d2t)
    assert torch.equal(full.argmax(-1), draft_to_target_ids(draft_logits.argmax(-1), d2t))
    assert torch.equal(target_logits_to_draft(full, d2t), draft_logits)
    # EAGLE's training target, target_logits[..., t2d], is in draft-id order for sorted maps
    target_logits = torch.randn(2, V, generator=g)
    assert torch.equal(target_logits[..., t2d], target_logits_to_draft(target_logits, d2t))
    assert torch.equal(validate_vocab_map(d2t, None, V, D)[1], t2d)  # t2d derivable from d2t


# --- refusals: each a one-line typed error naming the problem --------------------------------------


def _bad_state(mutate):
    cfg = read_config(config_json())
    state = published_state(cfg)
    mutate(state)
    return state


def _d2t_out_of_range(s):
    s["d2t"][5] = V  # draft id 5 -> target id >= V


def _d2t_negative(s):
    s["d2t"][0] = -1


def _d2t_duplicate(s):
    s["d2t"][1] = s["d2t"][0] - 1  # draft ids 0 and 1 -> the same target id


def _t2d_extra(s):
    s["t2d"][(~s["t2d"]).nonzero()[0]] = True


def _t2d_missing(s):
    s["t2d"][s["t2d"].nonzero()[0]] = False


BAD_STATES = {
    "no d2t": (lambda s: s.pop("d2t"), "no d2t"),
    "d2t out of range": (_d2t_out_of_range, r"d2t maps draft id 5 .* outside \[0, 200\)"),
    "d2t negative": (_d2t_negative, r"draft id 0 .* outside"),
    "d2t duplicate": (_d2t_duplicate, "same target id"),
    "d2t float": (lambda s: s.__setitem__("d2t", s["d2t"].float()), "d2t must hold integers"),
    "d2t shape": (lambda s: s.__setitem__("d2t", s["d2t"][:-1]), r"d2t has shape \[63\]"),
    "t2d extra": (_t2d_extra, "t2d marks target id"),
    "t2d missing": (_t2d_missing, "t2d misses target id"),
    "t2d shape": (lambda s: s.__setitem__("t2d", s["t2d"][:-1]), r"t2d has shape \[199\]"),
    "q_proj shape": (lambda s: s.__setitem__("midlayer.self_attn.q_proj.weight", torch.zeros(H, H)),
                     r"midlayer.self_attn.q_proj.weight is \[48, 48\], the config implies \[48, 96\]"),
    "lm_head shape": (lambda s: s.__setitem__("lm_head.weight", torch.zeros(V, H)), r"lm_head.weight is \[200, 48\]"),
    "missing weight": (lambda s: s.pop("midlayer.mlp.down_proj.weight"), "lacks midlayer.mlp.down_proj.weight"),
    "unexpected weight": (lambda s: s.__setitem__("midlayer.extra.weight", torch.zeros(2)),
                          "unexpected weights midlayer.extra.weight"),
    "fc of 2H": (lambda s: s.__setitem__("fc.weight", torch.zeros(H, 2 * H)), "EAGLE-1/2 fc"),
    "fc bias": (lambda s: s.__setitem__("fc.bias", torch.zeros(H)), "EAGLE-1/2 fc"),
}


@pytest.mark.parametrize("case", list(BAD_STATES))
def test_bad_checkpoints_are_refused(tmp_path, case):
    mutate, message = BAD_STATES[case]
    write_published(tmp_path / "h", config_json(), _bad_state(mutate))
    with pytest.raises(EagleHeadError, match=message) as err:
        load_eagle3(tmp_path / "h")
    assert "\n" not in str(err.value) and isinstance(err.value, ConfigError)


def _eagle12_state() -> dict:
    """EAGLE-1/2 (cnets1.py): layers.N.*, fc 2H -> H with bias over cat(embedding, feature), no maps."""
    return {"fc.weight": torch.zeros(H, 2 * H), "fc.bias": torch.zeros(H),
            "layers.0.self_attn.q_proj.weight": torch.zeros(H, H),
            "layers.0.post_attention_layernorm.weight": torch.ones(H),
            "layers.0.mlp.down_proj.weight": torch.zeros(H, INNER)}


BAD_CONFIGS = {
    "eagle-1/2 architecture": ({"architectures": ["EagleLlamaForCausalLM"]}, "EAGLE-1/2 head"),
    "other architecture": ({"architectures": ["Qwen3ForCausalLMEagle3"]}, "not an EAGLE-3 Llama head"),
    "draft vocab > vocab": ({"draft_vocab_size": V + 1}, "larger than vocab_size"),
    "two layers": ({"num_hidden_layers": 2}, "the flat layout holds one layer"),
    "dynamic rope": ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope type 'dynamic'"),
    "two ropes": ({"rope_scaling": {"rope_type": "linear", "factor": 2.0},
                   "rope_parameters": {"rope_type": "linear", "factor": 4.0}}, "disagree"),
    "no fc": ({"eagle_config": {"use_aux_hidden_state": False}}, "use_aux_hidden_state"),
    "both tap norms": ({"norm_before_fc": True, "fc_norm": True}, "both set"),
    "gelu": ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    "no hidden size": ({"hidden_size": None}, "has no hidden_size"),
    "bad heads": ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads"),
    "speculators without its layer config": ({"speculators_model_type": "eagle3"}, "transformer_layer_config is "
                                                                                  "missing"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_configs_are_refused(case):
    overrides, message = BAD_CONFIGS[case]
    with pytest.raises(EagleHeadError, match=message) as err:
        read_config(config_json(**overrides))
    assert "\n" not in str(err.value)


def test_bad_folders_are_refused(tmp_path):
    cfg = read_config(config_json())
    with pytest.raises(EagleHeadError, match="folder not found"):
        load_eagle3(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(EagleHeadError, match="has no config.json"):
        load_eagle3(tmp_path / "empty")
    (tmp_path / "empty" / "config.json").write_text("{not json")
    with pytest.raises(EagleHeadError, match="not valid JSON"):
        load_eagle3(tmp_path / "empty")
    (tmp_path / "empty" / "config.json").write_text(json.dumps(config_json()))
    with pytest.raises(EagleHeadError, match="has no model.safetensors or pytorch_model.bin"):
        load_eagle3(tmp_path / "empty")
    (tmp_path / "empty" / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(EagleHeadError, match="not a safetensors index"):
        load_eagle3(tmp_path / "empty")
    for shard in ('"../x"', "3"):  # outside the folder; not a file name at all
        (tmp_path / "empty" / "model.safetensors.index.json").write_text(f'{{"weight_map": {{"fc.weight": {shard}}}}}')
        with pytest.raises(EagleHeadError, match="not a file in"):
            load_eagle3(tmp_path / "empty")
    (tmp_path / "empty" / "model.safetensors.index.json").unlink()
    (tmp_path / "empty" / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00garbage!")
    with pytest.raises(EagleHeadError, match="could not read the weights"):
        load_eagle3(tmp_path / "empty")
    (tmp_path / "empty" / "model.safetensors").unlink()
    torch.save([torch.zeros(2)], tmp_path / "empty" / "pytorch_model.bin")
    with pytest.raises(EagleHeadError, match="not a state dict of tensors"):
        load_eagle3(tmp_path / "empty")
    write_published(tmp_path / "e12", config_json(architectures=["LlamaForCausalLM"], draft_vocab_size=None),
                    _eagle12_state())
    with pytest.raises(EagleHeadError, match="EAGLE-1/2 checkpoint"):
        load_eagle3(tmp_path / "e12")
    write_published(tmp_path / "none", config_json(), {"foo.weight": torch.zeros(2)})
    with pytest.raises(EagleHeadError, match="no midlayer"):
        load_eagle3(tmp_path / "none")
    # a bad map is caught before anything is written
    d2t, t2d = vocab_map()
    d2t[3] = 10 * V
    with pytest.raises(EagleHeadError, match="d2t maps draft id 3"):
        save_eagle3(tmp_path / "out", cfg, random_head(cfg), d2t, t2d)
    assert not (tmp_path / "out").exists()


TARGETS = {
    "hidden size": ({"hidden_size": 64, "vocab_size": V, "num_hidden_layers": 8}, "target of hidden size 48"),
    "vocab": ({"hidden_size": H, "vocab_size": V + 8, "num_hidden_layers": 8}, "vocab_size is 200; this target's is 208"),
    "too few layers": ({"hidden_size": H, "vocab_size": V, "num_hidden_layers": 3}, "too few"),
}


@pytest.mark.parametrize("case", list(TARGETS))
def test_a_head_for_another_target_is_refused(tmp_path, case):
    target, message = TARGETS[case]
    cfg = read_config(config_json())
    write_published(tmp_path / "h", config_json(), published_state(cfg))
    assert load_eagle3(tmp_path / "h", {"hidden_size": H, "vocab_size": V, "num_hidden_layers": 8})[0] == cfg
    with pytest.raises(EagleHeadError, match=message):
        load_eagle3(tmp_path / "h", target)
    # explicit taps past the target's last layer: trained for a deeper target
    write_published(tmp_path / "deep", config_json(eagle_aux_hidden_state_layer_ids=[2, 16, 29]),
                    published_state(cfg))
    with pytest.raises(EagleHeadError, match="made for another target"):
        load_eagle3(tmp_path / "deep", {"hidden_size": H, "vocab_size": V, "num_hidden_layers": 8})
