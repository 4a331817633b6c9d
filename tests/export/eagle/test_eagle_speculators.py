"""EAGLE-3 heads in the ``speculators`` format (vllm-project/speculators, the RedHatAI heads): the config read
with its defaults, the weights renamed, the variants computed as that format defines them, and such a head
exported and run exact. Heads here are tiny and random, written as speculators writes them."""

from __future__ import annotations

import json

import pytest
import torch
from support.models import make_tokenizer, save_model
from support.eagle_heads import HEADS, INNER, KV, D, H, V, random_head, speculators_config, vocab_map, write_speculators

from specrt.errors import ConfigError, EagleHeadError
from specrt.export.eagle.config import Eagle3Config
from specrt.export.eagle.checkpoint import read_config
from specrt.export.eagle.native import native_json
from specrt.export.eagle.head import Eagle3Head
from specrt.export.eagle.checkpoint import load_eagle3, save_eagle3

# RedHatAI/gpt-oss-20b-speculator.eagle3's config, as the format writes it (the layer config is a diff
# against LlamaConfig's defaults; the top level holds every field)
GPT_OSS = {"architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3", "draft_vocab_size": 64000,
           "norm_before_fc": True, "norm_before_residual": True, "fc_norm": False, "norm_output": False,
           "target_hidden_size": None, "eagle_aux_hidden_state_layer_ids": None,
           "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                  "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                  "verifier": {"architectures": ["GptOssForCausalLM"],
                                               "name_or_path": "openai/gpt-oss-20b"}},
           "transformer_layer_config": {"model_type": "llama", "hidden_size": 2880, "num_hidden_layers": 1,
                                        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
                                        "intermediate_size": 2880, "vocab_size": 201088, "rms_norm_eps": 1e-5,
                                        "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0,
                                                            "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                                            "original_max_position_embeddings": 4096}}}

def _inputs(cfg: Eagle3Config, t: int = 5, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    taps = 3 * torch.randn(1, t, 3 * cfg.target_hidden_size, generator=g)  # not unit scale: a norm shows
    embeds = torch.randn(1, t, cfg.hidden_size, generator=g)
    mask = torch.ones(1, 1, t, t, dtype=torch.bool).tril()
    return taps, embeds, torch.arange(t)[None], mask


# --- the config --------------------------------------------------------------------------------------------


def test_a_published_config_reads_with_the_formats_defaults():
    cfg = read_config(GPT_OSS)
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (2880, 64, 8, 64)
    assert (cfg.vocab_size, cfg.draft_vocab_size, cfg.target_hidden_size) == (201088, 64000, 2880)
    assert (cfg.tap_norm, cfg.norm_before_residual, cfg.feed_normed, cfg.taps) == ("joint", True, False, None)
    assert cfg.rope_theta == 150000.0 and cfg.rope_scaling["rope_type"] == "yarn" and cfg.rope_scaling["factor"] == 32
    assert cfg.max_position_embeddings == 2048  # LlamaConfig's default: the file leaves it out
    tiny = read_config(speculators_config(fc_norm=True, norm_output=True))
    assert (tiny.rms_norm_eps, tiny.taps, tiny.tap_norm, tiny.feed_normed) == (1e-6, (1, 2, 4), "each", True)
    assert (tiny.rope_theta, tiny.rope_scaling) == (10000.0, None)  # LlamaConfig's defaults
    assert tiny.variants == ("tap_norm=each", "feed_normed")
    # top-level fields left out take speculators' defaults (its writer always writes them; vLLM assumes
    # norm_before_residual true when absent, which speculators never wrote)
    bare = {k: v for k, v in speculators_config().items() if k not in ("norm_before_residual", "norm_before_fc",
                                                                        "fc_norm", "norm_output")}
    assert read_config(bare).variants == () and not read_config(bare).norm_before_residual
    with pytest.raises(EagleHeadError, match="flat EAGLE-3 layout has no fields for feed_normed"):
        native_json(tiny)
    each = Eagle3Config(**{**tiny.__dict__, "feed_normed": False})  # a tap norm has flat names (vLLM, SpecForge)
    assert native_json(each)["fc_norm"] is True and read_config(native_json(each)) == each
    # a Qwen3 layer (speculators' --draft-arch qwen3, and what it builds when model_type is left out)
    for layer in ({"model_type": "qwen3"}, {}):
        qwen = speculators_config()
        qwen["transformer_layer_config"].pop("model_type")
        qwen["transformer_layer_config"].update(layer)
        assert read_config(qwen).qk_norm and read_config(qwen).variants == ("qk_norm",)
    # speculators' trainer now slides every draft layer (window 2048) unless told which to keep full
    slid = speculators_config()
    slid["transformer_layer_config"].update(sliding_window=2048, use_sliding_window=True,
                                            layer_types=["sliding_attention"])
    assert read_config(slid).sliding_window == 2048
    slid["transformer_layer_config"]["layer_types"] = ["full_attention"]
    assert read_config(slid).sliding_window is None


BAD = {
    "eagle-1": ({"speculators_model_type": "eagle"}, "is an EAGLE-1 / HASS head, not an EAGLE-3 head"),
    "dflash": ({"speculators_model_type": "dflash"}, "is a DFlash drafter"),
    "no layer config": ({"transformer_layer_config": None}, "transformer_layer_config is missing"),
    "gemma layer": ({"transformer_layer_config": {"model_type": "gemma", "hidden_size": H}}, "a 'gemma' decoder layer"),
    "both tap norms": ({"norm_before_fc": True, "fc_norm": True}, "both set"),
    "two taps": ({"eagle_aux_hidden_state_layer_ids": [2, 4]}, "exactly three target layers"),
    "flag not bool": ({"norm_output": "yes"}, "norm_output must be true or false"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_what_specrt_cannot_run_is_refused_in_one_line(case):
    overrides, message = BAD[case]
    with pytest.raises(EagleHeadError, match=message) as err:
        read_config(speculators_config(**overrides))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("layer, message", [({"num_hidden_layers": 2, "sliding_window": 4,
                                              "layer_types": ["sliding_attention", "full_attention"]},
                                             "slide some layers and not others"),
                                            ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
                                            ({"attention_bias": True}, "attention_bias is set"),
                                            ({"layer_types": ["chunked_attention"]}, "layer_types"),
                                            ({"sliding_window": None, "layer_types": ["sliding_attention"]},
                                             "needs a positive sliding_window")])
def test_layer_variants_specrt_cannot_run_are_refused(layer, message):
    config = speculators_config()
    config["transformer_layer_config"].update(layer)
    with pytest.raises(EagleHeadError, match=message):
        read_config(config)


# --- the weights and the forward ----------------------------------------------------------------------------


def test_a_speculators_head_computes_what_its_weights_do_in_the_flat_layout(tmp_path):
    config = speculators_config()
    cfg = read_config(config)
    head = random_head(cfg, seed=2)
    write_speculators(tmp_path / "spec", config, head, shards=3)
    save_eagle3(tmp_path / "flat", cfg, head, *vocab_map())
    cfg_s, spec, d2t_s, t2d_s = load_eagle3(tmp_path / "spec", {"hidden_size": H, "vocab_size": V,
                                                                "num_hidden_layers": 5})
    _, flat, d2t_f, t2d_f = load_eagle3(tmp_path / "flat")
    assert cfg_s == cfg and torch.equal(d2t_s, d2t_f) and torch.equal(t2d_s, t2d_f)
    taps, embeds, pos, mask = _inputs(cfg)
    with torch.no_grad():
        a, b = spec(taps, embeds, pos, mask), flat(taps, embeds, pos, mask)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.hidden, b.hidden)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return weight.double() * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("tap_norm", ["none", "joint", "each"])
@pytest.mark.parametrize("feed_normed", [False, True])
def test_the_variants_compute_what_speculators_defines(tap_norm, feed_normed):
    """speculators' Eagle3DraftModel.forward: the taps normalised (one norm over the concat, or one per tap)
    before fc; with norm_output the final norm's output is both the LM head's input and the next step's
    features. Checked against the standard head on the same weights, which test_eagle.py checks against
    the architecture written out with plain ops."""
    cfg = Eagle3Config(hidden_size=H, num_attention_heads=HEADS, num_key_value_heads=KV, intermediate_size=INNER,
                       vocab_size=V, draft_vocab_size=D, target_hidden_size=40, tap_norm=tap_norm,
                       feed_normed=feed_normed, norm_before_residual=True)
    variant = random_head(cfg, seed=5)
    standard = Eagle3Head(Eagle3Config(**{**cfg.__dict__, "tap_norm": "none", "feed_normed": False})).eval()
    standard.load_state_dict({k: v for k, v in variant.state_dict().items()
                              if not k.startswith(("input_norm", "fc_norm"))})
    taps, embeds, pos, mask = _inputs(cfg, t=4)
    w = variant.state_dict()
    if tap_norm == "joint":
        normed_taps = _rms(taps, w["input_norm.weight"], cfg.rms_norm_eps)
    elif tap_norm == "each":
        normed_taps = torch.cat([_rms(t, w[f"fc_norm.{i}.weight"], cfg.rms_norm_eps)
                                 for i, t in enumerate(taps.chunk(3, dim=-1))], dim=-1)
    else:
        normed_taps = taps.double()
    with torch.no_grad():
        first = variant(taps, embeds, pos, mask)
        want = standard(normed_taps.float(), embeds, pos, mask)
        fed = first.hidden[:, -1:]  # a deeper step reads the variant's own output
        second = variant.step(fed, embeds[:, :1], pos[:, -1:] + 1, torch.ones(1, 1, 1, 5, dtype=torch.bool),
                              first.key, first.value)
        second_want = standard.step(fed, embeds[:, :1], pos[:, -1:] + 1, torch.ones(1, 1, 1, 5, dtype=torch.bool),
                                    want.key, want.value)
    for got, ref in ((first, want), (second, second_want)):
        torch.testing.assert_close(got.logits, ref.logits, atol=1e-5, rtol=1e-5)
        expected = _rms(ref.hidden, w["norm.weight"], cfg.rms_norm_eps).float() if feed_normed else ref.hidden
        torch.testing.assert_close(got.hidden, expected, atol=1e-5, rtol=1e-5)


def test_a_sliding_window_narrows_what_each_position_attends():
    """speculators' mask keeps key k for query q when k > q - window: with a window of 3 a query attends
    itself and the two positions before it, here over a cached past and a tree of siblings."""
    cfg = Eagle3Config(hidden_size=H, num_attention_heads=HEADS, num_key_value_heads=KV, intermediate_size=INNER,
                       vocab_size=V, draft_vocab_size=D, sliding_window=3)
    slid = random_head(cfg, seed=7)
    full = Eagle3Head(Eagle3Config(**{**cfg.__dict__, "sliding_window": None})).eval()
    full.load_state_dict(slid.state_dict())
    taps, embeds, pos, mask = _inputs(cfg, t=6)
    with torch.no_grad():
        past = full(taps, embeds, pos, mask)  # the window does not change a 6-row prefill's keys and values
        positions = torch.tensor([[6, 7, 7]])  # a chain node, then two siblings one level deeper
        tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
        mask2 = torch.cat([torch.ones(3, 6, dtype=torch.bool), tree], dim=1)[None, None]
        narrowed = mask2.clone()
        for row, p in enumerate(positions[0].tolist()):
            narrowed[0, 0, row, :6] &= torch.arange(6) > p - 3  # cached slot j holds position j
        feats, e = 2 * torch.randn(1, 3, H), torch.randn(1, 3, H)
        got = slid.step(feats, e, positions, mask2, past.key, past.value)
        want = full.step(feats, e, positions, narrowed, past.key, past.value)
        unnarrowed = full.step(feats, e, positions, mask2, past.key, past.value)
    torch.testing.assert_close(got.logits, want.logits, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got.logits, unnarrowed.logits, atol=1e-3)


def test_checkpoint_refusals(tmp_path):
    config = speculators_config(norm_before_fc=True)
    head = random_head(read_config(config))
    write_speculators(tmp_path / "deeper", config, head, extra={"layers.1.mlp.up_proj.weight": torch.zeros(2)})
    with pytest.raises(EagleHeadError, match="unexpected weights layers.1.mlp.up_proj.weight"):
        load_eagle3(tmp_path / "deeper")
    no_norm = {k: v for k, v in head.state_dict().items() if k != "input_norm.weight"}
    plain = Eagle3Head(read_config(speculators_config()))
    plain.load_state_dict({k: v for k, v in no_norm.items()})
    write_speculators(tmp_path / "missing", config, plain)
    with pytest.raises(EagleHeadError, match="lacks input_norm.weight"):
        load_eagle3(tmp_path / "missing")
    write_speculators(tmp_path / "other-target", speculators_config(vocab=V, draft=D), plain)
    with pytest.raises(EagleHeadError, match="vocab_size is 200; this target's is 300"):
        load_eagle3(tmp_path / "other-target", {"hidden_size": H, "vocab_size": 300, "num_hidden_layers": 5})
    # a tap norm is written in the flat layout as vLLM names it, and reads back to the same head
    save_eagle3(tmp_path / "flat", head.cfg, head, *vocab_map())
    _, again, _, _ = load_eagle3(tmp_path / "flat")
    assert again.cfg == head.cfg and torch.equal(again.input_norm.weight, head.input_norm.weight)
    # what the flat layout cannot say is written in the speculators format, and reads back the same
    fed = read_config(speculators_config(norm_output=True, fc_norm=True))
    with pytest.raises(EagleHeadError, match="no fields for feed_normed"):
        native_json(fed)
    saved = random_head(fed, seed=4)
    save_eagle3(tmp_path / "out", fed, saved, *vocab_map())
    assert json.loads((tmp_path / "out" / "config.json").read_text())["speculators_model_type"] == "eagle3"
    back_cfg, back, _, _ = load_eagle3(tmp_path / "out")
    assert back_cfg == fed and torch.equal(back.fc_norm[1].weight, saved.fc_norm[1].weight)


# --- exported and run ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def speculators_bundle(tmp_path_factory):
    """A tiny llama target exported with a speculators head using every variant specrt implements (the taps
    normalised jointly, the residual after hidden_norm, the normalised output fed back, a sliding window, a
    Qwen3 layer's q/k norms)."""
    from specrt.export.exporter import export_bundle

    root = tmp_path_factory.mktemp("speculators")
    target = save_model(root / "target", "llama", seed=1, layers=5, hidden=64, tokenizer=make_tokenizer())
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(target).vocab_size
    config = speculators_config(taps=(1, 3, 4), vocab=vocab, draft=96, hidden=64, norm_before_fc=True,
                                norm_before_residual=True, norm_output=True)
    # a Qwen3 layer (q/k norms), with a window shorter than the test prompts, so it decides what the head attends
    config["transformer_layer_config"].update(model_type="qwen3", sliding_window=6, use_sliding_window=True,
                                              layer_types=["sliding_attention"])
    head = random_head(read_config(config), seed=3)
    folder = write_speculators(root / "head", config, head)
    out = root / "bundle"
    export_bundle(str(target), None, out, eagle=str(folder))  # raises on a parity failure
    return target, folder, out


def test_an_exported_speculators_head_runs_exact(speculators_bundle):
    import specrt
    from support.exactness import PROMPTS

    _, _, bundle = speculators_bundle
    gen = specrt.load(bundle, threads=1)
    for prompt in PROMPTS[:3]:
        plain = gen.generate(prompt, max_new_tokens=24, method="none")
        for options in (dict(method="eagle", gamma=3), dict(method="eagle-tree", eagle_tree="2,2,4")):
            spec = gen.generate(prompt, max_new_tokens=24, **options)
            assert spec.token_ids == plain.token_ids, options
            assert spec.stats.draft_passes > 0


def test_training_does_not_start_from_a_variant_head(speculators_bundle):
    from transformers import AutoConfig

    from specrt.export.eagle.init import init_head

    target, folder, _ = speculators_bundle
    with pytest.raises(ConfigError, match="speculators-format variant .*trains the standard EAGLE-3 head"):
        init_head(str(folder), AutoConfig.from_pretrained(target))


def test_the_gqa_graph_and_an_int8_head_keep_it_exact(speculators_bundle, tmp_path):
    """The same head on the graph the CPU benchmarks run (GroupQueryAttention, the cache written in place;
    its parity checked on that graph at export), then with its matmuls at int8."""
    import specrt
    from support.exactness import PROMPTS

    from specrt.bundle.manifest import load_manifest
    from specrt.export.exporter import ExportOptions, export_bundle
    from specrt.export.quant.quantize import QuantizeOptions, quantize_bundle

    target, folder, _ = speculators_bundle
    export_bundle(str(target), None, tmp_path / "gqa", ExportOptions(graph="gqa"), eagle=str(folder))
    assert load_manifest(tmp_path / "gqa").models["eagle"].graph == "gqa"
    quantize_bundle(tmp_path / "gqa", tmp_path / "q8", QuantizeOptions(bits=None, eagle_bits=8))
    for bundle in ("gqa", "q8"):
        gen = specrt.load(tmp_path / bundle, threads=1)
        want = gen.generate(PROMPTS[0], max_new_tokens=24, method="none").token_ids
        for method in ("eagle", "eagle-tree"):
            got = gen.generate(PROMPTS[0], max_new_tokens=24, method=method, eagle_tree="4,4,16")
            assert got.token_ids == want and got.stats.drafted > 0, (bundle, method)


def test_a_hub_id_is_fetched_once_at_export(speculators_bundle, tmp_path, monkeypatch):
    """``--eagle owner/name`` goes through huggingface_hub's snapshot_download (a stand-in with its signature:
    nothing is downloaded in tests), the config and weights only; the manifest then names the local copy."""
    import huggingface_hub
    from click.testing import CliRunner

    from specrt.bundle.manifest import load_manifest
    from specrt.cli import main

    target, folder, _ = speculators_bundle
    calls = []

    def snapshot_download(repo_id: str, *, allow_patterns=None, **kwargs) -> str:
        calls.append((repo_id, tuple(allow_patterns), kwargs))
        if repo_id != "RedHatAI/tiny-speculator.eagle3":  # what the hub raises offline, for a repo not cached
            raise huggingface_hub.errors.LocalEntryNotFoundError(
                "Cannot find an appropriate cached snapshot folder for the specified revision on the local disk and "
                "outgoing traffic has been disabled.")
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    res = CliRunner().invoke(main, ["export", str(target), "--eagle", "RedHatAI/tiny-speculator.eagle3",
                                    "--quantize", "none", "--no-measure", "-o", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    assert calls == [("RedHatAI/tiny-speculator.eagle3",
                      ("config.json", "*.safetensors", "model.safetensors.index.json", "pytorch_model.bin"), {})]
    assert load_manifest(tmp_path / "b").models["eagle"].source == str(folder)
    res = CliRunner().invoke(main, ["export", str(target), "--eagle", "nobody/nothing", "-o", str(tmp_path / "c")])
    assert res.exit_code == 1 and "neither a local folder nor fetchable" in res.output
    assert "cached snapshot" in res.output  # the hub's own reason, on the same line
    assert not (tmp_path / "c").exists()
    res = CliRunner().invoke(main, ["export", str(target), "--eagle", "./no/such/head", "-o", str(tmp_path / "d")])
    assert res.exit_code == 1 and "EAGLE-3 head folder not found" in res.output and len(calls) == 2


def test_only_a_hub_id_is_sent_to_the_hub(tmp_path, monkeypatch):
    """A folder is read where it is; ``owner/name`` that is no folder here goes to snapshot_download; anything
    path-like that is missing is a one-line 'not found', never a hub request."""
    import huggingface_hub

    from specrt.export.eagle.checkpoint import resolve_head

    asked = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo_id, *, allow_patterns=None, **kw: asked.append(repo_id) or str(tmp_path))
    (tmp_path / "owner" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert resolve_head("owner/name").resolve() == tmp_path / "owner" / "name"  # a local folder wins
    assert resolve_head("RedHatAI/x.eagle3") == tmp_path and asked == ["RedHatAI/x.eagle3"]
    for missing in ("./gone", "a/b/c", str(tmp_path / "gone"), "just-a-name"):
        with pytest.raises(EagleHeadError, match="EAGLE-3 head folder not found"):
            resolve_head(missing)
    assert asked == ["RedHatAI/x.eagle3"]
