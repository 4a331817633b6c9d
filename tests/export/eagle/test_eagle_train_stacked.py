"""`specrt eagle train --layers N`: stacked heads (the EAGLE-3 layer, then standard decoder layers) trained with the
same training-time test, started as the target's last layers, saved in the speculators format, exported exact."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from support.models import FACTORIES, save_pattern_target

from specrt.errors import ConfigError
from specrt.export.eagle.config import Eagle3Config
from specrt.export.eagle.head import Eagle3Head
from specrt.export.eagle.checkpoint import load_eagle3
from specrt.export.eagle.train import EagleTrainConfig, train_eagle

PROMPTS = ["def fib(n):", "for i in range(10):", "class Point:", "The quick brown fox", "import os", "x = 1",
           "print(i)", "return n"]
SMALL = EagleTrainConfig(steps=40, lr=3e-3, batch_size=4, seq_len=32, num_sequences=16, draft_vocab=None, topk=16,
                         checkpoint_every=10, heldout_fraction=0.25, compute="float32", layers=2)


@pytest.fixture(scope="module")
def pattern_target(tmp_path_factory):
    return save_pattern_target(tmp_path_factory.mktemp("stacked-pattern") / "target")


def test_a_stacked_heads_layer_takes_a_past_for_every_layer():
    """(The unrolled steps of a stacked head against the runtime's chain: test_eagle_train.py, parametrised.)"""
    cfg = Eagle3Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                       vocab_size=50, draft_vocab_size=20, target_hidden_size=24, num_layers=3)
    head = Eagle3Head(cfg).eval()
    with pytest.raises(ConfigError, match="past for 1 layers, the head has 3"):
        head.layer(torch.zeros(1, 1, 32), torch.zeros(1, 1, 32), torch.zeros(1, 1, dtype=torch.long),
                   torch.ones(1, 1, 1, 2, dtype=torch.bool), ((torch.zeros(1, 1, 2, 8),) * 2,))


def test_a_fresh_stacked_head_starts_as_the_targets_last_layers():
    """The EAGLE-3 layer is the target's layer L-2 over the fused features, the stacked one its last layer whole."""
    from specrt.export.eagle.init import head_config, new_head

    torch.manual_seed(0)
    model = FACTORIES["llama"](96, 4, 64, 4, 2).eval()
    cfg = head_config(model.config, 40, num_layers=2)
    head = new_head(cfg, model, torch.arange(40) * 2, seed=0, from_target=True)
    before, last = model.model.layers[-2], model.model.layers[-1]
    torch.testing.assert_close(head.midlayer.mlp.down_proj.weight, before.mlp.down_proj.weight)
    torch.testing.assert_close(head.midlayer.self_attn.q_proj.weight[:, 64:], before.self_attn.q_proj.weight)
    stacked = head.layers["1"]
    for mine, theirs in ((stacked.self_attn.k_proj, last.self_attn.k_proj), (stacked.mlp.up_proj, last.mlp.up_proj),
                         (stacked.input_layernorm, last.input_layernorm)):
        torch.testing.assert_close(mine.weight, theirs.weight)


def test_a_stacked_head_learns_saves_in_the_speculators_format_and_exports_exact(pattern_target, tmp_path):
    import specrt

    from specrt.export.exporter import export_bundle

    record = train_eagle(pattern_target, tmp_path / "head", SMALL, prompts=PROMPTS)
    assert record["heldout"]["alpha1"] > record["heldout_init"]["alpha1"] + 0.2
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and record["head"] == config
    assert config["transformer_layer_config"]["num_hidden_layers"] == 2
    cfg, head, _, _ = load_eagle3(tmp_path / "head")
    assert cfg.num_layers == 2 and cfg.variants == ("layers=2",)
    export_bundle(str(pattern_target), None, tmp_path / "bundle", eagle=str(tmp_path / "head"))
    gen = specrt.load(tmp_path / "bundle", threads=1)
    for prompt in PROMPTS[:2]:
        want = gen.generate(prompt, max_new_tokens=16, method="none").token_ids
        got = gen.generate(prompt, max_new_tokens=16, method="eagle", gamma=3)
        assert got.token_ids == want and got.stats.accepted > 0
    # a warm start keeps the head's layers; another count asked beside it is refused before any work
    more = train_eagle(pattern_target, tmp_path / "more", replace(SMALL, steps=5, init=str(tmp_path / "head")),
                       prompts=PROMPTS[::-1])
    assert more["head"]["transformer_layer_config"]["num_hidden_layers"] == 2
    with pytest.raises(ConfigError, match="--layers 3, but the --init head has 2 layer"):
        train_eagle(pattern_target, tmp_path / "no", replace(SMALL, layers=3, init=str(tmp_path / "head")),
                    prompts=PROMPTS)
    assert not (tmp_path / "no").exists()


def test_layers_is_checked_in_the_config_and_on_the_command_line(tmp_path):
    from click.testing import CliRunner

    from specrt.cli import main

    with pytest.raises(ConfigError, match="layers must be an integer in \\[1, 8\\]"):
        EagleTrainConfig(layers=0)
    res = CliRunner().invoke(main, ["eagle", "train", str(tmp_path), "-o", str(tmp_path / "h"), "--layers", "9"])
    assert res.exit_code == 2 and "--layers" in res.output and not (tmp_path / "h").exists()
