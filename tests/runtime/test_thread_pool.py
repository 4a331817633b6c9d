"""One ONNX Runtime pool for all of a bundle's models (``shared_threads``, the CLI's default): process-wide,
so every check runs in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("onnxruntime")


def _env() -> dict[str, str]:
    """This environment without the test run's SPECRT_THREAD_POOL (conftest.py): the CLI's own default."""
    return {k: v for k, v in os.environ.items() if k != "SPECRT_THREAD_POOL"}


def _python(code: str) -> dict:
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=_env(),
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _cli_tokens(*args: str) -> list[int]:
    res = subprocess.run([sys.executable, "-m", "specrt.cli", "run", "def fib(n):", "--max-new-tokens", "24",
                          "--threads", "2", "--json", *args], capture_output=True, text=True, env=_env(), timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)["token_ids"]


def test_the_cli_shares_one_pool_and_decodes_the_same_tokens():
    shared = _cli_tokens("--method", "draft")
    assert shared == _cli_tokens("--method", "none")
    assert shared == _cli_tokens("--method", "none", "--thread-pool", "per-model")


def test_a_shared_pool_takes_every_session_of_the_process():
    out = _python("""
        import json
        import onnxruntime as ort
        import specrt
        from specrt import demo
        from specrt.runtime.backends import onnxruntime as backend

        gen = specrt.load(threads=2, shared_threads=True)
        ids = {m: gen.generate("def add(a, b):", max_new_tokens=16, method=m).token_ids for m in ("none", "draft")}
        graph = str(demo.bundle_path() / gen.manifest.target.file)
        try:  # ONNX Runtime's rule, which is why sharing is the process owner's choice
            ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
            own_pool = "accepted"
        except Exception as e:
            own_pool = str(e)
        ort.InferenceSession(graph, backend.session_options(), providers=["CPUExecutionProvider"])
        print(json.dumps({"width": backend.share_threads(4), "same": ids["none"] == ids["draft"],
                          "n": len(ids["none"]), "own_pool": own_pool}))
    """)
    assert out["width"] == 2  # the first width stays
    assert out["same"] and out["n"] == 16
    assert "use_per_session_threads must be false" in out["own_pool"]


def test_a_pool_made_by_other_code_is_used_not_fought():
    out = _python("""
        import json
        import onnxruntime as ort
        ort.set_global_thread_pool_sizes(1, 1)  # the app's own choice, before specrt
        import specrt
        from specrt.runtime.backends import onnxruntime as backend

        gen = specrt.load(threads=2)  # asks for pools of its own: ONNX Runtime no longer allows them
        n = len(gen.generate("def add(a, b):", max_new_tokens=8, method="draft").token_ids)
        print(json.dumps({"n": n, "width": backend.share_threads(2)}))
    """)
    assert out == {"n": 8, "width": 0}  # 0: made elsewhere, width unknown
