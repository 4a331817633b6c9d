"""Stacked EAGLE-3 heads (speculators' ``num_hidden_layers`` > 1: the EAGLE-3 layer, then standard decoder
layers ``layers.1.*`` ... on its output, as vLLM runs them): the config, the later layers checked against
transformers' own decoder layers, the cache of every layer, and such a head exported and run exact."""

from __future__ import annotations

import pytest
import torch
from support.models import make_tokenizer, save_model
from support.eagle_heads import H, HEADS, V, random_head, speculators_config, vocab_map, write_speculators

from specrt.errors import ConfigError, EagleHeadError
from specrt.export.eagle.config import Eagle3Config
from specrt.export.eagle.checkpoint import read_config
from specrt.export.eagle.native import native_json
from specrt.export.eagle.head import Eagle3Head
from specrt.export.eagle.checkpoint import load_eagle3, save_eagle3


def stacked_config(layers: int = 3, **layer) -> dict:
    config = speculators_config()
    config["transformer_layer_config"].update(num_hidden_layers=layers, **layer)
    return config


def test_a_stacked_config_reads_as_layers_and_is_written_in_the_speculators_format(tmp_path):
    cfg = read_config(stacked_config(3))
    assert cfg.num_layers == 3 and cfg.variants == ("layers=3",)
    head = random_head(cfg)
    assert sorted(head.layers) == ["1", "2"]  # checkpoint names layers.1.*, layers.2.*, as speculators'
    assert any(k.startswith("layers.2.self_attn.q_proj") for k in head.state_dict())
    slid = read_config(stacked_config(2, sliding_window=5, layer_types=["sliding_attention"] * 2))
    assert (slid.num_layers, slid.sliding_window) == (2, 5)
    with pytest.raises(EagleHeadError, match="slide some layers and not others"):
        read_config(stacked_config(2, sliding_window=5, layer_types=["sliding_attention", "full_attention"]))
    with pytest.raises(EagleHeadError, match="no fields for layers=3"):
        native_json(cfg)  # the flat layout has one layer: save_eagle3 writes the speculators format instead
    save_eagle3(tmp_path / "saved", cfg, head, *vocab_map())
    again_cfg, again, _, _ = load_eagle3(tmp_path / "saved")
    assert again_cfg == cfg and all(torch.equal(a, b) for a, b in zip(again.state_dict().values(),
                                                                      head.state_dict().values()))
    with pytest.raises(EagleHeadError, match="num_layers must be a positive integer"):
        Eagle3Config(hidden_size=H, num_attention_heads=HEADS, intermediate_size=96, vocab_size=V, num_layers=0)


def test_a_stacked_checkpoint_is_read_layer_by_layer(tmp_path):
    config = stacked_config(2)
    head = random_head(read_config(config), seed=4)
    write_speculators(tmp_path / "ok", config, head, shards=2)
    _, again, _, _ = load_eagle3(tmp_path / "ok", {"hidden_size": H, "vocab_size": V, "num_hidden_layers": 5})
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), head.state_dict().values()))
    one = stacked_config(1)
    write_speculators(tmp_path / "more", one, head)  # a config of one layer beside a second layer's weights
    with pytest.raises(EagleHeadError, match="unexpected weights layers.1."):
        load_eagle3(tmp_path / "more")
    three = stacked_config(3)
    write_speculators(tmp_path / "fewer", three, head)
    with pytest.raises(EagleHeadError, match="lacks layers.2."):
        load_eagle3(tmp_path / "fewer")


