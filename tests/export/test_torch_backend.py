"""The PyTorch backend and the CUDA-graph bookkeeping: the static, capturable path is checked on the CPU;
the capture itself runs where CUDA exists."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specrt
from specrt.bundle.manifest import load_manifest
from specrt.errors import ConfigError
from specrt.export.torch_backend import TorchDecoder, static_step
from specrt.runtime.backends.buckets import choose_bucket, pad_to, static_mask
from specrt.runtime.masks import causal_mask, speculation_mask


def test_bucket_choice_and_padding():
    assert choose_bucket(1) == 1 and choose_bucket(3) == 4 and choose_bucket(5) == 8 and choose_bucket(64) == 64
    assert choose_bucket(65) is None and choose_bucket(3, (2, 6)) == 6
    assert pad_to(np.array([5, 6]), 4, fill=9).tolist() == [5, 6, 9, 9]


def test_static_mask_against_reference():
    mask, _ = speculation_mask(3, 1, [-1, -1])  # past 3, one context token, two children
    out = static_mask(mask, past_len=3, max_context=6, bucket=4)[0, 0]
    assert out.shape == (4, 10)
    # real rows: past columns 0..2 as given, 3..5 hidden; new columns 6..8 as given
    assert np.array_equal(out[:3, :3], mask[0, 0, :, :3]) and not out[:3, 3:6].any()
    assert np.array_equal(out[:3, 6:9], mask[0, 0, :, 3:])
    assert not out[:3, 9].any()  # nobody sees the padding row
    assert out[3].tolist() == [False] * 9 + [True]  # the padding row sees itself only


@pytest.fixture(scope="module")
def torch_target(close_bundle):
    m = load_manifest(close_bundle)
    return TorchDecoder(close_bundle, m.target, threads=1, use_graphs=False), m


def test_static_capturable_step_equals_eager_forward(torch_target):
    dec, m = torch_target
    ctx = np.array([0, 17, 42, 99, 7, 3])
    eager_cache = dec.new_cache(32)
    dec.forward(eager_cache, ctx, np.arange(6), causal_mask(6, 0))
    eager_cache.advance(6)
    tree = [-1, -1, 0]
    mask, pos = speculation_mask(6, 1, tree)
    new = np.array([5, 11, 12, 13])
    ref = dec.forward(eager_cache, new, pos, mask).logits

    static_cache = dec.new_cache(32)
    dec.forward(static_cache, ctx, np.arange(6), causal_mask(6, 0))
    static_cache.advance(6)
    bucket = choose_bucket(len(new))
    t = lambda a, dt: torch.as_tensor(a, dtype=dt)  # noqa: E731
    with torch.inference_mode():
        logits, _ = static_step(dec.wrapper, static_cache, t(pad_to(new, bucket), torch.long)[None],
                                t(pad_to(pos, bucket, fill=6), torch.long)[None],
                                t(static_mask(mask, 6, 32, bucket), torch.bool), torch.arange(6, 6 + bucket))
    assert np.abs(logits[0, :4].numpy() - ref).max() < 1e-5
    for a, b in zip(static_cache.buffers(), eager_cache.buffers()):
        assert torch.allclose(a[:, :10], b[:, :10], atol=1e-6)


def test_torch_backend_matches_onnxruntime(close_bundle):
    ort_gen = specrt.load(close_bundle, threads=1)
    torch_gen = specrt.load(close_bundle, backend="torch", threads=1)
    assert torch_gen.decoders["target"].provider.startswith("torch-")
    for method in ("none", "draft", "tree"):
        assert (torch_gen.generate("def fib(n):", max_new_tokens=24, method=method).token_ids
                == ort_gen.generate("def fib(n):", max_new_tokens=24, method=method).token_ids)


def test_auto_never_picks_torch_and_unknown_backends_fail(close_bundle):
    assert specrt.load(close_bundle, threads=1).decoders["target"].provider == "CPUExecutionProvider"
    with pytest.raises(ConfigError, match="unknown backend"):
        specrt.load(close_bundle, backend="tpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need an NVIDIA GPU; none is visible")
def test_cuda_graph_replay_gives_the_same_tokens(close_bundle):
    m = load_manifest(close_bundle)
    graphed = TorchDecoder(close_bundle, m.target, use_graphs=True)
    eager = TorchDecoder(close_bundle, m.target, use_graphs=False, device="cuda")
    gen_g = specrt.load(close_bundle, backend="torch")
    gen_g.decoders["target"] = graphed
    gen_g._models["target"].decoder = graphed
    gen_g._models["target"].cache = graphed.new_cache(m.max_context)
    gen_e = specrt.load(close_bundle, backend="torch")
    gen_e.decoders["target"] = eager
    gen_e._models["target"].decoder = eager
    gen_e._models["target"].cache = eager.new_cache(m.max_context)
    for method in ("none", "draft", "tree"):
        a = gen_g.generate("def fib(n):", max_new_tokens=40, method=method).token_ids
        b = gen_e.generate("def fib(n):", max_new_tokens=40, method=method).token_ids
        assert a == b
    assert graphed.graphs  # something was captured and replayed


def _torch_generator(bundle, **decoder_options):
    gen = specrt.load(bundle, backend="torch", threads=1)
    if gen.manifest.eagle is not None:
        gen._load_eagle("eagle")  # made on first use otherwise: here now, to be replaced like the others
    for role, entry in gen.manifest.models.items():
        dec = TorchDecoder(bundle, entry, threads=1, **{"use_graphs": False, **decoder_options})
        gen.decoders[role] = dec
        gen._models[role].decoder = dec
        gen._models[role].cache = dec.new_cache(gen.manifest.max_context)
    return gen


def test_logits_left_on_the_device_give_the_same_tokens(close_bundle):
    """What a GPU run does by default (argmax / top-k / log-sum-exp on the device, rows copied up on
    demand), here on CPU tensors: the tokens are those of the copy-everything path, seed for seed."""
    host, device = _torch_generator(close_bundle, device_logits=False), _torch_generator(close_bundle, device_logits=True)
    assert device.decoders["target"].forward(device._models["target"].cache, np.array([1, 2]), np.arange(2),
                                             causal_mask(2, 0)).logits is None
    settings = [dict(), dict(temperature=0.8, top_p=0.9), dict(temperature=1.0, top_k=20),
                dict(temperature=1.0, top_k=8, top_p=0.8), dict(temperature=1.0)]
    for method in ("none", "draft", "tree"):
        for kw in settings:
            for seed in range(2):
                a = host.generate("def fib(n):", max_new_tokens=20, method=method, seed=seed, **kw).token_ids
                b = device.generate("def fib(n):", max_new_tokens=20, method=method, seed=seed, **kw).token_ids
                assert a == b, (method, kw, seed)


class HostGraph:
    """torch.cuda.CUDAGraph's contract on the host: capture records the step without running it;
    each replay runs it and refills the same output tensors."""

    def __init__(self, step, outputs) -> None:
        self.step, self.outputs = step, outputs

    def replay(self) -> None:
        for out, value in zip(self.outputs, self.step()):
            out.copy_(value)


def host_capture(step):
    """What :func:`specrt.export.torch_backend.cuda_capture` does, on the host: two warm-up runs,
    then a capture that runs nothing."""
    for _ in range(2):
        shapes = step()
    graph = HostGraph(step, tuple(torch.empty_like(t) for t in shapes))
    return graph, graph.outputs


def test_graph_capture_never_touches_the_valid_cache_rows(close_bundle, monkeypatch):
    """Graphs are captured on first use of each width: after a prefill, mid-generation, after a
    rejection. Their warm-up runs must write only rows past the valid length; every valid row stays
    bit-identical, and the graphed decoder gives the eager one's tokens."""
    from specrt.export import torch_backend

    kept = []
    init = torch_backend._Graph.__init__

    def spy(self, wrapper, cache, bucket, *rest):
        before = [b[:, :cache.length].clone() for b in cache.buffers()]
        init(self, wrapper, cache, bucket, *rest)
        kept.append((cache.length, all(torch.equal(a, b[:, :cache.length]) for a, b in zip(before, cache.buffers()))))

    monkeypatch.setattr(torch_backend._Graph, "__init__", spy)
    graphed = _torch_generator(close_bundle, use_graphs=True, capture=host_capture, device_logits=False)
    eager = _torch_generator(close_bundle, device_logits=False)
    for method in ("none", "draft", "tree"):
        for prompt in ("def fib(n):", "import os\nimport sys\n"):
            assert (graphed.generate(prompt, max_new_tokens=24, method=method).token_ids
                    == eager.generate(prompt, max_new_tokens=24, method=method).token_ids), (method, prompt)
    assert len(kept) >= 4 and any(length > 0 for length, _ in kept)  # captures after prefills, not only at 0
    assert all(same for _, same in kept), kept


