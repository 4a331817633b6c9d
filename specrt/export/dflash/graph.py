"""A DFlash draft as a bundle graph (``dflash.onnx``, kind "dflash" in bundle/contract.py), its vocabulary map
(``dflash_vocab.npy``) and its parity check against the PyTorch reference (:class:`.model.DFlashDraft`).

The graph is one drafting step: the new context rows' taps are fused (``fc``, ``hidden_norm``) and projected to
each layer's K/V, which it returns for the runtime's cache; the block [last token, MASK x (Q-1)] is looked up
in a frozen copy of the target's input table and run non-causally over [cached context ; new context ; block];
the target's LM head (its rows of the draft vocabulary) gives slots 1 .. Q-1. One pass drafts the whole block.

Taps: DFlash names target layer i for the residual stream AFTER it (Hugging Face ``hidden_states[i + 1]``); the
target graph's taps are the states ENTERING a layer (index L: the last layer's output, before the final norm),
so the draft reads target taps ``i + 1`` (:attr:`DraftInfo.taps`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ...bundle import contract as C
from ...bundle.manifest import ModelEntry
from ...bundle.parity import PARITY_TOLERANCE, compare_logits, within
from ...errors import DFlashDraftError, ParityError
from .checkpoint import read_draft
from .config import DFlashConfig, check_against_target
from .model import DFlashDraft

ARCHITECTURE = "dflash"
GRAPH_FILE = "dflash.onnx"
VOCAB_FILE = "dflash_vocab.npy"
# Targets whose token embedding is a plain unscaled table and whose residual stream the draft may read
DFLASH_TARGETS = ("llama", "mistral", "qwen2", "qwen3", "phi3")
TRACE_Q, TRACE_P, TRACE_C = 3, 2, 4  # distinct sizes >= 2: a size-1 or shared size would be specialised


@dataclass(frozen=True)
class DraftInfo:
    """What the export needs of a draft before any graph is written (checked against the target)."""

    source: str
    config: DFlashConfig
    vocab_map: np.ndarray | None  # int64 [D_v] ascending target ids of the draft vocabulary; None: all of them

    @property
    def taps(self) -> tuple[int, ...]:
        """The target graph's tap layers (states entering layer t) the draft reads, in its fc's order."""
        return tuple(i + 1 for i in self.config.target_layer_ids)

    @property
    def tap_width(self) -> int:
        return self.config.feature_width

    @property
    def draft_vocab(self) -> int:
        return self.config.vocab_size if self.vocab_map is None else len(self.vocab_map)


def read_dflash(path: str | Path, target_config: Any) -> DraftInfo:
    """Read and check the DFlash draft at ``path`` for the target of ``target_config`` (every refusal one line)."""
    model_type = getattr(target_config, "model_type", None)
    if model_type not in DFLASH_TARGETS:
        raise DFlashDraftError(f"DFlash drafts need a llama-style target ({', '.join(DFLASH_TARGETS)}); "
                               f"{model_type} is not one")
    cfg, _state, vocab_map = read_draft(path)
    check_against_target(cfg, target_config)
    return DraftInfo(source=str(path), config=cfg, vocab_map=vocab_map)


class DraftWrapper(nn.Module):
    """The exported step: contract inputs (block ids and positions, the new context's taps and positions, each
    layer's cached context K/V) in; the drafted slots' logits (fp32, draft vocabulary) and the new context's K/V
    out. ``embedding``: the target's input table [V, H]; ``lm_head``: its output rows of the draft vocabulary
    [D_v, H] (the same tensor as ``embedding`` for a tied head over the whole vocabulary: stored once)."""

    def __init__(self, draft: DFlashDraft, embedding: torch.Tensor, lm_head: torch.Tensor) -> None:
        super().__init__()
        self.draft = draft
        self.embedding = nn.Parameter(embedding.detach(), requires_grad=False)
        self.lm_head = self.embedding if lm_head is embedding else nn.Parameter(lm_head.detach(), requires_grad=False)
        self.eval()

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, dflash_context: torch.Tensor,
                context_positions: torch.Tensor, past: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        d = self.draft
        new_k, new_v = d.context_kv(d.context(dflash_context[0]), context_positions[0])  # [kv, C, d] per layer
        keys = [torch.cat([past[2 * i][0].transpose(0, 1), k], dim=1) for i, k in enumerate(new_k)]
        values = [torch.cat([past[2 * i + 1][0].transpose(0, 1), v], dim=1) for i, v in enumerate(new_v)]
        h = d(nn.functional.embedding(input_ids[0], self.embedding), position_ids[0], keys, values)  # [Q, H]
        logits = nn.functional.linear(h[1:], self.lm_head).float()  # slot 0 is the last token: no logits
        present = [t.transpose(0, 1)[None] for pair in zip(new_k, new_v) for t in pair]  # [1, C, kv, d] each
        return logits[None], *present


def draft_dims(cfg: DFlashConfig, draft_vocab: int) -> C.ModelDims:
    return C.ModelDims(num_layers=cfg.num_layers, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
                       head_dim=cfg.head_dim, hidden_size=cfg.hidden_size, vocab_size=draft_vocab)


def tables(target_model: nn.Module, vocab_map: np.ndarray | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(input table [V, H], LM head rows of the draft vocabulary [D_v, H]) of the target, float32; one tensor
    twice where the head is tied and the draft reads the whole vocabulary."""
    embedding = target_model.get_input_embeddings().weight.detach().float()
    head = target_model.get_output_embeddings().weight.detach().float()
    if vocab_map is not None:
        return embedding, head[torch.as_tensor(vocab_map)]
    return embedding, embedding if torch.equal(head, embedding) else head


def export_dflash_draft(draft: DFlashDraft, embedding: torch.Tensor, lm_head: torch.Tensor, path: Path, dtype: str,
                        *, opset: int = 18, exporter: str = "dynamo", fused: bool = False,
                        positions: int = 0) -> C.ModelDims:
    """Write the draft's graph to ``path`` (contract kind "dflash") in ``dtype``; returns its dims. ``fused``: single
    norm / rotary / attention nodes (.fused), whose rotary tables hold ``positions`` rows (the max context)."""
    from ..graph.trace import trace_module

    torch_dtype = getattr(torch, dtype)
    cfg = draft.cfg
    copy = DFlashDraft(cfg).to(torch_dtype)
    copy.load_state_dict(draft.state_dict())
    tied = lm_head is embedding
    table = embedding.to(torch_dtype)
    head = table if tied else lm_head.to(torch_dtype)
    if fused:
        from .fused import FusedDraftWrapper

        wrapper: nn.Module = FusedDraftWrapper(copy.eval(), table, head, positions)
    else:
        wrapper = DraftWrapper(copy.eval(), table, head)
    dims = draft_dims(cfg, lm_head.shape[0])
    ins, outs = C.dflash_io(dims, dtype, cfg.feature_width)
    ids = torch.zeros(1, TRACE_Q, dtype=torch.int64)
    pos = torch.arange(TRACE_P + TRACE_C, TRACE_P + TRACE_C + TRACE_Q)[None]
    ctx = torch.zeros(1, TRACE_C, cfg.feature_width, dtype=torch_dtype)
    ctx_pos = torch.arange(TRACE_P, TRACE_P + TRACE_C)[None]
    past = tuple(torch.zeros(1, TRACE_P, cfg.num_kv_heads, cfg.head_dim, dtype=torch_dtype)
                 for _ in range(2 * cfg.num_layers))
    trace_module(wrapper, (ids, pos, ctx, ctx_pos, past), ins, outs, path, opset, exporter, fused)
    return dims


# ---------------------------------------------------------------------------------------------------
# Parity: the graph against DFlashDraft in PyTorch fp32, called as the runtime calls it: a first pass over a
# prompt's context (no past), then a step that appends two context rows to the first pass's K/V.

@dataclass(frozen=True)
class DraftCases:
    """Inputs of the two parity passes (numpy, picklable): taps [C, width] float32 per pass, the block ids."""

    first_taps: np.ndarray
    step_taps: np.ndarray
    first_block: np.ndarray
    step_block: np.ndarray

    @classmethod
    def build(cls, taps: np.ndarray, block: int, mask_id: int, vocab: int, dtype: str) -> DraftCases:
        """From the target's own taps over a prompt ([T, width], T >= 3), rounded to the graph's dtype."""
        rounded = taps.astype(dtype).astype(np.float32)
        rng = np.random.default_rng(0)
        first, step = rng.integers(0, vocab, 2)
        return cls(first_taps=rounded[:-2], step_taps=rounded[-2:],
                   first_block=np.array([first] + [mask_id] * (block - 1), np.int64),
                   step_block=np.array([step] + [mask_id] * (block - 1), np.int64))

    def calls(self):
        """(case, taps, context positions, block ids, block positions) per pass, in order."""
        n = len(self.first_taps)
        b = len(self.first_block)
        return [("first", self.first_taps, np.arange(n), self.first_block, np.arange(n, n + b)),
                ("step", self.step_taps, np.arange(n, n + 2), self.step_block, np.arange(n + 2, n + 2 + b))]


@torch.no_grad()
def reference_draft(draft: DFlashDraft, embedding: torch.Tensor, lm_head: torch.Tensor, cases: DraftCases
                    ) -> dict[str, np.ndarray]:
    """DFlashDraft's fp32 logits per pass ([Q-1, D_v]), its context K/V kept from the first pass."""
    ref = DFlashDraft(draft.cfg).float()
    ref.load_state_dict(draft.state_dict())
    ref.eval()
    keys = values = None
    out = {}
    for case, taps, ctx_pos, block, pos in cases.calls():
        k, v = ref.context_kv(ref.context(torch.as_tensor(taps)), torch.as_tensor(ctx_pos))
        if keys is not None:
            k = [torch.cat([a, b], dim=1) for a, b in zip(keys, k)]
            v = [torch.cat([a, b], dim=1) for a, b in zip(values, v)]
        keys, values = k, v
        h = ref(embedding.float()[torch.as_tensor(block)], torch.as_tensor(pos), keys, values)
        out[case] = nn.functional.linear(h[1:], lm_head.float()).numpy()
    return out


def onnx_draft(path: Path, dims: C.ModelDims, dtype: str, cases: DraftCases) -> dict[str, np.ndarray]:
    """The graph's logits per pass on ONNX Runtime, its own first pass's context K/V fed to the step."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np_dtype = np.dtype(dtype)
    past = [np.zeros((1, 0, dims.num_kv_heads, dims.head_dim), np_dtype) for _ in range(2 * dims.num_layers)]
    names = [n for i in range(dims.num_layers) for n in (C.past_key(i), C.past_value(i))]
    new = [n for i in range(dims.num_layers) for n in (C.new_key(i), C.new_value(i))]
    out = {}
    for case, taps, ctx_pos, block, pos in cases.calls():
        feeds = {C.INPUT_IDS: block[None], C.POSITION_IDS: pos[None].astype(np.int64),
                 C.DFLASH_CONTEXT: taps[None].astype(np_dtype), C.CONTEXT_POSITIONS: ctx_pos[None].astype(np.int64),
                 **dict(zip(names, past))}
        result = dict(zip([C.LOGITS, *new], session.run([C.LOGITS, *new], feeds)))
        past = [np.concatenate([p, result[n]], axis=1) for p, n in zip(past, new)]
        out[case] = result[C.LOGITS][0]
    return out


def check_draft_parity(reference: dict[str, np.ndarray], cases: DraftCases, path: Path, dims: C.ModelDims,
                       dtype: str) -> dict[str, dict[str, float]]:
    """The graph vs :func:`reference_draft`, per pass (``abs``/``rel``/``kl``/``top1``); raises
    :class:`ParityError` beyond the tolerance for ``dtype``."""
    tol = PARITY_TOLERANCE[dtype]
    got = onnx_draft(path, dims, dtype, cases)
    figures = {case: compare_logits(ref, got[case]) for case, ref in reference.items()}
    bad = {k: f for k, f in figures.items() if not within(f, tol)}
    if bad:
        detail = ", ".join(f"{k} rel {f['rel']:.3g} kl {f['kl']:.3g}" for k, f in bad.items())
        raise ParityError(f"{path.name}: ONNX Runtime differs from the DFlash reference (PyTorch fp32) beyond "
                          f"rel {tol.rel:g} / KL {tol.kl:g} ({detail})")
    return figures


@dataclass(frozen=True)
class DraftExport:
    """What the PyTorch side hands back for the parity check and the manifest (picklable)."""

    dims: C.ModelDims
    reference: dict[str, np.ndarray]
    cases: DraftCases
    vocab_map: np.ndarray  # int64 [D_v] ascending target ids (the identity for a draft over the whole vocabulary)


def draft_torch_side(info: DraftInfo, target_model: nn.Module, taps: np.ndarray, path: Path, dtype: str, *,
                     opset: int, exporter: str, fused: bool = False, positions: int = 0) -> DraftExport:
    """Load the draft, compute its fp32 reference on the target's own ``taps`` ([T, width], its columns), write
    its graph to ``path`` (``fused``, ``positions``: as :func:`export_dflash_draft`)."""
    cfg, state, _ = read_draft(info.source)
    draft = DFlashDraft.from_state(cfg, state)
    embedding, lm_head = tables(target_model, info.vocab_map)
    cases = DraftCases.build(taps, cfg.block_size, cfg.mask_token_id, cfg.vocab_size, dtype)
    reference = reference_draft(draft, embedding, lm_head, cases)
    dims = export_dflash_draft(draft, embedding, lm_head, path, dtype, opset=opset, exporter=exporter, fused=fused,
                               positions=positions)
    vocab_map = info.vocab_map if info.vocab_map is not None else np.arange(cfg.vocab_size, dtype=np.int64)
    return DraftExport(dims=dims, reference=reference, cases=cases, vocab_map=vocab_map.astype(np.int64))


def draft_entry(info: DraftInfo, export: DraftExport, tmp: Path, dtype: str) -> ModelEntry:
    """Check the draft's graph against its PyTorch reference, write its vocabulary map; its manifest entry."""
    from ...bundle.files import graph_cost

    parity = check_draft_parity(export.reference, export.cases, tmp / GRAPH_FILE, export.dims, dtype)
    np.save(tmp / VOCAB_FILE, export.vocab_map)
    return ModelEntry(file=GRAPH_FILE, source=info.source, architecture=ARCHITECTURE, dtype=dtype, dims=export.dims,
                      parity=parity, parity_tolerance=PARITY_TOLERANCE[dtype].to_json(), kind="dflash",
                      eagle_taps=info.taps, tap_width=info.tap_width, vocab_map=VOCAB_FILE,
                      block_size=info.config.block_size, mask_token_id=info.config.mask_token_id,
                      **graph_cost(tmp / GRAPH_FILE).manifest_fields())