def _reference_layers(model_type: str, cfg: Eagle3Config, head: Eagle3Head) -> list[torch.nn.Module]:
    """transformers' own decoder layers (what speculators builds layers.1.* from), with the head's weights."""
    if model_type == "llama":
        from transformers import LlamaConfig as Config
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer as Layer
    else:
        from transformers import Qwen3Config as Config
        from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer as Layer
    config = Config(hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, vocab_size=cfg.vocab_size,
                    num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
                    head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps, num_hidden_layers=cfg.num_layers)
    config._attn_implementation = "eager"
    layers = []
    for i, mine in head.layers.items():
        layer = Layer(config, layer_idx=int(i)).eval()
        layer.load_state_dict(mine.state_dict())
        layers.append(layer)
    return layers


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_the_later_layers_are_transformers_decoder_layers(model_type):
    """The head's stacked layers against transformers' LlamaDecoderLayer / Qwen3DecoderLayer on the first
    layer's output (same rope, same additive causal mask), then the final norm and the LM head; and each
    layer's cache: a step after a cached prefill gives the rows the whole sequence gives at once."""
    config = stacked_config(3, model_type=model_type)
    cfg = read_config(config)
    head = random_head(cfg, seed=6)
    single = Eagle3Head(Eagle3Config(**{**cfg.__dict__, "num_layers": 1})).eval()
    single.load_state_dict({k: v for k, v in head.state_dict().items() if not k.startswith("layers.")})
    g = torch.Generator().manual_seed(2)
    t = 6
    taps, embeds = 3 * torch.randn(1, t, 3 * H, generator=g), torch.randn(1, t, H, generator=g)
    pos, mask = torch.arange(t)[None], torch.ones(1, 1, t, t, dtype=torch.bool).tril()
    with torch.no_grad():
        got = head(taps, embeds, pos, mask)
        h = single(taps, embeds, pos, mask).hidden  # the first layer alone: its output feeds layers.1
        cos, sin = head.rotary(h, pos)
        additive = torch.zeros(1, 1, t, t).masked_fill(~mask, torch.finfo(torch.float32).min)
        for layer in _reference_layers(model_type, cfg, head):
            h = layer(h, attention_mask=additive, position_ids=pos, position_embeddings=(cos, sin))
        torch.testing.assert_close(got.hidden, h, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.logits, head.lm_head(head.norm(h)), atol=1e-5, rtol=1e-5)
        assert len(got.rest) == 2
        # the last two rows as a step over the first four rows' caches, every layer's included
        pre = head(taps[:, :4], embeds[:, :4], pos[:, :4], mask[..., :4, :4])
        step = head(taps[:, 4:], embeds[:, 4:], pos[:, 4:], mask[..., 4:, :], pre.key, pre.value, pre.rest)
    torch.testing.assert_close(step.logits, got.logits[:, 4:], atol=1e-5, rtol=1e-5)
    for layer in range(2):  # each later layer's new K and V rows: the prefill's, then the step's
        for kv in range(2):
            rows = torch.cat([pre.rest[layer][kv], step.rest[layer][kv]], dim=1)
            torch.testing.assert_close(rows, got.rest[layer][kv], atol=1e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match="past for 1 stacked layers, the head has 2"):
        head.step(got.hidden[:, -1:], embeds[:, :1], pos[:, -1:] + 1, torch.ones(1, 1, 1, t + 1, dtype=torch.bool),
                  got.key, got.value, got.rest[:1])
    with pytest.raises(ConfigError, match="past for 0 stacked layers, the head has 2"):  # the first layer's alone
        head.step(got.hidden[:, -1:], embeds[:, :1], pos[:, -1:] + 1, torch.ones(1, 1, 1, t + 1, dtype=torch.bool),
                  got.key, got.value)


def test_training_starts_from_a_stacked_head_but_not_from_other_variants(tmp_path):
    from transformers import LlamaConfig

    from specrt.export.eagle.init import init_head

    target = LlamaConfig(hidden_size=H, vocab_size=V, num_hidden_layers=5, num_attention_heads=HEADS)
    for name, extra in (("plain", {}), ("fed", {"norm_output": True})):
        config = {**stacked_config(2), **extra}  # taps 1, 2, 4: what training feeds a 5-layer target
        write_speculators(tmp_path / name, config, random_head(read_config(config)))
    cfg, head, _, _ = init_head(str(tmp_path / "plain"), target)
    assert cfg.num_layers == 2 and head.training
    with pytest.raises(ConfigError, match=r"variant \(feed_normed\)"):
        init_head(str(tmp_path / "fed"), target)


@pytest.fixture(scope="module")
def stacked_bundle(tmp_path_factory):
    """A tiny llama target exported with a three-layer speculators head whose layers are Qwen3's (q/k norms in
    every layer), all sliding (a window shorter than the test prompts), the normalised output fed back."""
    from transformers import AutoConfig

    from specrt.export.exporter import export_bundle

    root = tmp_path_factory.mktemp("stacked")
    target = save_model(root / "target", "llama", seed=2, layers=5, hidden=64, tokenizer=make_tokenizer())
    vocab = AutoConfig.from_pretrained(target).vocab_size
    config = speculators_config(taps=(1, 3, 4), vocab=vocab, draft=96, hidden=64, norm_output=True)
    config["transformer_layer_config"].update(model_type="qwen3", num_hidden_layers=3, sliding_window=6,
                                              use_sliding_window=True, layer_types=["sliding_attention"] * 3)
    head = random_head(read_config(config), seed=8)
    folder = write_speculators(root / "head", config, head)
    out = root / "bundle"
    export_bundle(str(target), None, out, eagle=str(folder))  # raises on a parity failure
    return target, folder, out


