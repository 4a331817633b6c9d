"""The demo pipeline end to end on the tiny preset: train → fp16 checkpoints + Medusa and EAGLE-3 heads →
bundle."""

from __future__ import annotations

import specrt
from specrt.bundle.manifest import load_manifest
from specrt.export.demo.build import build
from specrt.export.demo.config import ModelShape, TrainConfig
from specrt.export.demo.train import train_demo


def test_tiny_pipeline_builds_a_working_bundle(tmp_path):
    pair = tmp_path / "pair"
    # four target layers: the fewest an EAGLE-3 head can tap three distinct ones of
    train_demo(TrainConfig.tiny(target=ModelShape(32, 4, 2, 1, 64)), pair, progress=False)
    build(pair, hf_out=tmp_path / "hf", bundle_out=tmp_path / "bundle", medusa_steps=5, corpus_bytes=200_000,
          seq_len=64, eagle=True, eagle_overrides={"steps": 3, "num_sequences": 4, "seq_len": 64, "ttt_steps": 2},
          eagle_doc_bytes=30_000, eagle_prompts=4)
    m = load_manifest(tmp_path / "bundle")
    assert m.target.dtype == "float16" and m.medusa is not None and m.medusa.num_heads == 3
    assert m.eagle is not None and m.eagle.dtype == "float16" and m.target.eagle_taps == m.eagle.eagle_taps
    assert not m.target.source.startswith("/")  # recorded relative to the repo, not this machine
    for name in ("training.json", "MODEL_CARD.md", "medusa/medusa_config.json", "eagle/config.json",
                 "eagle/training.json"):
        assert (tmp_path / "hf" / name).is_file()
    gen = specrt.load(tmp_path / "bundle", threads=1)
    plain = gen.generate("def f():", max_new_tokens=16, method="none").token_ids
    for method in ("draft", "tree", "medusa", "eagle", "eagle-tree"):
        assert gen.generate("def f():", max_new_tokens=16, method=method).token_ids == plain
