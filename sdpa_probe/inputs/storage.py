"""Values in their storage dtype: F32, F16, BF16 bits, int8 per token (symmetric or with
zero points), placed per layout; and the stale slots of a static cache."""

from __future__ import annotations

import numpy as np
import torch

from ..native import QuantTensor
from .placement import FENCES, place

STORAGE_NP = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16, "i8": np.int8}

NAN_BITS = {np.dtype(np.float32): (np.uint32, 0x7FC00000),
            np.dtype(np.float16): (np.uint16, 0x7E00), np.dtype(np.uint16): (np.uint16, 0x7FC0)}


def quantize_symmetric(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per (b, s, h) over the last dim: real = q * scale, no zero point."""
    amax = np.abs(x).max(axis=-1)
    scale = np.where(amax > 0, amax / 127.0, 1.0)
    q = np.clip(np.round(x / scale[..., None]), -127, 127)
    return q.astype(np.int8), scale.astype(np.float32)


def quantize_per_token(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Asymmetric int8 per (b, s, h) over the last dim: real = (q - zp) * scale."""
    lo = x.min(axis=-1)
    hi = x.max(axis=-1)
    rng_ = hi - lo
    scale = np.where(rng_ > 0, rng_ / 255.0, np.where(np.abs(hi) > 0, np.abs(hi) / 127.0, 1.0))
    zp = np.clip(np.round(-128.0 - lo / scale), -128, 127)
    q = np.clip(np.round(x / scale[..., None] + zp[..., None]), -128, 127)
    return q.astype(np.int8), scale.astype(np.float32), zp.astype(np.int8)


def to_storage(x64: np.ndarray, dtype: str, layout: str, slack: int, symmetric: bool = False,
           name: str = ""):
    """x64 [B, S, H, D] -> (stored real values as float64, storage object); name (Q, K,
    V) labels a fenced buffer."""
    if dtype == "f32":
        s = x64.astype(np.float32)
        return s.astype(np.float64), place(s, layout, slack, name)
    if dtype == "f16":
        s = x64.astype(np.float16)
        return s.astype(np.float64), place(s, layout, slack, name)
    if dtype == "bf16":
        t = torch.from_numpy(x64).to(torch.bfloat16)
        bits = t.view(torch.int16).numpy().view(np.uint16)
        return t.to(torch.float64).numpy(), place(bits, layout, slack, name)
    ql = layout if layout in ("offset", "reversed", *FENCES) else "bshd"
    if symmetric:  # no zero-point array at all: the ABI's NULL
        q, scale = quantize_symmetric(x64)
        real = q.astype(np.float64) * scale[..., None]
        return real, QuantTensor(place(q, layout, slack, name),
                                 place(scale[..., None], ql, slack, f"{name} scales")[..., 0],
                                 None)
    q, scale, zp = quantize_per_token(x64)
    real = (q.astype(np.float64) - zp[..., None].astype(np.float64)) * scale[..., None]
    qv = place(q, layout, slack, name)
    # scale / zero point with the same slack; NaN scales past kv_len poison over-reads
    sc = place(scale[..., None], ql, slack, f"{name} scales")[..., 0]
    zpv = place(zp[..., None], ql, slack, f"{name} zero points")[..., 0]
    return real, QuantTensor(qv, sc, zpv)


def poison_future_slots(stored, first: int) -> None:
    """NaN in the stored K / V of positions >= first (int8: their scales), which
    bottom-right causal hides from every query row. A static KV cache holds stale
    or uninitialised slots there; a kernel that still multiplies them in (an
    additive -inf on their scores, then 0 x V) turns garbage into NaN rows. The
    real values the oracle and torch get stay finite: those keys weigh exactly 0."""
    if isinstance(stored, QuantTensor):
        stored.scale[:, first:] = np.nan
    elif stored.dtype == np.uint16:
        stored[:, first:] = NAN_BITS[np.dtype(np.uint16)][1]
    else:
        stored[:, first:] = np.nan