def test_a_stacked_head_exports_with_every_layers_cache_and_runs_exact(stacked_bundle, tmp_path):
    """Exported on the fused graph (parity checked at export), on the gqa graph and with its matmuls at int8:
    greedy eagle and eagle-tree give plain decoding's tokens, the head's cache holding each layer."""
    import specrt
    from support.exactness import PROMPTS

    from specrt.bundle.manifest import load_manifest
    from specrt.export.exporter import ExportOptions, export_bundle
    from specrt.export.quant.quantize import QuantizeOptions, quantize_bundle

    from specrt.export.pipeline import describe

    target, folder, bundle = stacked_bundle
    manifest = load_manifest(bundle)
    assert manifest.models["eagle"].dims.num_layers == 3
    assert manifest.models["eagle"].variants == ("feed_normed", "sliding_window=6", "qk_norm", "layers=3")
    assert "EAGLE-3 head (fused graph, feed_normed, sliding_window=6, qk_norm, layers=3)" in describe(manifest)
    export_bundle(str(target), None, tmp_path / "gqa", ExportOptions(graph="gqa"), eagle=str(folder))
    quantize_bundle(tmp_path / "gqa", tmp_path / "q8", QuantizeOptions(bits=None, eagle_bits=8))
    for b in (bundle, tmp_path / "gqa", tmp_path / "q8"):
        gen = specrt.load(b, threads=1)
        for prompt in PROMPTS[:2]:
            want = gen.generate(prompt, max_new_tokens=20, method="none").token_ids
            for options in (dict(method="eagle", gamma=3), dict(method="eagle-tree", eagle_tree="2,3,6")):
                got = gen.generate(prompt, max_new_tokens=20, **options)
                assert got.token_ids == want and got.stats.drafted > 0, (b, options)
        assert gen._models["eagle"].cache.num_layers == 3


def test_zeroed_later_layers_draft_what_the_first_layer_drafts(tmp_path):
    """Layers whose o_proj and down_proj are zero pass the residual stream through unchanged, so a stacked head
    built that way proposes exactly what its first layer alone proposes: the same drafts, pass for pass."""
    import specrt
    from support.exactness import PROMPTS
    from transformers import AutoConfig

    from specrt.export.exporter import export_bundle

    target = save_model(tmp_path / "target", "llama", seed=3, layers=5, hidden=64, tokenizer=make_tokenizer())
    vocab = AutoConfig.from_pretrained(target).vocab_size
    heads = {}
    for layers in (1, 2):
        config = speculators_config(taps=(1, 3, 4), vocab=vocab, draft=96, hidden=64)
        config["transformer_layer_config"]["num_hidden_layers"] = layers
        heads[layers] = (config, random_head(read_config(config), seed=9))
    stacked = heads[2][1]
    stacked.load_state_dict({**stacked.state_dict(), **heads[1][1].state_dict()})
    with torch.no_grad():
        stacked.layers["1"].self_attn.o_proj.weight.zero_()
        stacked.layers["1"].mlp.down_proj.weight.zero_()
    stats = {}
    for layers, (config, head) in heads.items():
        export_bundle(str(target), None, tmp_path / f"b{layers}", eagle=str(write_speculators(
            tmp_path / f"h{layers}", config, head)))
        gen = specrt.load(tmp_path / f"b{layers}", threads=1)
        stats[layers] = [(r.token_ids, r.stats.drafted, r.stats.accepted) for r in
                         (gen.generate(p, max_new_tokens=16, method="eagle", gamma=2) for p in PROMPTS[:2])]
    assert stats[1] == stats[2] and sum(s[1] for s in stats[2]) > 0


def test_a_stacked_head_on_the_torch_backend_gives_onnxruntimes_tokens(stacked_bundle):
    """The torch backend (what GPUs without TensorRT run, CUDA graphs included) builds the head from its
    checkpoint and feeds every layer's cache: greedy and sampled, ONNX Runtime's tokens."""
    import specrt

    _, _, bundle = stacked_bundle
    reference, torch_gen = specrt.load(bundle, threads=1), specrt.load(bundle, backend="torch", threads=1)
    for kwargs in (dict(method="eagle", gamma=3), dict(method="eagle-tree", eagle_tree="2,3,5"),
                   dict(method="eagle", gamma=2, temperature=0.8, top_k=20, seed=1)):
        want = reference.generate("def fib(n):", max_new_tokens=16, **kwargs).token_ids
        assert torch_gen.generate("def fib(n):", max_new_tokens=16, **kwargs).token_ids == want, kwargs
    assert torch_gen.decoders["eagle"].new_cache(8).num_layers == 3
