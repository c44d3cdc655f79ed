"""The attention a counterfactual oracle computes: the float64 oracle's arithmetic, over
the values the kernel was given as stored (stale cache slots included), with every
convention a nearby semantics may change spelled out as a field of a Setting."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..native import QuantTensor
from ..reference import gqa_kv_head


@dataclasses.dataclass(frozen=True)
class Setting:
    """What one oracle computes with. Keys a query row cannot reach (past its causal
    edge, or from `key_limit` on) are skipped, as a kernel's loop bound skips them: their
    stored values never enter the row. A mask is additive (a -inf entry still reads V)."""

    q: np.ndarray                 # float64 [B, Lq, H, D]
    k: np.ndarray                 # float64 [B, Lkv, Hkv, D]
    v: np.ndarray
    mask: np.ndarray | None       # float64 [Lq, Lkv]
    causal: bool
    offset: int                   # causal: query row i sees keys j <= offset + i
    kv_head: np.ndarray           # int [H]: the kv head each query head reads
    scale: float
    key_limit: int                # keys j >= key_limit are skipped

    def but(self, **changes) -> Setting:
        return dataclasses.replace(self, **changes)


def stored_values(store) -> np.ndarray:
    """A stored tensor as the kernel reads it, float64 (bf16 bits decoded, int8
    dequantised; NaN where the store holds NaN, stale slots included)."""
    if isinstance(store, QuantTensor):
        ints = store.data.astype(np.float64)
        if store.zero_point is not None:
            ints = ints - store.zero_point.astype(np.float64)[..., None]
        return ints * store.scale.astype(np.float64)[..., None]
    if store.dtype == np.uint16:
        bits = np.ascontiguousarray(store).astype(np.uint32) << 16
        return bits.view(np.float32).astype(np.float64)
    return store.astype(np.float64)


def true_setting(case, data) -> Setting:
    """The ABI's semantics for `case` on its stored inputs `data` (a CaseData)."""
    mask = None if data.mask is None else data.mask.astype(np.float64)
    scale = case.scale if case.scale > 0 else 1.0 / np.sqrt(case.head_dim)
    return Setting(stored_values(data.q_store), stored_values(data.k_store),
                   stored_values(data.v_store), mask, case.causal, case.start_pos,
                   gqa_kv_head(case.n_heads, case.n_kv_heads).numpy(), float(scale),
                   case.kv_len)


def reachable(s: Setting, q_len: int, kv_len: int) -> np.ndarray:
    """bool [Lq, Lkv]: the keys each query row's loop visits."""
    j = np.arange(kv_len)[None, :]
    keep = np.broadcast_to(j < s.key_limit, (q_len, kv_len))
    if s.causal:
        keep = keep & (j <= s.offset + np.arange(q_len)[:, None])
    return keep


def attend(s: Setting) -> np.ndarray:
    """float64 [B, Lq, H, D]: softmax(scale q.k + mask) v over the reachable keys; a row
    that reaches no key with a score above -inf gives zeros; a non-finite V element a row
    reaches makes that output element NaN (0 x NaN is NaN in C too)."""
    B, Lq, H, D = s.q.shape
    Lkv = s.k.shape[1]
    if Lkv == 0:
        return np.zeros((B, Lq, H, D))
    t = torch.from_numpy
    q, kk, vv = t(np.array(s.q)), t(s.k[:, :, s.kv_head]), t(s.v[:, :, s.kv_head])
    keep = t(np.array(reachable(s, Lq, Lkv)))
    k_bad = (~torch.isfinite(kk)).any(dim=-1)                            # [B, Lkv, H]
    v_ok = torch.isfinite(vv)
    if k_bad.any():  # (a NaN element of a key: that key's every score is NaN)
        kk = torch.nan_to_num(kk, nan=0.0)
    scores = torch.einsum("bihd,bjhd->bhij", q, kk) * s.scale
    if k_bad.any():
        scores = torch.where(k_bad.permute(0, 2, 1)[:, :, None, :], torch.nan, scores)
    if s.mask is not None:
        scores = scores + t(s.mask)
    scores = torch.where(keep, scores, -torch.inf)
    row_max = scores.amax(dim=-1, keepdim=True)                          # (NaN propagates)
    no_key = torch.isneginf(row_max)
    p = torch.where(keep, torch.exp(scores - torch.where(no_key, 0.0, row_max)), 0.0)
    all_ok = bool(v_ok.all())
    num = torch.einsum("bhij,bjhd->bhid", p, vv if all_ok else torch.where(v_ok, vv, 0.0))
    out = num / torch.where(no_key, 1.0, p.sum(dim=-1, keepdim=True))
    if not all_ok:
        v_hit = torch.einsum("ij,bjhd->bhid", keep.to(torch.float64),
                             (~v_ok).to(torch.float64)) > 0
        out = torch.where(v_hit, torch.nan, out)
    out = torch.where(no_key, 0.0, out)
    return out.permute(0, 2, 1, 3).contiguous().numpy()


def rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    """x rounded to F16 or BF16 (to nearest even) and back, float64."""
    if dtype == "f16":
        return x.astype(np.float32).astype(np.float16).astype(np.float64)
    return torch.from_numpy(x).to(torch.float32).to(torch.bfloat16).to(torch.float64).numpy()


def matches(out: np.ndarray, pred: np.ndarray, atol: float, rtol: float) -> tuple[bool, float]:
    """(out equals pred within atol + rtol |pred| with the same non-finite elements, the
    max |out - pred| over elements finite in both)."""
    out_bad, pred_bad = ~np.isfinite(out), ~np.isfinite(pred)
    both = ~(out_bad | pred_bad)
    with np.errstate(invalid="ignore"):
        err = np.where(both, np.abs(out - pred), 0.0)
    worst = float(err.max()) if err.size else 0.0
    ok = bool((out_bad == pred_bad).all()
              and (err <= atol + rtol * np.where(both, np.abs(pred), 0.0)).all())
    return ok, worst
