"""The memory a cache size costs at a model's KV shape (the simulation itself uses a
small head shape: which keys a query sees does not depend on it)."""

from __future__ import annotations

import dataclasses

from ..errors import ProbeError
from ..limits import check_count

KV_DTYPES = {"f32": 4, "f16": 2, "bf16": 2, "i8": 1, "int8": 1}  # (i8 as everywhere else)
MIB = float(1 << 20)
MAX_DIM = 1 << 24  # as probe profile's model shapes: above 16M is not a decoder anyone runs


@dataclasses.dataclass(frozen=True)
class KVShape:
    """The model whose cache is being sized (memory only; the simulation uses a small
    head shape, since which keys a query sees does not depend on it)."""

    layers: int = 16
    kv_heads: int = 8
    head_dim: int = 64
    dtype: str = "f16"

    def validate(self) -> KVShape:
        if self.layers < 1 or self.kv_heads < 1 or self.head_dim < 1:
            raise ProbeError("--layers, --kv-heads and --head-dim must be >= 1")
        for option, value in (("--layers", self.layers), ("--kv-heads", self.kv_heads),
                              ("--head-dim", self.head_dim)):
            check_count(value, option, 1, MAX_DIM, "as probe profile's shapes")
        if self.dtype not in KV_DTYPES:
            raise ProbeError(f"--dtype must be one of f32, f16, bf16, i8 (or int8), "
                             f"got {self.dtype!r}")
        return self

    @property
    def bytes_per_slot(self) -> int:
        """K and V of one position in every layer (int8: plus a float32 scale and an int8
        zero point per token and head)."""
        int8 = self.dtype in ("i8", "int8")
        per_head = self.head_dim * KV_DTYPES[self.dtype] + (5 if int8 else 0)
        return 2 * self.layers * self.kv_heads * per_head

    def describe(self) -> str:
        return (f"{self.layers} layers x {self.kv_heads} kv heads x {self.head_dim} head dim, "
                f"{self.dtype}")

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["bytes_per_slot"] = self.bytes_per_slot
        return d


def mib(nbytes: float) -> float:
    return nbytes / MIB
