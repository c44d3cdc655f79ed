"""The float64 torch oracle: explicit masks, explicit GQA head mapping,
bottom-right causal alignment with start_pos, zeros for rows that see no key."""

from __future__ import annotations

import math

import torch


def bias_matrix(q_len: int, kv_len: int, *, mask: torch.Tensor | None = None,
                is_causal: bool = False, start_pos: int = 0) -> torch.Tensor:
    """The additive [q_len, kv_len] float64 bias: mask plus -inf above the causal edge."""
    bias = torch.zeros(q_len, kv_len, dtype=torch.float64)
    if mask is not None:
        bias = bias + mask.to(torch.float64)
    if is_causal:
        i = torch.arange(q_len).unsqueeze(1)
        j = torch.arange(kv_len).unsqueeze(0)
        bias = bias.masked_fill(j > start_pos + i, -math.inf)
    return bias


def gqa_kv_head(n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """g(h) = h // (n_heads / n_kv_heads) for every query head h."""
    return torch.arange(n_heads) // (n_heads // n_kv_heads)


def sdpa_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                   mask: torch.Tensor | None = None, is_causal: bool = False,
                   start_pos: int = 0, scale: float = 0.0) -> torch.Tensor:
    """q [B, Lq, H, D], k and v [B, Lkv, Hkv, D] (real values) -> float64 [B, Lq, H, D]."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    B, Lq, H, D = q.shape
    Lkv, Hkv = k.shape[1], k.shape[2]
    if scale <= 0:
        scale = 1.0 / math.sqrt(D)
    g = gqa_kv_head(H, Hkv)
    kk, vv = k[:, :, g, :], v[:, :, g, :]                                  # [B, Lkv, H, D]
    scores = torch.einsum("bihd,bjhd->bhij", q, kk) * scale
    scores = scores + bias_matrix(Lq, Lkv, mask=mask, is_causal=is_causal, start_pos=start_pos)
    if Lkv == 0:
        return torch.zeros(B, Lq, H, D, dtype=torch.float64)
    row_max = scores.amax(dim=-1, keepdim=True)
    no_key = torch.isneginf(row_max)                                        # [B, H, Lq, 1]
    p = torch.exp(scores - torch.where(no_key, torch.zeros_like(row_max), row_max))
    denom = p.sum(dim=-1, keepdim=True)
    out = torch.einsum("bhij,bjhd->bhid", p, vv) / torch.where(no_key, torch.ones_like(denom),
                                                                denom)
    out = torch.where(no_key, torch.zeros_like(out), out)
    return out.permute(0, 2, 1, 3).contiguous()
