"""The inputs are read-only: every buffer a kernel is given to read, and a copy taken
before a call to tell which ones it wrote."""

from __future__ import annotations

import numpy as np

from ..native import QuantTensor, _root_array
from .case_data import CaseData


def input_buffers(data: CaseData) -> dict[str, np.ndarray]:
    """Every buffer a kernel is given to read, whole (the allocation a view lies in,
    slack included: what a stray write can reach), by what it is."""
    bufs: dict[str, np.ndarray] = {}
    for name, st in (("Q", data.q_store), ("K", data.k_store), ("V", data.v_store)):
        if isinstance(st, QuantTensor):
            bufs[name] = _root_array(st.data)
            bufs[f"{name} scales"] = _root_array(st.scale)
            if st.zero_point is not None:
                bufs[f"{name} zero points"] = _root_array(st.zero_point)
        else:
            bufs[name] = _root_array(st)
    if data.mask is not None:
        bufs["mask"] = _root_array(data.mask)
    out: dict[str, np.ndarray] = {}
    for name, a in bufs.items():  # (one allocation may hold two inputs: count it once)
        if not any(a is b for b in out.values()):
            out[name] = a
    return out


class InputGuard:
    """A copy of the inputs before a call, to tell afterwards which ones it wrote: a
    kernel that scales Q in place, dequantises into K or uses the mask as scratch can
    still return the right output, while the caller's tensors (a KV cache the next
    decode step reads) are corrupted."""

    def __init__(self, data: CaseData):
        self.bufs = input_buffers(data)
        self.before = {n: a.copy() for n, a in self.bufs.items()}

    def written(self) -> list[tuple[str, int]]:
        """(input, elements changed) for each input the call wrote, bitwise (NaN included)."""
        out = []
        for name, a in self.bufs.items():
            bits = np.dtype(f"u{a.dtype.itemsize}")
            n = int((a.reshape(-1).view(bits) != self.before[name].reshape(-1).view(bits)).sum())
            if n:
                out.append((name, n))
        return out
