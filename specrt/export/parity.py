"""ONNX Runtime vs the Hugging Face model itself, on the four ways the runtime calls a decoder.

The reference is always HF's own full forward over the whole sequence (no cache), so the check
covers the wrapper, the tracer and ONNX Runtime together, and a cache bug cannot hide in both sides.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .. import contract as C
from ..errors import ParityError
from ..runtime.masks import causal_mask, tree_mask

PROMPT_LEN = 7
CHAIN_LEN = 5
# A 6-node tree: root with two children, the first child with one child, the second with two.
TREE_PARENTS = (-1, 0, 0, 1, 2, 2)


def _path(parents: tuple[int, ...], node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


class _OrtDecoder:
    def __init__(self, path: Path, dims: C.ModelDims, dtype: str) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.dims, self.np_dtype = dims, np.dtype(dtype)

    def __call__(self, ids: np.ndarray, pos: np.ndarray, mask: np.ndarray, past: list[np.ndarray]):
        feed = {C.INPUT_IDS: ids[None].astype(np.int64), C.POSITION_IDS: pos[None].astype(np.int64),
                C.ATTENTION_MASK: mask}
        for i in range(self.dims.num_layers):
            feed[C.past_key(i)], feed[C.past_value(i)] = past[2 * i], past[2 * i + 1]
        logits, _hidden, *new = self.session.run(None, feed)
        return logits[0], new

    def empty_past(self) -> list[np.ndarray]:
        shape = (1, 0, self.dims.num_kv_heads, self.dims.head_dim)
        return [np.zeros(shape, self.np_dtype) for _ in range(2 * self.dims.num_layers)]


def check_parity(model: torch.nn.Module, onnx_path: Path, dims: C.ModelDims, dtype: str, token_limit: int,
                 seed: int = 0, tolerance: float | None = None) -> dict[str, float]:
    """Max |logits_ORT - logits_HF| for prefill, 1-token decode, a 5-token chain and a 6-node tree.

    Raises :class:`ParityError` if any case exceeds ``tolerance`` (default: the contract's for ``dtype``).
    """
    tol = C.PARITY_TOLERANCE[dtype] if tolerance is None else tolerance
    rng = np.random.default_rng(seed)
    n_tok = len(TREE_PARENTS)
    ids = rng.integers(0, token_limit, PROMPT_LEN + CHAIN_LEN + n_tok)
    prompt, chain, tree_tokens = ids[:PROMPT_LEN], ids[PROMPT_LEN:PROMPT_LEN + CHAIN_LEN], ids[PROMPT_LEN + CHAIN_LEN:]
    ort_model = _OrtDecoder(onnx_path, dims, dtype)

    @torch.no_grad()
    def hf(tokens: np.ndarray) -> np.ndarray:  # (len, V) logits of HF's own forward, no cache
        return model(torch.as_tensor(tokens, dtype=torch.long)[None]).logits[0].float().numpy()

    p = PROMPT_LEN
    pre_logits, pre_kv = ort_model(prompt, np.arange(p), causal_mask(p, 0), ort_model.empty_past())
    ref_prompt = hf(prompt)
    diffs = {"prefill": float(np.abs(pre_logits - ref_prompt).max())}

    dec_logits, _ = ort_model(chain[:1], np.array([p]), causal_mask(1, p), pre_kv)
    diffs["decode"] = float(np.abs(dec_logits[0] - hf(np.concatenate([prompt, chain[:1]]))[-1]).max())

    chain_logits, _ = ort_model(chain, np.arange(p, p + CHAIN_LEN), causal_mask(CHAIN_LEN, p), pre_kv)
    ref_chain = hf(np.concatenate([prompt, chain]))[-CHAIN_LEN:]
    diffs["chain"] = float(np.abs(chain_logits - ref_chain).max())

    mask, depth = tree_mask(TREE_PARENTS, p)
    tree_logits, _ = ort_model(tree_tokens, p + depth, mask, pre_kv)
    diffs["tree"] = max(
        float(np.abs(tree_logits[node] - hf(np.concatenate([prompt, tree_tokens[_path(TREE_PARENTS, node)]]))[-1]).max())
        for node in range(n_tok))

    bad = {k: v for k, v in diffs.items() if not v <= tol}  # "not <=" also catches NaN
    if bad:
        detail = ", ".join(f"{k} {v:.3g}" for k, v in bad.items())
        raise ParityError(f"{onnx_path.name}: ONNX Runtime differs from PyTorch beyond {tol:g} ({detail})")
    return diffs


GOLDEN_LEN = 12
GOLDEN_TOP = 8


@torch.no_grad()
def golden_logits(model: torch.nn.Module, token_limit: int, seed: int = 1) -> dict:
    """The model's own logits on a fixed random prompt: top ids and values at every position.

    Stored in the manifest so `specrt verify` can check any backend (ONNX Runtime, TensorRT, fp16
    engines) against PyTorch without torch installed.
    """
    ids = np.random.default_rng(seed).integers(0, token_limit, GOLDEN_LEN)
    logits = model(torch.as_tensor(ids, dtype=torch.long)[None]).logits[0].float()
    values, top = torch.topk(logits, GOLDEN_TOP, dim=-1)
    return {"input_ids": ids.tolist(), "top_ids": top.tolist(), "top_logits": values.tolist()}
