"""The CLI: thin over the library; domain errors are one line, exit 1, never a traceback."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from specrt.cli import main
from specrt.export.graph.architectures import supported_model_types


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def assert_one_line_error(res, match: str) -> None:
    assert res.exit_code != 0
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    lines = [l for l in res.output.strip().splitlines() if l.startswith("Error")]
    assert len(lines) == 1 and match in lines[0], res.output


def test_help_teaches():
    for cmd in ([], ["export"], ["run"]):
        res = invoke(*cmd, "--help")
        assert res.exit_code == 0
    assert "Example" in invoke("run", "--help").output
    export_help = invoke("export", "--help").output
    assert all(arch in export_help for arch in supported_model_types())


def test_an_unsupported_feature_of_a_known_architecture_is_one_line(pairs, tmp_path):
    import shutil

    target = shutil.copytree(pairs["gemma3_text"][0], tmp_path / "bidirectional")
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "use_bidirectional_attention": True}))
    assert_one_line_error(invoke("export", str(target), "-o", str(tmp_path / "b")), "use_bidirectional_attention")
    assert not (tmp_path / "b").exists()


def test_export_and_run(pairs, tmp_path):
    t, d = pairs["qwen2"]
    res = invoke("export", str(t), "--draft", str(d), "-o", str(tmp_path / "b"), "--exporter", "torchscript")
    assert res.exit_code == 0, res.output
    assert "for cpu: this machine" in res.output and "int4 weights (HQQ) where they pass" in res.output
    assert "done" in res.output
    from specrt.bundle.manifest import load_manifest

    m = load_manifest(tmp_path / "b")  # what the gate let through on these random weights, said in the manifest
    bits = (m.target.quantization or {}).get("bits")
    assert m.chosen["for"] == "cpu" and m.chosen["quantize"] == (f"int{bits}" if bits else "float")
    assert "measured here: auto (draft) ran " in res.output and "x greedy" in res.output and "at T 0.7" in res.output
    res = invoke("run", "def f():", "--bundle", str(tmp_path / "b"), "--max-new-tokens", "12", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert len(out["token_ids"]) == 12 and out["stats"]["method"] == "draft"


def test_run_streams_and_prints_stats(close_bundle):
    res = invoke("run", "def fib(n):", "--bundle", str(close_bundle), "--max-new-tokens", "30", "--stats",
                 "--gamma", "auto", "--baseline")
    assert res.exit_code == 0, res.output
    for label in ("tokens per target pass", "alpha (mean sum min(p,q))", "predicted speedup", "c (draft pass",
                  "measured speedup", "host time per token"):
        assert label in res.output
    assert "device→host" not in res.output and "CUDA graphs" not in res.output  # a GPU's rows, hidden on a CPU


@pytest.mark.parametrize("args,match", [
    (["--temperature", "-1"], "temperature"), (["--top-p", "1.5"], "top_p"), (["--top-k", "-1"], "top_k"),
    (["--gamma", "0"], "gamma"), (["--gamma", "65"], "gamma"), (["--gamma", "x"], "--gamma"),
    (["--max-new-tokens", "100000"], "max context")])
def test_run_bad_values(close_bundle, args, match):
    assert_one_line_error(invoke("run", "hi", "--bundle", str(close_bundle), *args), match)


def test_run_missing_bundle_and_no_demo(tmp_path):
    assert_one_line_error(invoke("run", "hi", "--bundle", str(tmp_path / "nope")), "not found")


def test_export_errors(pairs, tmp_path):
    t, d = pairs["llama"]
    assert_one_line_error(invoke("export", str(tmp_path / "none"), "-o", str(tmp_path / "o")), "not found")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert_one_line_error(invoke("export", str(t), "--draft", str(d), "-o", str(tmp_path / "full")), "--force")
    assert_one_line_error(invoke("export", str(t), "-o", str(tmp_path / "o"), "--max-context", "4"),
                          "at least 16")


def test_run_tree_method_and_bad_shape(close_bundle):
    res = invoke("run", "def fib(n):", "--bundle", str(close_bundle), "--method", "tree", "--tree", "3,2,1",
                 "--max-new-tokens", "20", "--stats")
    assert res.exit_code == 0, res.output
    assert "tree nodes per pass" in res.output and "accepted per depth" in res.output
    assert_one_line_error(invoke("run", "x", "--bundle", str(close_bundle), "--method", "tree", "--tree", "3,x"),
                          "tree shape")


@pytest.mark.parametrize("args,match", [
    (["run", "hi", "--seed", "-1"], "seed must be an integer in [0, 2^63 - 1], got -1"),
    (["run", "hi", "--seed", str(2**63)], "seed must be"),
    (["run", "hi", "--temperature", "inf"], "temperature must be a number in [0, 2] (0: greedy), got inf"),
    (["run", "hi", "--temperature", "2.5"], "got 2.5"), (["run", "hi", "--temperature", "nan"], "got nan"),
    (["bench", "--temperature", "inf"], "temperature must be"),
    (["plan", "--alpha", "0.8", "--c", "0.1", "--temperature", "inf"], "temperature must be"),
    (["run", "hi", "--threads", "-2"], "threads must be an integer in [1, "),
    (["run", "hi", "--threads", "100000"], "got 100000"), (["serve", "--threads", "100000"], "got 100000"),
    (["bench", "--threads", "-2"], "got -2")])
def test_out_of_range_values_are_one_line_before_any_bundle_loads(tmp_path, args, match):
    """The Python API's rules (the server's for temperature and seed), checked as the command line is parsed:
    the missing bundle is never reached. Once: --seed -1 a traceback, --temperature inf accepted, --threads -2
    accepted and 100000 a hang."""
    if args[0] != "plan":
        args = [*args, "--bundle", str(tmp_path / "nope")]
    res = invoke(*args)
    assert_one_line_error(res, match)
    assert "Error: Invalid value for '--" in res.output


def test_a_temperature_too_small_for_float32_decodes_greedily():
    """Below 1e-30 a temperature is greedy (1/T overflowed float32: a traceback); 0 still means greedy, and the
    demo bundle's greedy tokens are the same."""
    runs = [invoke("run", "def fib(n):", "--max-new-tokens", "8", "--json", "--temperature", t, "--method", "draft")
            for t in ("0", "1e-40")]
    assert all(r.exit_code == 0 for r in runs), runs[-1].output
    assert json.loads(runs[0].output)["token_ids"] == json.loads(runs[1].output)["token_ids"]


def test_run_says_when_the_drafter_measured_slower_than_plain_decoding(close_bundle, monkeypatch):
    """--baseline measures plain decoding beside the run; below SLOWER the user is told to use --method none."""
    from specrt.cli import run as run_cmd

    args = ("run", "def fib(n):", "--bundle", str(close_bundle), "--max-new-tokens", "12", "--stats", "--baseline")
    monkeypatch.setattr(run_cmd, "SLOWER", 0.0)  # nothing measures below 0x: no note
    res = invoke(*args)
    assert res.exit_code == 0 and "--method none is faster" not in res.output, res.output
    monkeypatch.setattr(run_cmd, "SLOWER", 1e9)  # every measured speedup counts as a loss
    res = invoke(*args)
    assert res.exit_code == 0, res.output
    assert "note: draft ran" in res.output and "x plain decoding here" in res.output
    assert "--method none is faster" in res.output
