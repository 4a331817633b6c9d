"""An EAGLE-3 head as a bundle graph (``eagle.onnx``, kind "eagle3" in bundle/contract.py), its vocabulary
map (``eagle_vocab.npy``) and its parity check against the PyTorch reference (``eagle.Eagle3Head``).

The graph computes exactly ``Eagle3Head``'s step (docs/design/eagle3.md) on ``fc(eagle_taps) +
eagle_features`` (fc has no bias, so a row that passes zeros for one of the two gets the other alone),
with the token embedding looked up in a frozen copy of the target's input table inside the graph (or the
head's own ``embed_tokens`` where the checkpoint ships one). Rotary cos/sin are tables gathered by
position, as in the target's graphs, computed by transformers' own Llama rotary module for the head's
rope. ``fused``: the same single-node RMS norm / rotary / attention and packed projections as the fused
target graphs (export/graph/fused_ops.py).

The runtime reads draft ids through the vocabulary map, which must be strictly ascending; a head whose
``d2t`` does not give ascending target ids has its ``lm_head`` rows permuted at export so that it does
(the logit of every target id is unchanged).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ...bundle import contract as C
from ...bundle.parity import PARITY_TOLERANCE, ParityTolerance, compare_logits, within
from ...errors import EagleHeadError, ParityError
from .config import Eagle3Config
from .head import Eagle3Head
from .checkpoint import check_target, load_eagle3, resolve_head

ARCHITECTURE = "eagle3"  # the head's ModelEntry.architecture
GRAPH_FILE = "eagle.onnx"
VOCAB_FILE = "eagle_vocab.npy"
# Targets whose hidden states and token embedding are what EAGLE-3 heads are trained on: plain rotary
# decoders that look tokens up in an unscaled table (Phi-3 packs its projections, which changes neither).
EAGLE_TARGETS = ("llama", "mistral", "qwen2", "qwen3", "phi3")
_REFUSED = {"gemma2": "Gemma scales its token embedding by sqrt(hidden), which published heads do not expect",
            "gemma3_text": "Gemma scales its token embedding by sqrt(hidden), which published heads do not expect",
            "gpt2": "GPT-2 adds learned absolute positions to its embedding and has no rotary attention"}


def check_eagle_target(model_type: str) -> None:
    """Refuse, in one line, a target architecture EAGLE-3 heads are not exported for."""
    if model_type not in EAGLE_TARGETS:
        why = _REFUSED.get(model_type, "not a llama-style rotary decoder")
        raise EagleHeadError(f"EAGLE-3 heads need a llama-style target ({', '.join(EAGLE_TARGETS)}); "
                             f"{model_type} is not one: {why}")


@dataclass(frozen=True)
class HeadInfo:
    """What the export needs to know of a head before any graph is written (checked against the target)."""

    source: str
    config: Eagle3Config
    taps: tuple[int, int, int]
    has_embedding: bool

    @property
    def tap_width(self) -> int:
        return len(self.taps) * self.config.target_hidden_size


def read_head(path: str | Path, target_config: Any) -> HeadInfo:
    """Load and check the head at ``path`` for the target of ``target_config`` (every refusal one line);
    the taps are the head config's explicit ones or :func:`eagle.tap_layers` of the target's depth."""
    check_eagle_target(getattr(target_config, "model_type", None))
    path = resolve_head(path)  # a hub id: fetched once here, the manifest then names the local copy
    cfg, head, _d2t, _t2d = load_eagle3(path, target_config)
    has_embedding = head.embed_tokens is not None
    taps = check_target(cfg, target_config, has_embedding=has_embedding)
    if taps is None:
        raise EagleHeadError("the target config has no num_hidden_layers: cannot place the head's taps")
    return HeadInfo(source=str(path), config=cfg, taps=taps, has_embedding=has_embedding)


def ascending_vocab(d2t: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
    """(order, vocab map): graph row j is the head's draft id ``order[j]``, whose target id ``vocab_map[j]``
    ascends strictly with j (the identity order for heads built as EAGLE builds them)."""
    targets = torch.arange(d2t.shape[0], dtype=torch.int64) + d2t.to(torch.int64)
    order = torch.argsort(targets, stable=True)
    return order, targets[order].numpy().astype(np.int64)


def _rotary_tables(head: Eagle3Head, positions: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's own cos/sin for positions 0 .. positions-1, (positions, d/2) each, in ``dtype`` (what the
    reference's rotary module gives for a ``dtype`` input)."""
    x = torch.zeros(1, 1, head.cfg.hidden_size, dtype=dtype)
    with torch.no_grad():
        cos, sin = head.rotary(x, torch.arange(positions).unsqueeze(0))
    half = cos.shape[-1] // 2  # rotate_half layout: the two halves repeat the same frequencies
    return cos[0, :, :half].contiguous(), sin[0, :, :half].contiguous()


