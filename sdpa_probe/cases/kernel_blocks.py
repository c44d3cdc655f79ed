"""The block sizes of the built-in kernels (native/src/flash_core.h, flash_x512.h): the
matrix puts its lengths at a block -1, +0 and +1, where partial-block bugs live.

Query and key blocks: Q_BLOCK x KV_BLOCK. Decode sizes its key blocks in bytes: at
most 16 F32, 32 F16/BF16, 64 int8 keys, fewer (down to 16) when a position's K and V
over every kv head exceed 64 KiB (F32) / 128 KiB per block, as with many kv heads of
head_dim 128. On an AVX-512 build, decode tasks (at most 16 rows per kv head, a divisor
of 16) take every kv head of X512_KV_BLOCK keys at a time instead."""

from __future__ import annotations

from ..workload import ITEMSIZE

Q_BLOCK, KV_BLOCK = 32, 128
X512_KV_BLOCK = 32
DECODE_KV_BLOCK = {"f32": 16, "f16": 32, "bf16": 32, "i8": 64}
DECODE_BLOCK_BYTES = {"f32": 64 << 10, "f16": 128 << 10, "bf16": 128 << 10, "i8": 128 << 10}
DECODE_MIN_KEYS = 16


def decode_kv_block(dtype: str, n_kv_heads: int, head_dim: int) -> int:
    """Keys per decode block of the built-in kernels for this shape (flash_setup in
    native/src/flash_plan.c)."""
    per_key = n_kv_heads * head_dim * 2 * ITEMSIZE[dtype]
    return max(DECODE_MIN_KEYS, min(DECODE_KV_BLOCK[dtype], DECODE_BLOCK_BYTES[dtype] // per_key))
