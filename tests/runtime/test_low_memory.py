"""ONNX Runtime's low-memory CPU session: when it is chosen, and that it decodes the same tokens."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import specrt
from specrt.cli import main
from specrt.runtime.backends import onnxruntime as ortb
from specrt.runtime.backends.onnxruntime import (
    SESSION_COPIES,
    default_session_bytes,
    plan_memory,
)

GB = 10**9


def test_the_estimate_counts_the_copies_a_default_session_makes():
    # fp16 external data: the fp32 copy (2) + the transient of the mapped original (0.3)
    assert default_session_bytes(0, 10 * GB, "float16") == 23 * GB
    # fp32 external data: the prepacked copy (1) + 0.3; in the .onnx file the original stays resident (+1)
    assert default_session_bytes(0, 10 * GB, "float32") == 13 * GB
    assert default_session_bytes(1 * GB, 0, "float32") == 2 * GB
    assert default_session_bytes(1 * GB, 0, "float16") == 3 * GB
    assert set(SESSION_COPIES) == {"float16", "float32"}


@pytest.mark.parametrize("file,external,dtype,available,low", [
    (0, 8 * GB, "float16", 18 * GB, True),        # 18.4 GB would not fit
    (0, 7 * GB, "float16", 18 * GB, False),       # 16.1 GB fits
    (0, 13 * GB, "float32", 18 * GB, False),      # 16.9 GB fits: fp32 gets no second full copy
    (0, 15 * GB, "float32", 18 * GB, True),       # 19.5 GB
    (2 * GB, 0, "float32", 4 * GB, False),        # exactly the estimate: fits
    (2 * GB, 0, "float32", 4 * GB - 1, True),
    (0, 8 * GB, "float16", None, False),          # memory unknown (not Linux): the default
])
def test_auto_picks_the_low_memory_session_only_where_the_default_would_not_fit(file, external, dtype, available,
                                                                                low):
    plan = plan_memory(file, external, dtype, available, None)
    assert plan.low_memory is low
    if low:  # one line, with the figures it was decided on
        assert "\n" not in plan.reason and f"{(file + external) / GB:.1f} GB of {dtype}" in plan.reason
        assert f"{available / GB:.1f} GB available" in plan.reason
    else:
        assert plan.reason == ""


@pytest.mark.parametrize("forced", [True, False])
def test_either_session_can_be_forced(forced):
    for available in (1, 100 * GB, None):
        assert plan_memory(0, 7 * GB, "float16", available, forced).low_memory is forced
    assert plan_memory(1, 0, "float16", 100 * GB, True).reason == "low-memory session: asked for"


def test_available_memory_reads_meminfo():
    got = ortb.available_memory()
    assert got is None or got > 0


@pytest.fixture(scope="module")
def fp16_bundle(close_pair, tmp_path_factory):
    from specrt.export.exporter import ExportOptions, export_bundle

    out = tmp_path_factory.mktemp("fp16") / "bundle"
    export_bundle(str(close_pair[0]), str(close_pair[1]), out, ExportOptions(dtype="float16", max_context=256))
    return out


def test_low_memory_session_gives_the_same_greedy_tokens_on_fp16(fp16_bundle):
    default, low = (specrt.load(fp16_bundle, threads=1, low_memory=lm) for lm in (False, True))
    options = low.decoders["target"].session.get_session_options()
    assert not options.enable_cpu_mem_arena and options.get_session_config_entry("session.disable_prepacking") == "1"
    assert default.decoders["target"].session.get_session_options().enable_cpu_mem_arena
    assert default.memory_notes == [] and low.memory_notes == [f"{r}: low-memory session: asked for"
                                                               for r in ("target", "draft")]
    prompt = "def fib(n):\n    if n < 2:\n"
    for method in ("none", "draft"):
        a = default.generate(prompt, max_new_tokens=40, method=method).token_ids
        b = low.generate(prompt, max_new_tokens=40, method=method).token_ids
        assert a == b and len(a) == 40


def test_auto_says_why_it_chose_the_low_memory_session(fp16_bundle, monkeypatch):
    monkeypatch.setattr(ortb, "available_memory", lambda: 1000)  # less than any bundle needs
    res = CliRunner().invoke(main, ["run", "def f():", "--bundle", str(fp16_bundle), "--max-new-tokens", "4",
                                    "--method", "none", "--threads", "1"])
    assert res.exit_code == 0, res.output
    notes = [line for line in res.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 2 and all("would hold" in n and "0.0 GB available" in n for n in notes)
    off = CliRunner().invoke(main, ["run", "def f():", "--bundle", str(fp16_bundle), "--max-new-tokens", "4",
                                    "--method", "none", "--threads", "1", "--low-memory", "off"])
    assert off.exit_code == 0 and "note:" not in off.stderr