def test_every_tensor_of_a_forward_is_made_on_the_model_device(close_bundle):
    """PyTorch's meta device refuses to mix devices as CUDA does: a tensor the forward creates on the
    CPU (the additive mask once was) fails here, on a machine without a GPU."""
    from specrt.export.graph.architectures import DecoderWrapper, adapter_for
    from specrt.export.loading import load_causal_lm
    from specrt.export.torch_backend import TorchKVCache

    m = load_manifest(close_bundle)
    meta, d = torch.device("meta"), m.target.dims
    wrapper = DecoderWrapper(adapter_for(m.target.architecture)(load_causal_lm(m.target.source, m.target.dtype).to(meta)))
    cache = TorchKVCache(d.num_layers, 32, d.num_kv_heads, d.head_dim, torch.float32, meta)
    ids, pos = torch.zeros(1, 4, dtype=torch.long, device=meta), torch.arange(4, device=meta)[None]
    with torch.inference_mode():
        logits, hidden = static_step(wrapper, cache, ids, pos, torch.ones(1, 1, 4, 36, dtype=torch.bool, device=meta),
                                     torch.arange(4, device=meta))
        eager = wrapper(ids, pos, torch.ones(1, 1, 4, 4, dtype=torch.bool, device=meta),
                        tuple(b[:, :0] for b in cache.buffers()))
    assert logits.device == meta and logits.shape == (1, 4, d.vocab_size) and eager[0].shape == logits.shape
    cache.length = 6
    cache.compact(2, [0, 3])
    assert cache.length == 4


