"""Bench inputs: the input sets a party's calls run on, one reused (warm) or many
rotated through (cold, spanning several last-level caches)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .. import native
from .shapes import Shape

COLD_FACTOR = 4          # cold inputs span at least this many last-level caches
COLD_MAX_SETS = 4096     # input sets a party rotates through, at most
COLD_MEM_SHARE = 8       # one party's rotation takes at most 1/this of the free memory

@dataclasses.dataclass
class Inputs:
    """One set of inputs: float32 values, the stored form for our kernels, an output."""

    q32: np.ndarray
    k32: np.ndarray
    v32: np.ndarray
    q: object
    k: object
    v: object
    out: np.ndarray


def _store(x32: np.ndarray, dtype: str):
    """float32 [B, S, H, D] -> (stored object for our kernels, its real values as float32)."""
    if dtype == "f32":
        return x32, x32
    if dtype == "f16":
        s = x32.astype(np.float16)
        return s, s.astype(np.float32)
    if dtype == "bf16":
        import torch  # deferred: torch takes seconds to import; only bf16 needs it

        t = torch.from_numpy(x32).to(torch.bfloat16)
        return t.view(torch.int16).numpy().view(np.uint16), t.to(torch.float32).numpy()
    from ..inputs import quantize_per_token  # deferred: that module imports torch

    q, scale, zp = quantize_per_token(x32)
    real = ((q.astype(np.float32) - zp[..., None].astype(np.float32)) * scale[..., None])
    return native.QuantTensor(q, scale, zp), real


def _copy(x):
    if isinstance(x, native.QuantTensor):
        return native.QuantTensor(x.data.copy(), x.scale.copy(), x.zero_point.copy())
    return x.copy()


def make_inputs(shape: Shape, n_sets: int = 1, seed: int = 0) -> list[Inputs]:
    rng = np.random.default_rng(seed)
    B, H, Hkv, D = shape.batch, shape.n_heads, shape.n_kv_heads, shape.head_dim
    q32 = rng.standard_normal((B, shape.q_len, H, D), dtype=np.float32)
    k32 = rng.standard_normal((B, shape.kv_len, Hkv, D), dtype=np.float32)
    v32 = rng.standard_normal((B, shape.kv_len, Hkv, D), dtype=np.float32)
    (q, q32), (k, k32), (v, v32) = (_store(x, shape.dtype) for x in (q32, k32, v32))
    out_np = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[shape.out_dtype]
    first = Inputs(q32, k32, v32, q, k, v, np.zeros((B, shape.q_len, H, D), out_np))
    sets = [first]
    for _ in range(1, n_sets):
        sets.append(Inputs(q32, k32, v32, _copy(q), _copy(k), _copy(v),
                           np.zeros_like(first.out)))
    return sets


def cold_sets(shape: Shape, llc_bytes: int | None, avail_bytes: int | None = None) -> int:
    """How many input copies make the rotation span COLD_FACTOR last-level caches: a
    byte budget, not a count, so that a small shape is as cold as a large one (a cap
    of 64 sets would leave kv 512 rotating through 130 MB of a 300 MiB L3), short of
    that only where the free memory (avail_bytes) cannot hold it."""
    llc = llc_bytes or 32 << 20
    per = max(1, shape.bytes)
    cap = COLD_MAX_SETS
    if avail_bytes:
        cap = min(cap, avail_bytes // COLD_MEM_SHARE // per)
    return max(2, min(cap, math.ceil(COLD_FACTOR * llc / per) + 1))


def rotation_note(shape: Shape, n_sets: int, llc_bytes: int | None) -> str | None:
    """What to say when a cold rotation spans fewer than COLD_FACTOR last-level caches."""
    if not llc_bytes or n_sets * shape.bytes >= COLD_FACTOR * llc_bytes:
        return None
    return (f"{shape.name}: the cold inputs span {n_sets * shape.bytes / llc_bytes:.1f}x the "
            f"last-level cache, not {COLD_FACTOR}x (free memory): some reads may hit it")

