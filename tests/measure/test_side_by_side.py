"""benchmarks/side-by-side/side_by_side.py reads llama.cpp's own timing and acceptance lines: checked against stand-in
binaries that print what llama-completion and llama-speculative-simple (llama.cpp in llama-cpp-python
0.3.36) print to stderr, copied from real runs."""

from __future__ import annotations

import importlib.util
import stat
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("side_by_side", ROOT / "benchmarks" / "side-by-side" / "side_by_side.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sbs = _load()

SPECULATIVE = """\
0.01.935.934 I encoded   19 tokens in    0.083 seconds, speed:  229.899 t/s
0.01.935.966 I decoded   65 tokens in    1.113 seconds, speed:   58.421 t/s
0.01.935.992 I 
0.01.936.018 I n_draft   = 3
0.01.936.043 I n_predict = 65
0.01.936.070 I n_drafted = 109
0.01.936.095 I n_accept  = 28
0.01.936.121 I accept    = 25.688%
"""

COMPLETION = """\
0.01.223.602 I common_perf_print: prompt eval time =      72.36 ms /    19 tokens (    3.81 ms per token,   262.57 tokens per second)
0.01.223.604 I common_perf_print:        eval time =     672.67 ms /    63 runs   (   10.68 ms per token,    93.66 tokens per second)
"""


def _binary(tmp_path: Path, name: str, stderr: str) -> Path:
    """A stand-in that records its arguments and prints ``stderr`` as llama.cpp does."""
    (tmp_path / f"{name}.txt").write_text(stderr)
    path = tmp_path / name
    path.write_text(f'#!/bin/sh\necho "$@" >> "{tmp_path}/{name}.args"\ncat "{tmp_path}/{name}.txt" >&2\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_speculative_round_times_encode_and_decode_and_counts_drafts(tmp_path: Path) -> None:
    binary = _binary(tmp_path, "llama-speculative-simple", SPECULATIVE)
    out = sbs.llama_spec_round(binary, "t.gguf", ["--spec-type", "draft-eagle3", "-md", "h.gguf"], ["a", "b"], 64, 2)
    assert out["speculative"] == pytest.approx(2 * 65 / (2 * (0.083 + 1.113)))
    assert out["acceptance"] == pytest.approx(28 / 109)
    calls = (tmp_path / "llama-speculative-simple.args").read_text().splitlines()
    assert len(calls) == 2 and all("--temp 0" in c and "-md h.gguf" in c and "-n 64" in c for c in calls)


def test_plain_round_counts_the_prompts_token(tmp_path: Path) -> None:
    binary = _binary(tmp_path, "llama-completion", COMPLETION)
    out = sbs.llama_round(binary, "t.gguf", ["a"], 64, 2)
    assert out["plain"] == pytest.approx(64 / (72.36 + 672.67) * 1000)


def test_a_run_without_its_lines_fails_loudly(tmp_path: Path) -> None:
    binary = _binary(tmp_path, "llama-speculative-simple", "error: unknown argument\n")
    with pytest.raises(KeyError):
        sbs.llama_spec_round(binary, "t.gguf", [], ["a"], 64, 2)


def test_labels_name_files_by_their_names(tmp_path: Path) -> None:
    head = tmp_path / "head.gguf"
    head.write_bytes(b"")
    assert sbs.short(f"--spec-type draft-eagle3 -md {head} --spec-draft-n-max 1") == \
        "--spec-type draft-eagle3 -md head.gguf --spec-draft-n-max 1"


def test_sampling_turns_llama_cpp_s_extra_samplers_off(tmp_path: Path) -> None:
    """At T > 0 llama.cpp would cut the distribution with its default top-k 40, top-p 0.95 and min-p 0.05; specrt's
    bench samples from the whole of it, so the comparison turns them off."""
    binary = _binary(tmp_path, "llama-completion", COMPLETION)
    sbs.llama_round(binary, "t.gguf", ["a"], 64, 2, temperature=0.7)
    call = (tmp_path / "llama-completion.args").read_text()
    assert "--temp 0.7 --top-k 0 --top-p 1 --min-p 0" in call
    assert sbs.sampling_args(0.0) == ["--temp", "0"]


def test_each_round_starts_specrt_s_methods_one_later(monkeypatch) -> None:
    """Within one `specrt bench` process methods run one after another: rotated per round, none always runs first
    on a machine whose speed drifts."""
    import json
    import subprocess

    orders = []

    def fake_run(cmd, **_):
        methods = cmd[cmd.index("--methods") + 1].split(",")
        orders.append(methods)
        out = Path(cmd[cmd.index("--json") + 1])
        out.write_text(json.dumps({"methods": {m: {"tokens_per_second": 10.0} for m in methods}}))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(sbs.subprocess, "run", fake_run)
    for r in range(4):
        assert sbs.specrt_round("b", "none,eagle-tree,auto", "p.json", True, 8, 2, [], shift=r) == {
            "none": 10.0, "eagle-tree": 10.0, "auto": 10.0}
    assert [o[0] for o in orders] == ["none", "eagle-tree", "auto", "none"]
