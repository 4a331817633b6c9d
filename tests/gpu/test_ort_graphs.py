"""ONNX Runtime CUDA's captured verify steps (specrt.runtime.backends.ort_graphs), on a CPU.

The decoder runs the static gqa graph with its cache and logits in stand-in device memory and its session
in a stand-in of ORT's CUDA-graph mode (tests/support/ort_graph_standin.py): every bucket's run binds the
same addresses, is warmed up, captured once and replayed after; prefills and passes wider than every
bucket run eagerly; a rejected draft needs no undo; the greedy tokens are those of the CPU's eager path
and of plain decoding. The graph is causal only (ORT's CUDA GroupQueryAttention refuses any attention_bias,
and so does the stand-in): chains run, trees are refused in one line. The real GPU's test is at the end,
skipped where no CUDA provider exists.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from support.fake_device import HostMemory, view
from support.ort_graph_standin import CudaGraphStandIn

import specrt
from specrt.bundle.manifest import load_manifest
from specrt.errors import BundleError, ConfigError
from specrt.runtime.backends import base
from specrt.runtime.backends.onnxruntime import OrtDecoder, OrtHeads
from specrt.runtime.backends import ort_graphs
from specrt.runtime.backends.ort_graphs import graph_problem, open_session
from specrt.runtime.masks import causal_mask, tree_mask

PROMPTS = ["def fib(n):", "import os\nimport sys\n"]
RUNS = [("none", {}), ("draft", {"gamma": 4})]  # a gqa-static bundle runs no trees


def captured(buckets=(1, 2, 4, 8, 16)):
    """A backend factory: the ONNX Runtime decoder in captured mode over stand-ins of CUDA memory and ORT."""

    def factory(bundle_dir, entry, threads=None, role="target", low_memory=None):
        memory = HostMemory()
        return OrtDecoder(bundle_dir, entry, threads=1, role=role, memory=memory, device_logits=True, graphs=True,
                          buckets=buckets,
                          wrap_session=lambda s: CudaGraphStandIn(s, memory, Path(bundle_dir) / entry.file))

    return factory


@pytest.fixture
def graph_backends(monkeypatch):
    for name, factory in {"ort-graphs": captured(), "ort-graphs-narrow": captured((1, 2))}.items():
        monkeypatch.setitem(base._BACKENDS, name, base.BackendInfo(name, lambda: True, factory, OrtHeads))


def _events(gen, role="target") -> list[tuple[int, str]]:
    return gen._models[role].decoder.session.events


@pytest.mark.parametrize("backend", ["ort-graphs", "ort-graphs-narrow"])
def test_captured_steps_give_the_tokens_of_the_cpu_and_of_plain_decoding(gqa_static_close_bundle, graph_backends,
                                                                         backend):
    reference = specrt.load(gqa_static_close_bundle, threads=1)  # the CPU's eager path over the same graphs
    gen = specrt.load(gqa_static_close_bundle, backend=backend)
    for prompt in PROMPTS:
        plain = reference.generate(prompt, max_new_tokens=24, method="none").token_ids
        for method, extra in RUNS:
            want = reference.generate(prompt, max_new_tokens=24, method=method, **extra).token_ids
            got = gen.generate(prompt, max_new_tokens=24, method=method, **extra)
            assert got.token_ids == want == plain, (prompt, method)
    for role in ("target", "draft"):
        decoder, events = gen._models[role].decoder, _events(gen, role)
        kinds = {kind for _, kind in events}
        assert {"eager", "warmup", "capture", "replay"} <= kinds, role
        # a graph id is warmed up, captured on its second run, replayed on every later one
        ids = {gid for gid, _ in events if gid > 0}
        for gid in ids:
            runs = [kind for g, kind in events if g == gid]
            assert runs == ["warmup", "capture"][:len(runs)] + ["replay"] * (len(runs) - 2), (role, gid)
        # one graph id per bucket width, each with the shapes of its bucket
        widths = sorted(decoder.session.shapes[gid][1] for gid in ids if gid in decoder.session.shapes)
        assert len(widths) == len(set(widths)) and set(widths) <= set(decoder.steps.buckets)
        assert decoder.graph_status.startswith("CUDA graphs: buckets")
    prefills = [kind for _, kind in _events(gen)].count("eager")
    if backend == "ort-graphs":  # chains of 5 fit a bucket: only the prefills ran eagerly
        assert prefills == len(PROMPTS) * len(RUNS)
    else:  # chains of 5 leave buckets (1, 2): they ran eagerly, between replays
        assert prefills > len(PROMPTS) * len(RUNS)


def test_a_bucket_binds_its_buffers_once_and_device_memory_only(gqa_static_close_bundle, graph_backends, capsys):
    from specrt.measure.report import print_stats

    gen = specrt.load(gqa_static_close_bundle, backend="ort-graphs")
    out = gen.generate(PROMPTS[0], max_new_tokens=16, method="draft", gamma=3)
    decoder = gen._models["target"].decoder
    print_stats(out.stats, decoder.provider, graphs=decoder.graph_status)  # what --stats shows
    shown = capsys.readouterr().err
    assert "CUDA graphs" in shown and "yes" in shown and "captured passes" in shown
    steps = dict(decoder.steps.steps)
    bindings = {key: dict(step.binding.bound) for key, step in steps.items()}
    gen.generate(PROMPTS[1], max_new_tokens=16, method="draft", gamma=3)
    # the same cache: no new bucket for widths seen before, and none was bound again
    assert {k: dict(s.binding.bound) for k, s in decoder.steps.steps.items() if k in steps} == bindings
    cache = gen._models["target"].cache
    for step in decoder.steps.steps.values():
        for (name, output), (_, _, shape, ptr) in step.binding.bound.items():
            if name.startswith(("past_key", "present_key")):
                layer = int(name.rsplit(".", 1)[1])
                assert ptr == cache.key_ptrs[layer] and shape[2] == cache.max_context
    # no step binds a mask: the op's causality is a plain or chain step's mask
    assert all(name != "attention_mask" for step in decoder.steps.steps.values() for name, _ in step.binding.bound)


def test_trees_are_refused_in_one_line_and_auto_runs_a_chain(gqa_static_close_bundle, graph_backends):
    gen = specrt.load(gqa_static_close_bundle, backend="ort-graphs")
    for method in ("tree", "medusa"):
        with pytest.raises(ConfigError, match="causal only.*--graph gqa") as e:
            gen.generate(PROMPTS[0], max_new_tokens=8, method=method)
        assert "\n" not in str(e.value) and repr(method) in str(e.value)
    assert gen.default_method == "draft"
    assert gen.generate(PROMPTS[0], max_new_tokens=8, gamma=3).stats.method == "draft"
    # the backend's own check, below the generator's: a tree's mask on the causal-only graph
    decoder, cache = gen._models["target"].decoder, gen._models["target"].cache
    cache.truncate(0)
    decoder.forward(cache, np.arange(3, 8), np.arange(5), causal_mask(5, 0))
    cache.length = 5
    mask, depth = tree_mask((-1, 0, 0), 5)
    with pytest.raises(ConfigError, match="gqa-static graph, causal only.*--graph gqa"):
        decoder.forward(cache, np.array([4, 5, 6]), 5 + depth, mask)


def test_the_stand_in_refuses_attention_bias_as_cuda_does(gqa_close_bundle):
    """The gqa graph feeds its mask to GroupQueryAttention as attention_bias: ORT's CUDA kernel fails its every
    run, eager or captured, and so does the stand-in (a static graph that regains a bias fails here too)."""
    entry = load_manifest(gqa_close_bundle).target
    memory = HostMemory()
    dec = OrtDecoder(gqa_close_bundle, entry, threads=1, memory=memory, graphs=True,
                     wrap_session=lambda s: CudaGraphStandIn(s, memory, gqa_close_bundle / entry.file))
    with pytest.raises(BundleError, match="attention_bias is not supported in GroupQueryAttention cuda kernel"):
        dec.forward(dec.new_cache(16), np.arange(3, 6), np.arange(3), causal_mask(3, 0))


def _rows(cache, length: int) -> list[np.ndarray]:
    shape = (cache.planes // (2 * cache.num_layers), cache.max_context, cache.row_bytes)
    return [view(p, shape, np.uint8)[:, :length].copy() for p in (*cache.key_ptrs, *cache.value_ptrs)]


def test_cache_rows_after_a_rejection_equal_a_fresh_run_s(gqa_static_close_bundle):
    """A captured 4-row chain of which one row is accepted, then the next pass: the cache's valid rows are
    those of a cache fed only the accepted tokens, eagerly."""
    entry = load_manifest(gqa_static_close_bundle).target
    memory = HostMemory()
    dec = OrtDecoder(gqa_static_close_bundle, entry, threads=1, memory=memory, graphs=True,
                     wrap_session=lambda s: CudaGraphStandIn(s, memory, gqa_static_close_bundle / entry.file))
    fresh = OrtDecoder(gqa_static_close_bundle, entry, threads=1, memory=HostMemory(), graphs=False)
    prompt = np.arange(3, 10)
    caches = [dec.new_cache(32), fresh.new_cache(32)]
    for d, cache in zip((dec, fresh), caches):
        d.forward(cache, prompt, np.arange(7), causal_mask(7, 0))
        cache.length = 7
    dec.forward(caches[0], np.array([5, 6, 7, 8]), np.arange(7, 11), causal_mask(4, 7))  # bucket 4, rows 7..10
    caches[0].length = 8  # one accepted: rows 8..10 are left behind
    out = dec.forward(caches[0], np.array([9, 4]), np.arange(8, 10), causal_mask(2, 8)).hidden.copy()
    caches[0].length = 10
    fresh.forward(caches[1], np.array([5]), np.array([7]), causal_mask(1, 7))
    caches[1].length = 8
    want = fresh.forward(caches[1], np.array([9, 4]), np.arange(8, 10), causal_mask(2, 8)).hidden
    caches[1].length = 10
    for a, b in zip(_rows(caches[0], 10), _rows(caches[1], 10)):
        np.testing.assert_allclose(a.view(np.float32), b.view(np.float32), atol=1e-5)
    np.testing.assert_allclose(out, want, atol=1e-4)
    assert [kind for _, kind in dec.session.events] == ["eager", "warmup", "warmup"]  # buckets 4 and 2


def test_eagle_heads_and_targets_replay_their_chains(eagle_static_bundle, graph_backends):
    """The head's chain passes are causal (catch-up and one-row steps), so its gqa-static graph runs them; its
    dynamic tree (expansion masks, a tree verify) is refused, and auto runs the chain."""
    reference = specrt.load(eagle_static_bundle, threads=1)
    gen = specrt.load(eagle_static_bundle, backend="ort-graphs")
    assert gen.default_method == "eagle"
    for kwargs in (dict(method="eagle", gamma=3), dict(method="auto", gamma=2)):
        want = reference.generate(PROMPTS[0], max_new_tokens=20, **kwargs).token_ids
        assert gen.generate(PROMPTS[0], max_new_tokens=20, **kwargs).token_ids == want, kwargs
    for role in ("target", "eagle"):
        assert "replay" in {kind for _, kind in _events(gen, role)}, role
    with pytest.raises(ConfigError, match="'eagle-tree' verifies token trees"):
        gen.generate(PROMPTS[0], max_new_tokens=4, method="eagle-tree")


def test_where_capture_is_impossible_one_line_says_why(gqa_close_bundle, gqa_static_close_bundle, capsys,
                                                      monkeypatch):
    gqa = load_manifest(gqa_close_bundle).target
    static = load_manifest(gqa_static_close_bundle).target
    assert "--graph gqa-static" in graph_problem("1.22.0", gqa)
    assert "gpu_graph_id needs 1.18+" in graph_problem("1.17.3", static)
    assert "fp16/bf16 only" in graph_problem("1.22.0", static)  # the tiny bundles are float32
    assert graph_problem("1.22.0", static, cuda=False) is None  # the stand-in's kernels are the CPU's
    assert graph_problem("1.22.0", dataclasses.replace(static, dtype="float16")) is None

    def refused(cuda_graph: bool):
        if cuda_graph:
            raise BundleError("cannot load target.onnx: This session cannot use the graph capture "
                                            "feature as requested by the user as all compute graph nodes have not "
                                            "been partitioned to the CUDAExecutionProvider")
        return "plain session"

    session, why = open_session(refused, True, None)
    assert session == "plain session" and why.startswith("ONNX Runtime refused its CUDA-graph mode (This session")
    monkeypatch.setattr(ort_graphs, "_said", [])  # as in a fresh process
    dec = OrtDecoder(gqa_close_bundle, gqa, threads=1, memory=HostMemory(), graphs=True)  # a gqa graph: eager
    OrtDecoder(gqa_close_bundle, gqa, threads=1, memory=HostMemory(), graphs=True)
    lines = capsys.readouterr().err.strip().splitlines()
    assert dec.steps is None and len(lines) == 1 and "CUDA graphs off" in lines[0] and "gqa-static" in lines[0]
    assert dec.graph_status == lines[0].removeprefix("specrt: ")
    cache = dec.new_cache(16)
    assert dec.forward(cache, np.arange(3, 6), np.arange(3), causal_mask(3, 0)).device_logits is None


def _ort_has_cuda() -> bool:
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


@pytest.mark.skipif(not _ort_has_cuda(), reason="needs onnxruntime-gpu with its CUDA provider and a GPU")
def test_onnxruntime_cuda_replays_the_verify_step(close_pair, tmp_path):
    """On a real GPU: an fp16 static bundle's steps are captured per bucket, greedy tokens equal plain decoding's."""
    from specrt.export.exporter import ExportOptions, export_bundle

    export_bundle(str(close_pair[0]), str(close_pair[1]), tmp_path / "b", ExportOptions(graph="gqa-static",
                                                                                      dtype="float16"))
    gen = specrt.load(tmp_path / "b")
    decoder = gen._models["target"].decoder
    assert decoder.provider == "CUDAExecutionProvider" and decoder.steps is not None, decoder.graph_status
    want = gen.generate(PROMPTS[0], max_new_tokens=16, method="none").token_ids
    for method, extra in RUNS[1:]:
        assert gen.generate(PROMPTS[0], max_new_tokens=16, method=method, **extra).token_ids == want, method
    assert decoder.steps.replays > 0
