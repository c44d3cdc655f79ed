"""A case's buffers from given values rather than its seed: the metamorphic relations'
transformed calls (keys permuted, V scaled, a key appended) laid out as the case's own
inputs are, in the same storage dtype and layout, stale slots and slack included."""

from __future__ import annotations

import numpy as np
import torch

from ..cases import Case
from .case_data import KV_SLACK, CaseData
from .placement import padded_mask, tensor_layouts
from .storage import poison_future_slots, to_storage


def from_values(case: Case, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                mask: np.ndarray | None) -> CaseData:
    """CaseData for `case` holding these values (float64 [B, S, H, D]; mask float32
    [Lq, Lkv] or None). Values already stored in the case's dtype store unchanged
    (int8: per token, so a permutation or a power-of-two scale of V keeps its codes)."""
    lq, lk, lv = tensor_layouts(case.layout)
    sym = case.quant == "sym"
    q_real, q_store = to_storage(q, case.out_dtype, lq, 0, sym, "Q")
    k_real, k_store = to_storage(k, case.dtype, lk, KV_SLACK, sym, "K")
    v_real, v_store = to_storage(v, case.dtype, lv, KV_SLACK, sym, "V")
    mask = None if mask is None else np.ascontiguousarray(mask, dtype=np.float32)
    stored_mask = padded_mask(mask, case.layout)
    if case.causal:
        poison_future_slots(k_store, case.start_pos + case.q_len)
        poison_future_slots(v_store, case.start_pos + case.q_len)
    t = torch.from_numpy
    return CaseData(case, t(q_real), t(k_real), t(v_real), stored_mask, q_store, k_store,
                    v_store)
