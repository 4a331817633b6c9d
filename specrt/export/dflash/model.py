"""The PyTorch reference DFlash draft (:class:`DFlashDraft`): z-lab's ``DFlashDraftModel`` written plainly for one
sequence, with the context's K/V computed apart from the block pass, as a runtime caches them.

One drafting step, for a block of B slots at positions start .. start+B-1 after ``start`` committed tokens:
the context is the target's tapped states of the committed tokens, fused once (:meth:`DFlashDraft.context`) and
projected to each layer's K/V (:meth:`DFlashDraft.context_kv`); the block is the target's embeddings of
[last sampled token, MASK x (B-1)], run through every layer attending, without a causal mask, over
[context K/V ; block K/V] (:meth:`DFlashDraft.forward`). The target's LM head on output row k >= 1 gives the
token at position start+k (row 0 is unused)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ...errors import DFlashDraftError
from .config import DFlashConfig


def _wide(dtype: torch.dtype) -> torch.dtype:
    """Where reductions run: at least float32 (as Qwen3's norm and softmax do for half weights), float64 stays."""
    return torch.promote_types(dtype, torch.float32)


class RMSNorm(nn.Module):
    """Qwen3RMSNorm: x / rms(x) over the last axis, computed wide, then scaled by ``weight`` in x's dtype."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        wide = x.to(_wide(x.dtype))
        return self.weight * (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def rope(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """Qwen3's rotary embedding of x [heads, T, d] at positions [T]: the neox layout, where dimension j pairs
    with j + d/2 (``rotate_half``), and frequency theta^(-2j/d)."""
    d = x.shape[-1]
    dtype = _wide(x.dtype)  # angles in float32 as transformers computes them (float64 for a float64 draft)
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=dtype) / d)  # [d/2]
    angles = positions.to(dtype)[:, None] * inv_freq[None, :]  # [T, d/2]
    angles = torch.cat([angles, angles], dim=-1)  # [T, d]: both halves of a pair turn by the same angle
    rotated = torch.cat([-x[..., d // 2:], x[..., :d // 2]], dim=-1)
    return x * angles.cos().to(x.dtype) + rotated * angles.sin().to(x.dtype)


class DFlashAttention(nn.Module):
    """Qwen3 attention (GQA, an RMSNorm over each query and key head before rope, no biases), non-causal, its
    keys and values [context ; block]."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim, self.theta = cfg.num_heads, cfg.num_kv_heads, d, cfg.rope_theta
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def keys_values(self, rows: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """K (k_proj -> k_norm -> rope) and V (v_proj), each [kv_heads, T, d], of rows [T, H] at positions [T]."""
        t = rows.shape[0]
        k = self.k_norm(self.k_proj(rows).view(t, self.kv_heads, self.head_dim)).transpose(0, 1)
        v = self.v_proj(rows).view(t, self.kv_heads, self.head_dim).transpose(0, 1)
        return rope(k, positions, self.theta), v

    def forward(self, h: Tensor, positions: Tensor, past_k: Tensor, past_v: Tensor) -> Tensor:
        """h [B, H] (the normed block rows) at positions [B], past K/V [kv_heads, T, d] -> [B, H]."""
        b = h.shape[0]
        q = self.q_norm(self.q_proj(h).view(b, self.heads, self.head_dim)).transpose(0, 1)  # [heads, B, d]
        q = rope(q, positions, self.theta)
        k, v = self.keys_values(h, positions)
        k, v = torch.cat([past_k, k], dim=1), torch.cat([past_v, v], dim=1)  # [kv_heads, T+B, d]
        group = self.heads // self.kv_heads  # query head j reads kv head j // group (transformers' repeat_kv)
        k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)  # [heads, T+B, d]
        # no mask: every block row sees the whole context and the whole block, the later slots included
        scores = (q @ k.transpose(1, 2)) * self.head_dim ** -0.5  # [heads, B, T+B]
        probs = scores.to(_wide(scores.dtype)).softmax(dim=-1).to(q.dtype)
        out = (probs @ v).transpose(0, 1).reshape(b, self.heads * self.head_dim)  # [B, heads*d]
        return self.o_proj(out)


class SwiGLU(nn.Module):
    """Qwen3's MLP: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashLayer(nn.Module):
    """A pre-norm Qwen3 decoder layer. Only the block rows carry a residual stream; the context enters through
    the K/V it is given, the same fused context in every layer."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DFlashAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: Tensor, positions: Tensor, past_k: Tensor, past_v: Tensor) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, past_k, past_v)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraft(nn.Module):
    """The draft body under z-lab's weight names. It has no embedding and no LM head: both are the target's."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(cfg.feature_width, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    @classmethod
    def from_state(cls, cfg: DFlashConfig, state: dict[str, Tensor], *,
                   dtype: torch.dtype = torch.float32) -> DFlashDraft:
        """The draft in eval mode with ``state`` (what :func:`.checkpoint.read_draft` returns) loaded strictly,
        its weights cast to ``dtype`` (published drafts are bfloat16)."""
        draft = cls(cfg).to(dtype)
        try:
            draft.load_state_dict(state, strict=True)  # copying casts each tensor to the parameter's dtype
        except RuntimeError as e:
            raise DFlashDraftError(f"the weights do not fit this DFlash config ({str(e).splitlines()[0]}); "
                                   "read them with read_draft") from None
        return draft.eval()

    def context(self, features: Tensor) -> Tensor:
        """features [T, n*H] (the tapped target states, in target_layer_ids order) -> fused context [T, H]."""
        return self.hidden_norm(self.fc(features))

    def context_kv(self, fused: Tensor, positions: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """Each layer's (K, V), [kv_heads, T, d], of the fused context [T, H] at its token positions [T]. The
        context goes straight into k_proj / v_proj: no input_layernorm (z-lab's attention takes it so)."""
        pairs = [layer.self_attn.keys_values(fused, positions) for layer in self.layers]
        return [k for k, _ in pairs], [v for _, v in pairs]

    def forward(self, block_embeddings: Tensor, block_positions: Tensor, past_k: Sequence[Tensor],
                past_v: Sequence[Tensor]) -> Tensor:
        """block_embeddings [B, H] at block_positions [B], each layer's context K/V [kv_heads, T, d]
        (:meth:`context_kv`) -> the final-normed hidden states [B, H], for the target's LM head."""
        if len(past_k) != len(self.layers) or len(past_v) != len(self.layers):
            raise DFlashDraftError(f"the draft has {len(self.layers)} layers but was given context K/V for "
                                   f"{len(past_k)} and {len(past_v)}; pass context_kv's output")
        x = block_embeddings
        for layer, k, v in zip(self.layers, past_k, past_v):
            x = layer(x, block_positions, k, v)
        return self.norm(x)
