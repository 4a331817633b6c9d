"""ONNX Runtime prints nothing of its own: a node that fails while running raises, and specrt's error is the one
line a user reads (severity 3 printed ORT's coloured "[E:onnxruntime:...]" line before it). ORT logs to the
process's stderr, past pytest's capture: checked in a process of its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("onnxruntime")


def test_a_failing_session_run_logs_nothing_to_stderr():
    code = textwrap.dedent("""
        import numpy as np
        import specrt

        decoder = specrt.load(threads=1).decoders["target"]
        try:  # an id past the embedding: ONNX Runtime's Gather fails while running
            decoder.forward(decoder.new_cache(16), np.array([10**6]), np.array([0]), np.ones((1, 1, 1, 1), bool))
        except Exception as e:
            print("raised:", " ".join(str(e).split())[:200])
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "raised:" in res.stdout and "Gather" in res.stdout, res.stdout  # the failure itself still reaches specrt
    assert "onnxruntime:" not in res.stderr and "\x1b[" not in res.stderr, res.stderr
