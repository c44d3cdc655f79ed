"""The mask a case's recipe makes: random additive biases, rows that see no key, sliding
windows, and the visible slots of a wrapped ring or attention-sink cache."""

from __future__ import annotations

import numpy as np

from ..cases import Q_BLOCK, VALUE_RECIPES, Case

NEG_FINITE = float(np.finfo(np.float32).min)

MASKS = ("none", "random", "rows:first", "rows:middle", "rows:last", "rows:block", "rows:far",
         "rows:negfinite", "window:W", "ring:W", "sink:S:W", *VALUE_RECIPES)


def _ring_positions(kv_len: int, last_pos: int, sink: int = 0) -> np.ndarray:
    """Position held by each slot of a ring cache (sinks pinned at slots [0, sink))
    after tokens 0..last_pos were written. -1: empty slot."""
    pos = np.full(kv_len, -1, dtype=np.int64)
    ring = kv_len - sink
    for p in range(last_pos + 1):
        slot = p if p < sink else sink + (p - sink) % ring
        pos[slot] = p
    return pos


def make_mask(case: Case, rng: np.random.Generator) -> np.ndarray | None:
    Lq, Lkv, r = case.q_len, case.kv_len, case.mask
    if r == "none" or r in VALUE_RECIPES:
        return None
    if r == "random":
        m = rng.standard_normal((Lq, Lkv)).astype(np.float32)
        m[rng.random((Lq, Lkv)) < 0.25] = -np.inf
        m[:, 0] = 0.0  # every row keeps one visible key
        return m
    if r.startswith("rows:"):
        m = (0.5 * rng.standard_normal((Lq, Lkv))).astype(np.float32)
        kind = r.split(":", 1)[1]
        if kind == "first":
            m[0] = -np.inf
        elif kind == "middle":
            m[Lq // 2] = -np.inf
        elif kind == "last":
            m[Lq - 1] = -np.inf
        elif kind == "block":
            m[:Q_BLOCK] = -np.inf
        elif kind == "far":  # row 1 sees only the last few keys, in the last key block
            m[1] = -np.inf
            m[1, Lkv - 5:] = 0.0
            m[0] = -np.inf
        elif kind == "negfinite":  # the most negative finite value instead of -inf
            m[1] = NEG_FINITE
            m[rng.random((Lq, Lkv)) < 0.2] = NEG_FINITE
            m[:, 0] = np.where(np.arange(Lq) == 1, NEG_FINITE, 0.0)
        else:
            raise ValueError(f"unknown mask {r}")
        return m
    q_pos = case.start_pos + np.arange(Lq)
    if r.startswith("window:"):
        w = int(r.split(":")[1])
        j = np.arange(Lkv)[None, :]
        vis = (j <= q_pos[:, None]) & (j > q_pos[:, None] - w)
        return np.where(vis, 0.0, -np.inf).astype(np.float32)
    if r.startswith(("ring:", "sink:")):
        parts = r.split(":")
        sink = int(parts[1]) if r.startswith("sink:") else 0
        w = int(parts[-1])
        # the cache has wrapped: the newest query sits past the end of the cache
        last = Lkv + Lkv // 2 + Lq
        q_pos = last - Lq + 1 + np.arange(Lq)
        slot_pos = _ring_positions(Lkv, last, sink)[None, :]
        vis = (slot_pos >= 0) & (slot_pos <= q_pos[:, None]) & (slot_pos > q_pos[:, None] - w)
        vis |= (slot_pos >= 0) & (slot_pos < sink)
        return np.where(vis, 0.0, -np.inf).astype(np.float32)
    raise ValueError(f"unknown mask recipe {r!r}")
