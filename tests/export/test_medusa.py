"""Medusa heads: training, tree choice, export, exact greedy decoding, and the lossy typical rule in the loop
(the rule itself: tests/runtime/test_acceptance.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import specrt
from specrt.bundle.manifest import load_manifest
from specrt.cli import main
from specrt.errors import ConfigError
from specrt.runtime.medusa import choose_tree, tree_from_paths


def test_choose_tree_is_best_first_and_prefix_closed():
    acc = [[0.6, 0.2, 0.1], [0.5, 0.3, 0.1]]
    paths, expected = choose_tree(acc, 4)
    # scores: (0)=.6 (0,0)=.3 (1)=.2 (0,1)=.18 (2)=.1 (1,0)=.1 ...
    assert paths == [(0,), (1,), (0, 0), (0, 1)]
    assert expected == pytest.approx(0.6 + 0.3 + 0.2 + 0.18)
    for p in paths:
        assert len(p) == 1 or p[:-1] in paths
    with pytest.raises(ConfigError):
        choose_tree(acc, 0)


def test_tree_from_paths():
    cand = np.array([[7, 8, 9], [4, 5, 6]])
    tree = tree_from_paths([(0,), (1,), (0, 0), (0, 2)], cand, max_depth=2)
    assert tree.tokens == [7, 8, 4, 6] and tree.parents == [-1, -1, 0, 0]
    shallow = tree_from_paths([(0,), (1,), (0, 0)], cand, max_depth=1)
    assert shallow.tokens == [7, 8] and shallow.parents == [-1, -1]


def test_training_reduces_loss_and_records_accuracies(medusa_bundle):
    record = json.loads((medusa_bundle.parent / "heads" / "medusa_config.json").read_text())
    assert record["calibration_loss"] < record["calibration_loss_init"]
    assert len(record["accuracies"]) == 3 and all(len(a) == 6 for a in record["accuracies"])
    m = load_manifest(medusa_bundle)
    assert m.medusa is not None and m.medusa.num_heads == 3 and len(m.medusa.tree) == 12
    assert (medusa_bundle / "medusa.onnx").is_file()


def test_greedy_medusa_equals_plain_decoding(medusa_bundle):
    gen = specrt.load(medusa_bundle, threads=1)
    for prompt in ("def fib(n):", "import os\n", "class Point:"):
        plain = gen.generate(prompt, max_new_tokens=30, method="none")
        med = gen.generate(prompt, max_new_tokens=30, method="medusa")
        assert med.token_ids == plain.token_ids
        assert med.stats.draft_passes == 0 and med.stats.mean_gamma > 1


def test_medusa_sampling_needs_explicit_lossy_opt_in(medusa_bundle, llama_bundle):
    gen = specrt.load(medusa_bundle, threads=1)
    with pytest.raises(ConfigError, match="exact only for greedy"):
        gen.generate("x", method="medusa", temperature=0.8)
    out = gen.generate("def f():", method="medusa", temperature=0.8, acceptance="typical", max_new_tokens=20)
    assert len(out.token_ids) == 20
    with pytest.raises(ConfigError, match="medusa only"):
        gen.generate("x", method="draft", temperature=0.8, acceptance="typical")
    with pytest.raises(ConfigError, match="needs Medusa heads"):
        specrt.load(llama_bundle, threads=1).generate("x", method="medusa")


def test_cli_labels_typical_acceptance_lossy(medusa_bundle):
    res = CliRunner().invoke(main, ["run", "def f():", "--bundle", str(medusa_bundle), "--method", "medusa",
                                    "--temperature", "0.7", "--acceptance", "typical", "--max-new-tokens", "10",
                                    "--stats"])
    assert res.exit_code == 0, res.output
    assert "LOSSY" in res.output
    assert "LOSSY" in CliRunner().invoke(main, ["run", "--help"]).output


def test_medusa_train_cli_errors(pairs, tmp_path):
    target, _ = pairs["llama"]
    res = CliRunner().invoke(main, ["medusa", "train", str(target), "--data", str(tmp_path), "-o",
                                    str(tmp_path / "h"), "--steps", "1"])
    assert res.exit_code == 1 and "holds no text" in res.output
    res = CliRunner().invoke(main, ["medusa", "train", str(target), "--data", str(tmp_path), "-o",
                                    str(tmp_path / "h"), "--heads", "0"])
    assert res.exit_code == 1 and "num_heads must be >= 1" in res.output


def test_fp16_heads_on_an_fp32_bundle(medusa_bundle, pairs, tmp_path):
    """--medusa-dtype fp16: the heads at half the bytes on fp32 models; their proposals differ at most by
    rounding and the target still verifies them, so greedy decoding is unchanged."""
    import onnx

    target, draft = pairs["llama"]
    res = CliRunner().invoke(main, ["export", str(target), "--draft", str(draft), "-o", str(tmp_path / "b"),
                                    "--exporter", "torchscript", "--medusa", str(medusa_bundle.parent / "heads"),
                                    "--medusa-nodes", "12", "--medusa-dtype", "fp16", "--quantize", "none",
                                    "--no-measure"])
    assert res.exit_code == 0, res.output
    heads = onnx.load(str(tmp_path / "b" / "medusa.onnx"))
    assert heads.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    assert load_manifest(tmp_path / "b").target.dtype == "float32"
    gen = specrt.load(tmp_path / "b", threads=1)
    for prompt in ("def fib(n):", "class Point:"):
        assert (gen.generate(prompt, max_new_tokens=30, method="medusa").token_ids
                == gen.generate(prompt, max_new_tokens=30, method="none").token_ids)


def test_parity_allows_a_near_tie_to_swap_and_nothing_else():
    """fp16 heads may order two candidates PyTorch scores 0.01 apart either way; a leader PyTorch ranks far lower,
    or not at all, is a real difference."""
    from specrt.export.medusa import _leaders_agree

    ref_ids, ref_lp = np.array([[[[3, 5, 7]]]]), np.array([[[[-1.0, -1.01, -3.0]]]])
    assert _leaders_agree(np.array([[[[3, 5, 7]]]]), ref_ids, ref_lp, 0.05)
    assert _leaders_agree(np.array([[[[5, 3, 7]]]]), ref_ids, ref_lp, 0.05)  # the near-tie, swapped
    assert not _leaders_agree(np.array([[[[7, 3, 5]]]]), ref_ids, ref_lp, 0.05)  # 2 nats below
    assert not _leaders_agree(np.array([[[[9, 3, 5]]]]), ref_ids, ref_lp, 0.05)  # outside PyTorch's top-k