class HeadWrapper(nn.Module):
    """The exported head graph: contract inputs (ids, positions, bool mask, taps, features, past K/V of each
    layer) in, draft-vocabulary logits (fp32), pre-norm hidden and each layer's new K/V out. ``head`` is used as
    given (cast and permute a copy first: :func:`export_copy`)."""

    def __init__(self, head: Eagle3Head, embedding: torch.Tensor | None, *, fused: bool, positions: int) -> None:
        super().__init__()
        self.head = head
        self.cfg = head.cfg
        self.fused = fused
        dtype = head.fc.weight.dtype
        if head.embed_tokens is None:
            if embedding is None:
                raise EagleHeadError("the head ships no embed_tokens.weight and no target embedding was given")
            # a frozen copy of the target's table: the head graph looks its tokens up itself
            self.embedding = nn.Parameter(embedding.detach().to(dtype).clone(), requires_grad=False)
        else:
            self.embedding = None
        cos, sin = _rotary_tables(head, positions, dtype)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.decoder_layers = [head.midlayer, *head.layers.values()]  # not submodules: head holds them
        if fused:  # packed projections per layer, as the fused target graphs have them
            def packed(*weights: torch.Tensor) -> nn.Parameter:
                return nn.Parameter(torch.cat(weights).detach(), requires_grad=False)

            self.qkv = nn.ParameterList(packed(x.self_attn.q_proj.weight, x.self_attn.k_proj.weight,
                                               x.self_attn.v_proj.weight) for x in self.decoder_layers)
            self.gate_up = nn.ParameterList(packed(x.mlp.gate_proj.weight, x.mlp.up_proj.weight)
                                            for x in self.decoder_layers)
        self.eval()

    def _norm(self, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if not self.fused:
            return norm(x)
        return nn.functional.rms_norm(x, (x.shape[-1],), norm.weight, norm.eps)  # one RMSNormalization node

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.embedding is None:
            return self.head.embed_tokens(input_ids)
        return nn.functional.embedding(input_ids, self.embedding)

    def _attention(self, i: int, x, position_ids, mask, past_k, past_v):
        from ..graph.attention import additive_mask, attend, rotate_half

        attn, cfg = self.decoder_layers[i].self_attn, self.cfg
        b, q_len, _ = x.shape
        heads, kv_heads, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        scale = 1.0 / math.sqrt(d)
        if self.fused:
            from ..graph.fused_ops import attention, rotary

            q, k, v = nn.functional.linear(x, self.qkv[i]).split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
            if cfg.qk_norm:  # per head, before rotary, as the target graphs do for Qwen3
                q = self._norm(attn.q_norm, q.view(b, q_len, heads, d)).reshape(b, q_len, heads * d)
                k = self._norm(attn.k_norm, k.view(b, q_len, kv_heads, d)).reshape(b, q_len, kv_heads * d)
            q = rotary(q, position_ids, self.cos, self.sin, heads)
            k = rotary(k, position_ids, self.cos, self.sin, kv_heads)
            keys = torch.cat([past_k.reshape(b, -1, kv_heads * d), k], dim=1)
            values = torch.cat([past_v.reshape(b, -1, kv_heads * d), v], dim=1)
            out = attention(q, keys, values, mask, scale, heads, kv_heads, 0.0)
            return attn.o_proj(out), k.view(b, q_len, kv_heads, d), v.view(b, q_len, kv_heads, d)
        cos = self.cos[position_ids].repeat(1, 1, 2).unsqueeze(2)  # (B, Q, 1, d)
        sin = self.sin[position_ids].repeat(1, 1, 2).unsqueeze(2)
        q = attn.q_proj(x).view(b, q_len, heads, d)
        k = attn.k_proj(x).view(b, q_len, kv_heads, d)
        v = attn.v_proj(x).view(b, q_len, kv_heads, d)
        if cfg.qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = (t * cos + rotate_half(t) * sin for t in (q, k))
        out = attend(q, k, v, past_k, past_v, additive_mask(mask), scale)
        return attn.o_proj(out), k, v

    def _mlp(self, i: int, x: torch.Tensor) -> torch.Tensor:
        mlp = self.decoder_layers[i].mlp
        if not self.fused:
            return mlp(x)
        gate, up = nn.functional.linear(x, self.gate_up[i]).chunk(2, dim=-1)
        return mlp.down_proj(nn.functional.silu(gate) * up)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                eagle_taps: torch.Tensor, eagle_features: torch.Tensor, past: tuple[torch.Tensor, ...],
                logits_index: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        head, mid = self.head, self.head.midlayer
        features = head.fc(head.norm_taps(eagle_taps, self._norm)) + eagle_features  # a norm keeps zero taps zero
        normed = self._norm(mid.hidden_norm, features)
        residual = normed if self.cfg.norm_before_residual else features
        x = torch.cat([self._norm(mid.input_layernorm, self._embed(input_ids)), normed], dim=-1)  # embedding first
        if self.cfg.sliding_window is not None:
            from ..graph.attention import window_mask

            attention_mask = window_mask(attention_mask, position_ids, past[0].shape[1], self.cfg.sliding_window)
        out, k, v = self._attention(0, x, position_ids, attention_mask, past[0], past[1])
        h = residual + out
        h = h + self._mlp(0, self._norm(mid.post_attention_layernorm, h))
        present = [k, v]
        for i in range(1, len(self.decoder_layers)):  # a stacked head's standard layers on the H-wide stream
            layer = self.decoder_layers[i]
            out, k, v = self._attention(i, self._norm(layer.input_layernorm, h), position_ids, attention_mask,
                                        past[2 * i], past[2 * i + 1])
            h = h + out
            h = h + self._mlp(i, self._norm(layer.post_attention_layernorm, h))
            present += [k, v]
        if self.cfg.feed_normed:  # the next step reads the final norm's output (speculators' norm_output)
            h = self._norm(head.norm, h)
        rows = h if logits_index is None else h.index_select(1, logits_index)  # a catch-up reads its last row
        logits = head.lm_head(rows if self.cfg.feed_normed else self._norm(head.norm, rows)).float()
        return logits, h, *present


def export_copy(head: Eagle3Head, dtype: torch.dtype, order: torch.Tensor | None = None) -> Eagle3Head:
    """A copy of ``head`` in ``dtype`` with its lm_head rows in ``order`` (None: as they are)."""
    out = Eagle3Head(head.cfg, with_embedding=head.embed_tokens is not None)
    out.load_state_dict(head.state_dict())
    out = out.to(dtype).eval()
    if order is not None:
        with torch.no_grad():
            out.lm_head.weight.copy_(out.lm_head.weight[order])
    return out


def _trace_inputs(cfg: Eagle3Config, tap_width: int, dtype: torch.dtype) -> tuple:
    from ..graph.trace import TRACE_P, TRACE_Q, trace_index

    q, p = TRACE_Q, TRACE_P
    ids = torch.zeros(1, q, dtype=torch.int64)
    pos = torch.arange(p, p + q).unsqueeze(0)
    mask = torch.ones(1, 1, q, p + q, dtype=torch.bool).tril(p)
    taps = torch.zeros(1, q, tap_width, dtype=dtype)
    features = torch.zeros(1, q, cfg.hidden_size, dtype=dtype)
    past = tuple(torch.zeros(1, p, cfg.num_key_value_heads, cfg.head_dim, dtype=dtype)
                 for _ in range(2 * cfg.num_layers))
    return ids, pos, mask, taps, features, past, trace_index()


def export_eagle_head(head: Eagle3Head, embedding: torch.Tensor | None, path: Path, dtype: str, *,
                      taps: tuple[int, ...], order: torch.Tensor | None = None, fused: bool = False,
                      positions: int = 2048, opset: int = 18, exporter: str = "dynamo") -> C.ModelDims:
    """Write the head graph to ``path`` with the contract's I/O (kind "eagle3"); returns its dims.

    ``embedding``: the target's input table [V, H] (ignored when the head ships ``embed_tokens``);
    ``order``: the lm_head rows' order (:func:`ascending_vocab`); ``positions``: rows of the rotary
    tables (the bundle's max context: the head's positions count its own sequence from 0).
    """
    from ..graph.trace import trace_module

    torch_dtype = getattr(torch, dtype)
    cfg = head.cfg
    tap_width = len(taps) * cfg.target_hidden_size
    dims = C.ModelDims(num_layers=cfg.num_layers, num_heads=cfg.num_attention_heads,
                       num_kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, hidden_size=cfg.hidden_size,
                       vocab_size=cfg.draft_vocab_size)
    wrapper = HeadWrapper(export_copy(head, torch_dtype, order), embedding, fused=fused, positions=positions)
    ins, outs = C.decoder_io(dims, dtype, "eagle3", tap_width, logits_index=True)
    trace_module(wrapper, _trace_inputs(cfg, tap_width, torch_dtype), ins, outs, path, opset, exporter, fused)
    return dims


# ---------------------------------------------------------------------------------------------------
# Parity: the graph against Eagle3Head in PyTorch fp32, called as the runtime calls it.

HEAD_CASES = ("prefill", "step", "chain", "tree")


@dataclass(frozen=True)
class HeadCases:
    """The inputs of every head parity case (numpy, picklable). ``step`` and ``tree`` rows read features
    (each side its own prefill's ``hidden``, rows ``tree_rows``), the others the target's taps."""

    prefill_ids: np.ndarray
    prefill_taps: np.ndarray  # [p, tap_width] float32: the target's own taps on the parity prompt
    step_ids: np.ndarray
    chain_ids: np.ndarray
    chain_taps: np.ndarray
    tree_ids: np.ndarray
    tree_parents: tuple[int, ...]
    tree_rows: np.ndarray  # the prefill row whose hidden each tree node reads as features

    @classmethod
    def build(cls, cases, taps_reference: dict[str, np.ndarray], dtype: str) -> HeadCases:
        """From the target's parity cases and its fp32 taps on them: head row t pairs the taps at position
        t with the embedding of token t+1 (docs/design/eagle3.md), so the ids are the cases' shifted by one.
        Taps are rounded to the graph's dtype here, so both sides read the same values."""
        from ..graph.parity import TREE_PARENTS

        p = len(cases.prompt)
        rounded = {k: v.astype(dtype).astype(np.float32) for k, v in taps_reference.items()}
        ids = np.concatenate([cases.prompt, cases.chain, cases.tree]).astype(np.int64)
        n = len(cases.chain)
        return cls(prefill_ids=ids[1:p + 1], prefill_taps=rounded["prefill"], step_ids=ids[p + 1:p + 2],
                   chain_ids=ids[p + 1:p + n + 1], chain_taps=rounded["chain"], tree_ids=cases.tree.astype(np.int64),
                   tree_parents=tuple(TREE_PARENTS), tree_rows=np.arange(len(TREE_PARENTS)) % p)


def _case_calls(c: HeadCases):
    """(case, ids, positions, mask, taps or None, features source or None, uses the prefill's past)."""
    from ...runtime.masks import causal_mask, tree_mask

    p, n = len(c.prefill_ids), len(c.chain_ids)
    mask, depth = tree_mask(c.tree_parents, p)
    return [("prefill", c.prefill_ids, np.arange(p), causal_mask(p, 0), c.prefill_taps, None, False),
            ("step", c.step_ids, np.array([p]), causal_mask(1, p), None, np.array([p - 1]), True),
            ("chain", c.chain_ids, np.arange(p, p + n), causal_mask(n, p), c.chain_taps, None, True),
            ("tree", c.tree_ids, p + depth, mask, None, c.tree_rows, True)]


@torch.no_grad()
def reference_head(head: Eagle3Head, embedding: torch.Tensor | None, cases: HeadCases) -> dict[str, dict]:
    """Eagle3Head's fp32 outputs per case: ``forward`` on the taps rows, ``step`` on the feature rows."""
    head = export_copy(head, torch.float32)
    table = head.embed_tokens.weight if head.embed_tokens is not None else embedding.float()
    out: dict[str, dict] = {}
    pre = None
    for case, ids, pos, mask, taps, rows, cached in _case_calls(cases):
        e = table[torch.as_tensor(ids)][None]
        args = (torch.tensor(pos)[None], torch.tensor(np.array(mask)))
        past = (pre.key, pre.value, pre.rest) if cached else (None, None, ())
        if taps is not None:
            r = head.forward(torch.as_tensor(taps)[None], e, *args, *past)
        else:
            r = head.step(pre.hidden[:, torch.as_tensor(rows)], e, *args, *past)
        if case == "prefill":
            pre = r
        out[case] = {"logits": r.logits[0].numpy(), "hidden": r.hidden[0].numpy()}
    return out


def onnx_head(path: Path, dims: C.ModelDims, dtype: str, tap_width: int, cases: HeadCases) -> dict[str, dict]:
    """The head graph's outputs per case on ONNX Runtime (either cache layout), its own prefill's K/V and
    hidden reused; no tree case on a causal-only graph (gqa-static: the runtime runs the head's chain only)."""
    from ..graph.parity import OrtDecoder

    graph = OrtDecoder(path, dims, dtype)
    np_dtype = np.dtype(dtype)
    out: dict[str, dict] = {}
    pre = None
    for case, ids, pos, mask, taps, rows, cached in _case_calls(cases):
        if case == "tree" and graph.static:
            continue
        q = len(ids)
        extra = {C.EAGLE_TAPS: (taps[None].astype(np_dtype) if taps is not None
                                else np.zeros((1, q, tap_width), np_dtype)),
                 C.EAGLE_FEATURES: (pre[C.HIDDEN][:, rows] if rows is not None
                                    else np.zeros((1, q, dims.hidden_size), np_dtype))}
        past = ([t for i in range(dims.num_layers) for t in (pre[C.new_key(i)], pre[C.new_value(i)])] if cached
                else graph.empty_past())
        r = graph.run(ids, pos, mask, past, extra)
        if case == "prefill":
            pre = r
        out[case] = {"logits": r[C.LOGITS][0], "hidden": r[C.HIDDEN][0]}
    return out


def check_head_parity(reference: dict[str, dict], cases: HeadCases, path: Path, dims: C.ModelDims, dtype: str,
                      tap_width: int, order: np.ndarray | None = None,
                      tolerance: ParityTolerance | None = None) -> dict[str, dict[str, float]]:
    """The graph vs :func:`reference_head`: per case the logits' ``abs``/``rel``/``kl``/``top1`` (the
    reference's columns taken in ``order``, the graph's row order) and the hidden state's ``hidden_abs``/
    ``hidden_rel``; raises :class:`ParityError` beyond ``tolerance`` (default: the one for ``dtype``)."""
    from ..graph.parity import compare_states

    tol = PARITY_TOLERANCE[dtype] if tolerance is None else tolerance
    got = onnx_head(path, dims, dtype, tap_width, cases)
    figures = {}
    for case, ref in ((c, r) for c, r in reference.items() if c in got):
        ref_logits = ref["logits"] if order is None else ref["logits"][..., np.asarray(order)]
        f = compare_logits(ref_logits, got[case]["logits"])
        h = compare_states(ref["hidden"], got[case]["hidden"], dims.hidden_size)
        figures[case] = {**f, "hidden_abs": h["abs"], "hidden_rel": h["rel"]}
    bad = {k: f for k, f in figures.items() if not (within(f, tol) and f["hidden_rel"] <= tol.rel)}
    if bad:
        detail = ", ".join(f"{k} rel {f['rel']:.3g} kl {f['kl']:.3g} hidden rel {f['hidden_rel']:.3g}"
                           for k, f in bad.items())
        raise ParityError(f"{path.name}: ONNX Runtime differs from the EAGLE-3 reference (PyTorch fp32) beyond "
                          f"rel {tol.rel:g} / KL {tol.kl:g} ({detail})")
    return figures


@dataclass(frozen=True)
class HeadExport:
    """What the PyTorch side hands back for the parity check and the manifest (picklable)."""

    dims: C.ModelDims
    reference: dict[str, dict]
    cases: HeadCases
    vocab_map: np.ndarray  # int64 [D_v], strictly ascending
    order: np.ndarray | None  # the lm_head rows' order when it was not the identity


def head_torch_side(info: HeadInfo, target_model: nn.Module, target_config: Any, cases, taps_reference: dict,
                    path: Path, dtype: str, *, fused: bool, positions: int, opset: int, exporter: str) -> HeadExport:
    """Load the head, compute its fp32 reference on the target's own taps, write its graph to ``path``."""
    _cfg, head, d2t, _t2d = load_eagle3(info.source, target_config)
    embedding = None if head.embed_tokens is not None else target_model.get_input_embeddings().weight
    order, vocab_map = ascending_vocab(d2t)
    identity = bool(torch.equal(order, torch.arange(len(order))))
    # The target's taps begin with the head's (a DFlash draft's may follow)
    head_cases = HeadCases.build(cases, {k: v[..., :info.tap_width] for k, v in taps_reference.items()}, dtype)
    reference = reference_head(head, embedding, head_cases)
    dims = export_eagle_head(head, embedding, path, dtype, taps=info.taps, order=None if identity else order,
                             fused=fused, positions=positions, opset=opset, exporter=exporter)
    return HeadExport(dims=dims, reference=reference, cases=head_cases, vocab_map=vocab_map,
                      order=None if identity else order.numpy())
