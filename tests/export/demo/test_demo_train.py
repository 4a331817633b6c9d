"""The demo pair's training pipeline: corpus, tokenizer, config checks, and a tiny end-to-end run."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from specrt.errors import OutputPathError  # noqa: E402
from specrt.export.demo import corpus  # noqa: E402
from specrt.export.demo.card import model_card  # noqa: E402
from specrt.export.demo.config import ModelShape, TrainConfig  # noqa: E402
from specrt.export.demo.tokens import train_tokenizer, wrap_tokenizer  # noqa: E402
from specrt.export.demo.train import lr_factor, main, train_demo  # noqa: E402

CODE = ('import os\n\n\nclass Cache(dict):\n    """A café ✓ cache."""\n\n    def get(self, key, default=None):\n'
        '        return super().get(key, default)  # a . b\n\tx = [1, 2,  3]\n')


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("demo") / "run"
    return out, train_demo(TrainConfig.tiny(), out, progress=False)


def _finite_numbers(value) -> list[float]:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    items = value.values() if isinstance(value, dict) else value
    return [x for item in items for x in _finite_numbers(item)]


def test_tiny_run_writes_loadable_checkpoints(tiny_run):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, result = tiny_run
    for name in ("target", "draft"):
        folder = out / name
        assert (folder / "model.safetensors").is_file()
        model = AutoModelForCausalLM.from_pretrained(folder)
        tok = AutoTokenizer.from_pretrained(folder)
        assert model.config.model_type == "llama" and model.config.tie_word_embeddings
        assert (model.config.bos_token_id, model.config.eos_token_id) == (0, 1)
        assert model.config.max_position_embeddings == 1024
        assert model.config.vocab_size == len(tok) == result["tokens"]["vocab_size"]
        ids = tok(CODE, return_tensors="pt")["input_ids"]
        assert ids[0, 0].item() == 0
        with torch.no_grad():
            assert model(ids).logits.shape == (1, ids.shape[1], len(tok))
    assert result["params"]["target"] > result["params"]["draft"] > 0


def test_tiny_run_record(tiny_run):
    out, result = tiny_run
    on_disk = json.loads((out / "training.json").read_text())
    assert on_disk == json.loads(json.dumps(result))
    assert TrainConfig.from_dict(on_disk["config"]) == TrainConfig.tiny()
    assert all(math.isfinite(x) for x in _finite_numbers(on_disk))
    corp = on_disk["corpus"]
    assert corp["python_version"] and corp["files"] > 0 and corp["bytes"] > 0 and len(corp["sha256"]) == 64
    assert corp == asdict(corpus.corpus_record(300_000))
    for phase in ("target", "draft"):
        assert on_disk[phase]["tokens_per_s"] > 0 and on_disk["time_s"][phase] > 0
        assert on_disk[phase]["history"][-1]["step"] == on_disk["config"][f"{phase}_steps"]
    card = (out / "MODEL_CARD.md").read_text()
    assert card == model_card(on_disk) and corp["sha256"] in card and "PSF" in card


def test_tiny_run_learns(tiny_run):
    _, result = tiny_run
    target, draft, alpha = result["target"], result["draft"], result["alpha"]
    assert target["final_val_loss"] < target["init_val_loss"]
    assert draft["final_val_kl"] < draft["init_val_kl"]
    assert draft["final_val_loss"] < draft["init_val_loss"]
    assert 0.0 <= alpha["alpha_greedy"] <= 1.0 and 0.0 <= alpha["alpha_t1"] <= 1.0
    assert alpha["positions"] > 0


def test_corpus_split_is_deterministic():
    files = corpus.list_files()
    assert files == corpus.list_files()
    rels = [f.rel for f in files]
    assert rels == sorted(rels) and len(set(rels)) == len(rels)
    assert not any(part in corpus.EXCLUDED_DIRS for rel in rels for part in rel.split("/")[:-1])
    assert all(rel.endswith(".py") and f.size <= corpus.MAX_FILE_BYTES for rel, f in zip(rels, files))
    train, val = corpus.split_files(files)
    assert (train, val) == corpus.split_files(corpus.list_files())
    assert not {f.rel for f in train} & {f.rel for f in val} and len(train) + len(val) == len(files)
    assert 0.01 * len(files) <= len(val) <= 0.06 * len(files)
    # The split depends on the path alone, not on which other files exist.
    assert [corpus.is_val(f.rel) for f in val] == [True] * len(val)
    assert corpus.corpus_record(50_000) == corpus.corpus_record(50_000)
    assert corpus.corpus_record(50_000).sha256 != corpus.corpus_record(100_000).sha256


def test_corpus_byte_limit():
    texts = list(corpus.iter_texts("train", max_bytes=50_000))
    assert texts and sum(len(t.encode()) for t in texts) <= 50_000
    assert texts == list(corpus.iter_texts("train", max_bytes=50_000))


def test_tokenizer_round_trip(tmp_path):
    from transformers import AutoTokenizer

    raw = train_tokenizer(corpus.iter_texts("train", max_bytes=50_000), vocab_size=400)
    assert raw.get_vocab_size() <= 400 and raw.token_to_id("<s>") == 0 and raw.token_to_id("</s>") == 1
    wrap_tokenizer(raw, 1024).save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    ids = tok(CODE)["input_ids"]
    assert ids[0] == 0 == tok.bos_token_id and tok.eos_token_id == 1 and 0 not in ids[1:]
    assert tok.decode(ids, skip_special_tokens=True) == CODE
    assert raw.decode(raw.encode(CODE).ids) == CODE


def test_lr_schedule():
    factors = [lr_factor(s, 100, 0.1, 0.1) for s in range(100)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert factors[-1] == pytest.approx(0.1) and all(a >= b for a, b in zip(factors[9:], factors[10:]))


@pytest.mark.parametrize("bad", [dict(lr=0.0), dict(seq_len=2048), dict(ce_weight=1.5), dict(vocab_size=100),
                                 dict(target_steps=0), dict(draft=ModelShape(30, 1, 4, 1, 64)),
                                 dict(target=ModelShape(32, 1, 4, 3, 64)), dict(device="nonsense")])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        TrainConfig.tiny(**bad)


def test_cli_bad_argument_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--out", str(tmp_path / "x"), "--tiny", "--lr", "-1"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("lr must be in (0.0, 1.0], got -1.0")


def test_refuses_non_empty_output(tmp_path):
    (tmp_path / "keep.txt").write_text("x")
    with pytest.raises(OutputPathError):
        train_demo(TrainConfig.tiny(), tmp_path, progress=False)


def test_a_diverging_phase_raises_the_error_eagle_training_raises():
    """One error type for one failure: a non-finite loss stops the demo's phase as it stops EAGLE's training step."""
    import itertools

    import torch

    from specrt.errors import TrainingDivergedError
    from specrt.export.demo.train import _Progress, run_phase

    model = torch.nn.Linear(2, 2)
    nan_loss = lambda batch: model(batch).sum() * float("nan")  # noqa: E731
    with pytest.raises(TrainingDivergedError, match="tiny training diverged at step 1"):
        run_phase("tiny", model, 3, nan_loss, itertools.repeat(torch.ones(1, 2)), dict, TrainConfig.tiny(),
                  _Progress(False))
