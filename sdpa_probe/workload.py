"""One SDPA call's work, counted once: the FLOPs and the unique bytes that `probe
check` lists for a case and `probe bench` turns into GFLOP/s, GB/s and roofline
shares. A check case and a bench shape both hand their parameters to a Workload."""

from __future__ import annotations

import dataclasses

ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2, "i8": 1}
SCALE_BYTES = 4       # an int8 token's F32 scale
ZERO_POINT_BYTES = 1  # ... and its int8 zero point (asymmetric quantisation only)


@dataclasses.dataclass(frozen=True)
class Workload:
    batch: int
    n_heads: int
    n_kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    dtype: str            # K and V's storage
    q_dtype: str = ""     # Q's (and the output's) when not dtype's: "f32" over a low cache
    causal: bool = False
    start_pos: int = 0    # bottom-right causal alignment: query i sits at start_pos + i
    quant: str = "asym"   # int8: asym (a zero point per token) or sym

    @property
    def out_dtype(self) -> str:
        """The output's dtype: Q's, and F32 for an int8 query."""
        q = self.q_dtype or self.dtype
        return "f32" if q == "i8" else q

    def _row_bytes(self, dtype: str) -> int:
        """A head_dim row in `dtype`, with its per-token scale and zero point for int8."""
        meta = 0
        if dtype == "i8":
            meta = SCALE_BYTES + (ZERO_POINT_BYTES if self.quant == "asym" else 0)
        return self.head_dim * ITEMSIZE[dtype] + meta

    def visible_pairs(self) -> int:
        """(query, key) pairs the queries see, per batch entry and head: all of them, or
        under the causal edge."""
        if not self.causal:
            return self.q_len * self.kv_len
        return sum(max(0, min(self.kv_len, self.start_pos + i + 1)) for i in range(self.q_len))

    @property
    def flops(self) -> int:
        """2 flops per multiply-add of Q.K^T and P.V over the visible pairs."""
        return 4 * self.batch * self.n_heads * self.visible_pairs() * self.head_dim

    @property
    def kv_elements(self) -> int:
        """K and V elements: what a kernel converts to F32 (once each, at best)."""
        return 2 * self.batch * self.kv_len * self.n_kv_heads * self.head_dim

    @property
    def kv_bytes(self) -> int:
        """Unique K and V bytes, int8 metadata included."""
        return 2 * self.batch * self.kv_len * self.n_kv_heads * self._row_bytes(self.dtype)

    @property
    def bytes(self) -> int:
        """Unique bytes per call: Q, K and V read once, the output written once."""
        rows = self.batch * self.q_len * self.n_heads
        q = rows * self._row_bytes(self.q_dtype or self.dtype)
        out = rows * self.head_dim * ITEMSIZE[self.out_dtype]
        return q + self.kv_bytes + out
