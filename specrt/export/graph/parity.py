"""ONNX Runtime vs the Hugging Face model itself, on the five ways the runtime calls a decoder (four on a causal-only
graph, gqa-static, which verifies no trees).

The reference is always HF's own full forward over the whole sequence (no cache), computed in fp32
whatever the export dtype (an fp16 model's weights are upcast one module at a time), so the check
covers the wrapper, the tracer and ONNX Runtime together, and a cache bug cannot hide in both sides.
The reference runs first and keeps only its logits, so the model can be freed before ONNX Runtime
loads the exported graph: the two never sit in memory together.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from ...bundle import contract as C
from ...bundle.parity import (
    PARITY_TOLERANCE,
    ParityTolerance,
    compare_logits,
    row_scale,
    within,
)
from ...errors import ParityError
from ...runtime.backends.onnxruntime import low_memory_options, session_options
from ...runtime.masks import causal_mask, is_causal, tree_mask

PROMPT_LEN = 7
CHAIN_LEN = 5
# A 6-node tree: root with two children, the first child with one child, the second with two.
TREE_PARENTS = (-1, 0, 0, 1, 2, 2)
FAR_LEN = 12  # a prefill that ends at the last position the bundle allows: rope scaling shows there


def _path(parents: tuple[int, ...], node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


@contextlib.contextmanager
def float32_compute(model: torch.nn.Module) -> Iterator[None]:
    """Run ``model`` in fp32 whatever its weights' dtype, holding one module's fp32 copy at a time.

    Each module's own low-precision parameters and buffers (not its children's) are cast up just before
    its forward and back to their own dtype after (fp16 → fp32 → fp16 is exact); fp32 tensors beside them
    are left alone, and tied weights stay tied because only ``.data`` is swapped.
    """
    owned = {m: [(t, t.dtype) for t in (*m.parameters(recurse=False), *m.buffers(recurse=False))
                 if t.is_floating_point() and t.dtype != torch.float32] for m in model.modules()}
    owned = {m: tensors for m, tensors in owned.items() if tensors}

    def up(module, *_):
        for t, _dtype in owned[module]:
            t.data = t.data.float()

    def down(module, *_):
        for t, dtype in owned[module]:
            t.data = t.data.to(dtype)

    handles = [h for m in owned for h in (m.register_forward_pre_hook(up), m.register_forward_hook(down))]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for m in owned:
            down(m)


@dataclass(frozen=True)
class ParityCases:
    """The token ids of every case, drawn once from a seed."""

    prompt: np.ndarray
    chain: np.ndarray
    tree: np.ndarray
    far: np.ndarray
    far_start: int

    @classmethod
    def draw(cls, token_limit: int, max_context: int, seed: int = 0) -> "ParityCases":
        rng = np.random.default_rng(seed)
        ids = rng.integers(0, token_limit, PROMPT_LEN + CHAIN_LEN + len(TREE_PARENTS) + FAR_LEN)
        a, b, c = PROMPT_LEN, PROMPT_LEN + CHAIN_LEN, PROMPT_LEN + CHAIN_LEN + len(TREE_PARENTS)
        return cls(ids[:a], ids[a:b], ids[b:c], ids[c:], max(max_context - FAR_LEN, 0))


@torch.no_grad()
def reference_outputs(model: torch.nn.Module, cases: ParityCases, taps: tuple[int, ...] = ()
                      ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray] | None]:
    """Hugging Face's own fp32 logits for every case (rows in the order the graph produces them) and, with
    ``taps``, its ``output_hidden_states[i]`` for each tap layer i, concatenated in ``taps`` order (what a
    target exported for an EAGLE-3 head outputs as ``eagle_taps``); None without taps."""

    def hf(tokens: np.ndarray, start: int = 0) -> tuple[np.ndarray, np.ndarray | None]:
        ids = torch.as_tensor(tokens, dtype=torch.long)[None]
        pos = torch.arange(start, start + len(tokens))[None]
        out = model(ids, position_ids=pos, output_hidden_states=bool(taps))
        states = (torch.cat([out.hidden_states[t][0] for t in taps], dim=-1).float().numpy() if taps else None)
        return out.logits[0].float().numpy(), states

    p, prompt = len(cases.prompt), cases.prompt
    with float32_compute(model):
        chain, chain_taps = hf(np.concatenate([prompt, cases.chain]))
        tree = [hf(np.concatenate([prompt, cases.tree[_path(TREE_PARENTS, n)]])) for n in range(len(TREE_PARENTS))]
        far, far_taps = hf(cases.far, cases.far_start)
    logits = {"prefill": chain[:p], "decode": chain[p:p + 1], "chain": chain[p:],
              "tree": np.stack([t[0][-1] for t in tree]), "far": far}
    if not taps:
        return logits, None
    return logits, {"prefill": chain_taps[:p], "decode": chain_taps[p:p + 1], "chain": chain_taps[p:],
                    "tree": np.stack([t[1][-1] for t in tree]), "far": far_taps}


def compare_states(ref: np.ndarray, got: np.ndarray, width: int) -> dict[str, float]:
    """``abs`` and ``rel`` of hidden states [..., k * width] against ``ref``, the relative error of each
    ``width``-wide slice of a row measured against that slice's own scale (bundle.parity.row_scale): tap
    layers deeper in a model run at larger magnitudes, and each is held to its own."""
    ref = ref.reshape(-1, ref.shape[-1] // width, width)
    diff = np.abs(got.reshape(ref.shape).astype(np.float64) - ref)
    return {"abs": float(diff.max()), "rel": float((diff.max(axis=-1) / row_scale(ref)).max())}


def parity_session(path: Path):
    """The ONNX Runtime CPU session a parity check runs a graph in.

    A few calls, checked once: the runtime's low-memory session, no second copy of the weights (Llama-3.2-1B
    fp16, one prefill: 7.8 GB peak -> 4.5 GB; without the arena the transient fp32 copies go back to the OS:
    the five cases on that model 3.5 -> 1.7 GB anonymous memory, 10 -> 14 s)."""
    import onnxruntime as ort

    options = session_options()
    disabled = low_memory_options(options)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)


class OrtDecoder:
    """A graph's session called the way the runtime calls it, whatever its cache layout (a GQA graph's shared
    head-major buffers or a fused/portable graph's past inputs and new-row outputs)."""

    def __init__(self, path: Path, dims: C.ModelDims, dtype: str) -> None:
        self.session = parity_session(path)
        self.dims, self.np_dtype = dims, np.dtype(dtype)
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.new_names = [n for i in range(dims.num_layers) for n in (C.new_key(i), C.new_value(i))]
        self.shared_kv = C.present_key(0) in self.outputs
        self.indexed = any(i.name == C.LOGITS_INDEX for i in self.session.get_inputs())
        # A gqa-static graph: lengths from seqlens_k, no mask (causal only: contract.CAUSAL_ONLY_GRAPHS).
        self.static = any(i.name == C.SEQLENS_K for i in self.session.get_inputs())

    def __call__(self, ids: np.ndarray, pos: np.ndarray, mask: np.ndarray, past: list[np.ndarray]):
        """(logits [Q, V], new K/V [1, Q, H_kv, D] each, eagle_taps [Q, width] or None when the graph has no
        taps). ``past``: [1, P, H_kv, D] per layer and K|V, whatever the graph's cache layout."""
        out = self.run(ids, pos, mask, past)
        taps = out[C.EAGLE_TAPS][0] if C.EAGLE_TAPS in out else None
        return out[C.LOGITS][0], [out[n] for n in self.new_names], taps

    def run(self, ids: np.ndarray, pos: np.ndarray, mask: np.ndarray, past: list[np.ndarray],
            extra: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Every output by name, the new K/V rows as ``new_key.N`` / ``new_value.N`` [1, Q, H_kv, D] in either
        layout; ``extra``: further inputs by contract name (an EAGLE-3 head's taps and features)."""
        feed = {C.INPUT_IDS: ids[None].astype(np.int64), C.POSITION_IDS: pos[None].astype(np.int64),
                C.ATTENTION_MASK: mask, **(extra or {})}
        if self.indexed and C.LOGITS_INDEX not in feed:  # every row's logits, as the reference has them
            feed[C.LOGITS_INDEX] = np.arange(len(ids), dtype=np.int64)
        if self.shared_kv:
            return self._shared(feed, len(ids), past)
        for i in range(self.dims.num_layers):
            feed[C.past_key(i)], feed[C.past_value(i)] = past[2 * i], past[2 * i + 1]
        return dict(zip(self.outputs, self.session.run(None, feed)))

    def _shared(self, feed: dict, q_len: int, past: list[np.ndarray]) -> dict[str, np.ndarray]:
        """A GQA graph: each layer's head-major buffer bound as its past and its present, with room to spare
        after the new rows (the op must not assume the buffer ends there)."""
        p = past[0].shape[1]
        buffers = [np.zeros((1, self.dims.num_kv_heads, p + q_len + 3, self.dims.head_dim), self.np_dtype)
                   for _ in past]
        if self.static:  # the lengths from seqlens_k; no mask, so only a causal one can be asked for
            if not is_causal(feed[C.ATTENTION_MASK], p):
                raise ValueError("a gqa-static graph is causal only: it cannot run this mask")
            feed = {k: v for k, v in feed.items() if k != C.ATTENTION_MASK}
            feed[C.SEQLENS_K] = np.array([p + q_len - 1], np.int32)
        for buf, rows in zip(buffers, past):
            buf[:, :, :p] = rows.transpose(0, 2, 1, 3)
        binding = self.session.io_binding()
        for name, value in feed.items():
            binding.bind_cpu_input(name, value)
        for i, buf in enumerate(buffers):
            layer, value = divmod(i, 2)
            names = (C.past_value(layer), C.present_value(layer)) if value else (C.past_key(layer), C.present_key(layer))
            binding.bind_input(names[0], "cpu", 0, buf.dtype, list(buf.shape), buf.ctypes.data)
            binding.bind_output(names[1], "cpu", 0, buf.dtype, list(buf.shape), buf.ctypes.data)
        others = [n for n in self.outputs if not n.startswith(("present_key.", "present_value."))]
        for name in others:
            binding.bind_output(name, "cpu")
        self.session.run_with_iobinding(binding)
        out = dict(zip(others, binding.copy_outputs_to_cpu()[-len(others):]))
        out.update((name, buf[:, :, p:p + q_len].transpose(0, 2, 1, 3)) for name, buf in zip(self.new_names, buffers))
        return out

    def empty_past(self) -> list[np.ndarray]:
        shape = (1, 0, self.dims.num_kv_heads, self.dims.head_dim)
        return [np.zeros(shape, self.np_dtype) for _ in range(2 * self.dims.num_layers)]


def onnx_outputs(onnx_path: Path, dims: C.ModelDims, dtype: str, cases: ParityCases
                 ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray] | None]:
    """The exported graph's logits for every case (but the tree on a causal-only graph), each called the way the
    runtime calls it, and its ``eagle_taps`` where it has that output (else None)."""
    ort_model = OrtDecoder(onnx_path, dims, dtype)
    p = len(cases.prompt)
    pre, pre_kv, pre_taps = ort_model(cases.prompt, np.arange(p), causal_mask(p, 0), ort_model.empty_past())
    n = len(cases.chain)
    mask, depth = tree_mask(TREE_PARENTS, p)
    far = len(cases.far)
    tree = {} if ort_model.static else {"tree": ort_model(cases.tree, p + depth, mask, pre_kv)}
    runs = {
        "prefill": (pre, pre_kv, pre_taps),
        "decode": ort_model(cases.chain[:1], np.array([p]), causal_mask(1, p), pre_kv),
        "chain": ort_model(cases.chain, np.arange(p, p + n), causal_mask(n, p), pre_kv),
        **tree,
        "far": ort_model(cases.far, np.arange(cases.far_start, cases.far_start + far), causal_mask(far, 0),
                         ort_model.empty_past()),
    }
    logits = {case: r[0] for case, r in runs.items()}
    return logits, (None if pre_taps is None else {case: r[2] for case, r in runs.items()})


def check_parity(reference: dict[str, np.ndarray], cases: ParityCases, onnx_path: Path, dims: C.ModelDims,
                 dtype: str, tolerance: ParityTolerance | None = None,
                 taps_reference: dict[str, np.ndarray] | None = None) -> dict[str, dict[str, float]]:
    """Compare the graph with :func:`reference_outputs`' logits: per case ``abs``, ``rel``, ``kl``, ``top1``.

    With ``taps_reference`` (:func:`reference_outputs`' hidden states), the graph's ``eagle_taps`` are
    compared too, each tap against its own scale, and held to the same relative tolerance: per case
    ``taps_abs`` and ``taps_rel``. Raises :class:`ParityError` if any case is beyond ``tolerance``
    (default: the one for ``dtype``).
    """
    tol = PARITY_TOLERANCE[dtype] if tolerance is None else tolerance
    got, got_taps = onnx_outputs(onnx_path, dims, dtype, cases)
    figures = {case: compare_logits(reference[case], got[case]) for case in reference if case in got}
    bad = {k: f for k, f in figures.items() if not within(f, tol)}
    if bad:
        detail = ", ".join(f"{k} rel {f['rel']:.3g} kl {f['kl']:.3g}" for k, f in bad.items())
        raise ParityError(f"{onnx_path.name}: ONNX Runtime differs from PyTorch (fp32) beyond rel {tol.rel:g} / "
                          f"KL {tol.kl:g} ({detail})")
    if taps_reference is not None:
        if got_taps is None:
            raise ParityError(f"{onnx_path.name} has no {C.EAGLE_TAPS} output")
        for case, ref in ((c, r) for c, r in taps_reference.items() if c in got_taps):
            f = compare_states(ref, got_taps[case], dims.hidden_size)
            figures[case].update(taps_abs=f["abs"], taps_rel=f["rel"])
        bad_taps = {k: f["taps_rel"] for k, f in figures.items() if "taps_rel" in f and not f["taps_rel"] <= tol.rel}
        if bad_taps:
            detail = ", ".join(f"{k} rel {r:.3g}" for k, r in bad_taps.items())
            raise ParityError(f"{onnx_path.name}: {C.EAGLE_TAPS} differ from Hugging Face's hidden states (fp32) "
                              f"beyond rel {tol.rel:g} ({detail})")
    return figures


GOLDEN_LEN = 12
GOLDEN_TOP = 8


@torch.no_grad()
def golden_logits(model: torch.nn.Module, token_limit: int, seed: int = 1) -> dict:
    """The model's own fp32 logits on a fixed random prompt: top ids and values at every position, and
    each row's scale (:func:`row_scale`).

    Stored in the manifest so `specrt verify` can check any backend (ONNX Runtime, TensorRT, fp16
    engines) against PyTorch without torch installed.
    """
    ids = np.random.default_rng(seed).integers(0, token_limit, GOLDEN_LEN)
    with float32_compute(model):
        logits = model(torch.as_tensor(ids, dtype=torch.long)[None]).logits[0].float()
    values, top = torch.topk(logits, GOLDEN_TOP, dim=-1)
    return {"input_ids": ids.tolist(), "top_ids": top.tolist(), "top_logits": values.tolist(),
            "scale": row_scale(logits.numpy()).tolist()}
