"""The DFlash draft's step as a fused graph: the contract of :class:`.graph.DraftWrapper` with single-node RMS norms,
rotary embeddings and attention (export/graph/fused_ops.py, opset 23) and packed projections, as the fused target and
EAGLE-3 graphs have them.

Why: a draft pass is 8-16 rows, so ONNX Runtime's cost per node, not the arithmetic, is much of it. The plain graph
spells each norm, rotary and the grouped attention out in ~45 small nodes per layer (pow, mean, rsqrt, neg, concat,
the K/V repeated per query head), about a third of SmolLM2-135M's draft pass on a 2-core CPU. The reference is
still :class:`.model.DFlashDraft`: the export's parity check compares this graph with it.
"""

from __future__ import annotations

import torch
from torch import nn

from .model import DFlashDraft, RMSNorm


def rotary_tables(theta: float, head_dim: int, positions: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [positions, head_dim / 2]: the angles :func:`.model.rope` computes, in float32, per position."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.arange(positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


class FusedDraftWrapper(nn.Module):
    """:class:`.graph.DraftWrapper`'s inputs and outputs, fused; ``positions``: the rotary tables' rows (the bundle's
    max context)."""

    def __init__(self, draft: DFlashDraft, embedding: torch.Tensor, lm_head: torch.Tensor, positions: int) -> None:
        super().__init__()
        cfg = draft.cfg
        self.draft = draft
        self.embedding = nn.Parameter(embedding.detach(), requires_grad=False)
        self.lm_head = self.embedding if lm_head is embedding else nn.Parameter(lm_head.detach(), requires_grad=False)
        cos, sin = rotary_tables(cfg.rope_theta, cfg.head_dim, positions, draft.fc.weight.dtype)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

        def packed(*weights: torch.Tensor) -> nn.Parameter:
            return nn.Parameter(torch.cat(weights).detach(), requires_grad=False)

        attns = [layer.self_attn for layer in draft.layers]
        self.qkv = nn.ParameterList(packed(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight) for a in attns)
        self.kv = nn.ParameterList(packed(a.k_proj.weight, a.v_proj.weight) for a in attns)  # the context's
        self.gate_up = nn.ParameterList(packed(layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight)
                                        for layer in draft.layers)
        self.eval()

    @staticmethod
    def _norm(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.rms_norm(x, (x.shape[-1],), norm.weight, norm.eps)  # one RMSNormalization node

    def _heads_norm(self, norm: RMSNorm, x: torch.Tensor, heads: int) -> torch.Tensor:
        """Qwen3's norm over each head of x [1, T, heads·d] (before rotary)."""
        b, t, _ = x.shape
        return self._norm(norm, x.view(b, t, heads, -1)).reshape(b, t, -1)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, dflash_context: torch.Tensor,
                context_positions: torch.Tensor, past: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        from ..graph.fused_ops import attention, rotary

        d, cfg = self.draft, self.draft.cfg
        heads, kv_heads, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        width = kv_heads * hd
        context = self._norm(d.hidden_norm, d.fc(dflash_context))  # [1, C, H]: no input_layernorm on it
        x = nn.functional.embedding(input_ids, self.embedding)  # [1, Q, H]
        b, q_len, c = x.shape[0], x.shape[1], context.shape[1]
        present = []
        for i, layer in enumerate(d.layers):
            a = layer.self_attn
            ck, cv = nn.functional.linear(context, self.kv[i]).split([width, width], dim=-1)
            ck = rotary(self._heads_norm(a.k_norm, ck, kv_heads), context_positions, self.cos, self.sin, kv_heads)
            q, k, v = nn.functional.linear(self._norm(layer.input_layernorm, x), self.qkv[i]).split(
                [heads * hd, width, width], dim=-1)
            q = rotary(self._heads_norm(a.q_norm, q, heads), position_ids, self.cos, self.sin, heads)
            k = rotary(self._heads_norm(a.k_norm, k, kv_heads), position_ids, self.cos, self.sin, kv_heads)
            keys = torch.cat([past[2 * i].reshape(b, -1, width), ck, k], dim=1)  # [1, P + C + Q, kv·d]
            values = torch.cat([past[2 * i + 1].reshape(b, -1, width), cv, v], dim=1)
            everything = torch.ones(b, 1, q_len, keys.shape[1], dtype=torch.bool)  # no mask: the block is not causal
            x = x + a.o_proj(attention(q, keys, values, everything, hd ** -0.5, heads, kv_heads, 0.0))
            gate, up = nn.functional.linear(self._norm(layer.post_attention_layernorm, x), self.gate_up[i]).chunk(
                2, dim=-1)
            x = x + layer.mlp.down_proj(nn.functional.silu(gate) * up)
            present += [ck.view(b, c, kv_heads, hd), cv.view(b, c, kv_heads, hd)]
        logits = nn.functional.linear(self._norm(d.norm, x)[:, 1:], self.lm_head).float()  # slot 0: no logits
        return logits, *present
