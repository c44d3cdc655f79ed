"""A case's inputs from its seed: the values (the oracle's, as stored), the stored
buffers a kernel reads and the mask."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..cases import ZERO_ROWS_EVERY, ZERO_ROWS_FIRST, Case
from ..native import QuantTensor
from .masks import make_mask
from .placement import padded_mask, tensor_layouts
from .storage import poison_future_slots, to_storage

KV_SLACK = 16      # cache slots past kv_len, NaN


@dataclasses.dataclass
class CaseData:
    case: Case
    q: torch.Tensor            # real (stored, dequantised) values, float64 [B, Lq, H, D]
    k: torch.Tensor            # float64 [B, Lkv, Hkv, D]
    v: torch.Tensor
    mask: np.ndarray | None    # float32 [Lq, Lkv]
    q_store: object            # np.ndarray view or QuantTensor
    k_store: object
    v_store: object

    @property
    def mask_t(self) -> torch.Tensor | None:
        return None if self.mask is None else torch.from_numpy(self.mask)


def _nan_sites(case: Case) -> list[tuple[str, int, int, int]]:
    """Where the nan-inputs recipe puts its NaN, as (tensor, position, head, dim): one
    element of K (kv head 0) and of V (kv head 1), each at a key every row sees, and
    one of Q (row 0 of the last head). The rows that read one are NaN, as in torch;
    the last kv head's other rows stay finite, so a kernel that gives NaN everywhere
    fails too. A kernel whose running max passes over NaN (`if (s > mx) mx = s`) takes
    a row whose every score is NaN for one that sees no key and gives zeros. int8
    values cannot be NaN: there the token's scale is. (Keys hidden from only some
    rows are left alone: whether NaN + -inf reaches such a row is a matter of
    convention, and torch's math and flash paths differ.)"""
    if case.n_kv_heads < 3:
        raise ValueError("nan-inputs: at least 3 kv heads (one of them left clean)")
    seen = min(case.start_pos + 1, case.kv_len) if case.causal else case.kv_len
    D = case.head_dim
    return [("k", seen // 2, 0, 5 % D), ("v", seen // 3, 1, 7 % D),
            ("q", 0, case.n_heads - 1, 3 % D)]


def materialise(case: Case) -> CaseData:
    rng = np.random.default_rng([case.seed, 0x5D9A])
    B, Lq, H, Hkv, D, Lkv = (case.batch, case.q_len, case.n_heads, case.n_kv_heads,
                             case.head_dim, case.kv_len)
    q = rng.standard_normal((B, Lq, H, D)) * case.magnitude
    k = rng.standard_normal((B, Lkv, Hkv, D)) * case.magnitude
    v = rng.standard_normal((B, Lkv, Hkv, D)) * case.v_magnitude
    nan_sites = _nan_sites(case) if case.mask == "nan-inputs" else []
    for name, j, h, d in nan_sites:  # (in an int8 tensor: its token's scale, below)
        if (case.out_dtype if name == "q" else case.dtype) != "i8":
            {"q": q, "k": k, "v": v}[name][:, j, h, d] = np.nan
    if case.mask == "constant-token" and Lkv > 5:
        k[:, 3] = 0.75      # a constant token: zero quantization range
        v[:, 5] = -1.25
        v[:, 4] = 0.0
    if case.mask == "zero-tokens":
        v[:, ZERO_ROWS_FIRST::ZERO_ROWS_EVERY] = 0.0  # (cases.ZERO_ROWS_*)
    mask = padded_mask(make_mask(case, rng), case.layout)
    lq, lk, lv = tensor_layouts(case.layout)
    sym = case.quant == "sym"
    q_real, q_store = to_storage(q, case.out_dtype, lq, 0, sym, "Q")
    k_real, k_store = to_storage(k, case.dtype, lk, KV_SLACK, sym, "K")
    v_real, v_store = to_storage(v, case.dtype, lv, KV_SLACK, sym, "V")
    stored = {"q": (q_real, q_store), "k": (k_real, k_store), "v": (v_real, v_store)}
    for name, j, h, _d in nan_sites:  # int8: the token's scale, and so all its real values
        real, store = stored[name]
        if isinstance(store, QuantTensor):
            store.scale[:, j, h] = np.nan
            real[:, j, h, :] = np.nan
    if case.causal:  # cache slots no row can see: stale or never written in a real cache
        poison_future_slots(k_store, case.start_pos + Lq)
        poison_future_slots(v_store, case.start_pos + Lq)
    t = torch.from_numpy
    return CaseData(case, t(q_real), t(k_real), t(v_real), mask, q_store, k_store, v_store)