def test_eagle_heads_on_the_torch_backend_give_the_tokens_of_onnxruntime(eagle_bundle):
    """The target's taps from the Hugging Face model, the head from its checkpoint in the graph's row order:
    eagle and eagle-tree give ONNX Runtime's tokens, greedy and sampled, eagerly and through captured steps."""
    reference = specrt.load(eagle_bundle, threads=1)
    runs = [dict(method="eagle", gamma=3), dict(method="eagle-tree", eagle_tree="2,3,5"),
            dict(method="eagle", gamma=2, temperature=0.8, top_k=20, seed=1)]
    for options in (dict(), dict(use_graphs=True, capture=host_capture)):
        gen = _torch_generator(eagle_bundle, device_logits=False, **options)
        for kwargs in runs:
            want = reference.generate("def fib(n):", max_new_tokens=16, **kwargs).token_ids
            assert gen.generate("def fib(n):", max_new_tokens=16, **kwargs).token_ids == want, (options, kwargs)
        if options:
            assert gen.decoders["eagle"].graphs and gen.decoders["target"].graphs


def test_bench_runs_on_the_backend_it_is_given(eagle_bundle, tmp_path):
    """`specrt bench --backend torch`: the same methods measured on PyTorch (what a GPU machine without
    TensorRT runs), greedy output still plain decoding's; an unknown backend is one line and exit 1."""
    import json

    from click.testing import CliRunner

    from specrt.cli import main

    out = tmp_path / "bench.json"
    res = CliRunner().invoke(main, ["bench", "--bundle", str(eagle_bundle), "--backend", "torch", "--methods",
                                    "none,eagle", "--max-new-tokens", "6", "--repeats", "1", "--threads", "1",
                                    "--prompts", str(_one_prompt(tmp_path)), "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["config"]["provider"] == "torch-cpu" and data["methods"]["eagle"]["greedy_matches_none"]
    res = CliRunner().invoke(main, ["bench", "--bundle", str(eagle_bundle), "--backend", "tpu", "--methods", "none"])
    assert res.exit_code == 1 and "unknown backend" in res.output


def _one_prompt(folder):
    path = folder / "prompts.json"
    path.write_text('["def fib(n):"]')
    return path
