"""The random suite: `--suite random --seed N` draws a slice of RANDOM_CASES cases from
the whole parameter space, a new slice for every N."""

from __future__ import annotations

import dataclasses
import math
import random

from .case import ZERO_ROWS_FIRST, Case

# The fixed matrix names the edges known to matter; `--suite random --seed N` draws
# RANDOM_CASES more from the whole parameter space (head counts and groups, head_dim,
# lengths, dtypes, causal offsets, masks, layouts, scales, threads, batch), a new slice
# for every N, for the bugs nobody thought to list. Case i of slice N has seed
# RANDOM_SEED_STRIDE * (N + 1) + i: its id names its slice and index, so --repro and
# --last-failed find it again.
RANDOM_CASES = 64
RANDOM_SEED_STRIDE = 1000
RANDOM_MAX_FLOPS = 2e8     # a case's work, so that a slice runs in seconds
RANDOM_LAYOUTS = ("bshd",) * 5 + ("bhsd", "padded", "dmajor", "vdmajor", "offset", "qfused")
RANDOM_HEAD_DIMS = (64, 64, 128, 128, 16, 32, 48, 80, 96, 112, 256, 8, 3, 17, 72)


def random_case(slice_seed: int, i: int) -> Case:
    """Case i of random slice slice_seed (drawn from its own stream: the same case
    whatever the slice's length)."""
    r = random.Random(f"sdpa_probe-random-{slice_seed}-{i}")
    dtype = r.choice(("f32", "f32", "f16", "bf16", "i8"))
    n_kv = r.choice((1, 1, 2, 2, 3, 4, 8))
    group = r.choice((1, 2, 3, 4, 4, 5, 7, 8))
    n_heads = n_kv * group
    head_dim = r.choice(RANDOM_HEAD_DIMS)
    q_len = 1 if r.random() < 0.5 else r.randint(2, 80)
    kv_len = 0 if r.random() < 0.03 else int(math.exp(r.uniform(0.0, math.log(4000.0))))
    batch = r.choice((1, 1, 1, 1, 2, 3))
    # bounded work (Case.flops, a key counted for an empty cache): fewer keys, then rows
    def flops() -> int:
        return 4 * batch * n_heads * q_len * max(kv_len, 1) * head_dim

    while kv_len > 1 and flops() > RANDOM_MAX_FLOPS:
        kv_len //= 2
    while q_len > 1 and flops() > RANDOM_MAX_FLOPS:
        q_len //= 2
    causal = kv_len > 0 and r.random() < 0.5
    start_pos = 0
    if causal:
        bottom = max(0, kv_len - q_len)
        start_pos = bottom if r.random() < 0.7 else r.randint(0, bottom)
    mask = "none"
    if kv_len > 0:
        u = r.random()
        if u < 0.25:
            mask = "random"
        elif u < 0.35:
            mask = f"window:{r.randint(1, kv_len)}"
        elif u < 0.42:
            mask = r.choice(("rows:first", "rows:middle", "rows:last"))
    q_dtype = "f32" if dtype != "f32" and r.random() < 0.2 else ""
    layout = r.choice(RANDOM_LAYOUTS)
    if layout == "qfused" and q_dtype:
        layout = "bshd"  # (a fused QKV output holds Q in the cache's dtype)
    case = Case(
        "random", batch=batch, n_heads=n_heads, n_kv_heads=n_kv, q_len=q_len, kv_len=kv_len,
        head_dim=head_dim, dtype=dtype, causal=causal, start_pos=start_pos, mask=mask,
        layout=layout, scale=round(r.uniform(0.02, 0.5), 3) if r.random() < 0.15 else 0.0,
        magnitude=r.choice((0.01, 10.0)) if r.random() < 0.1 else 1.0,
        quant="sym" if dtype == "i8" and r.random() < 0.25 else "asym", q_dtype=q_dtype,
        n_threads=r.choice((1, 1, 2, 3, 8)), seed=RANDOM_SEED_STRIDE * (slice_seed + 1) + i)
    # the fenced and reversed layouts, drawn last so that every draw above (and so every
    # case of the slices measured before they existed) stays as it was: a quarter of the
    # plain ones
    if layout == "bshd" and r.random() < 0.25:
        case = dataclasses.replace(case, layout=r.choice(("fenced", "fenced-start", "reversed")))
    # int8 V rows of zeros (V at 0.01, as the matrix's), drawn after those
    if dtype == "i8" and mask == "none" and kv_len > ZERO_ROWS_FIRST and r.random() < 0.25:
        case = dataclasses.replace(case, mask="zero-tokens", v_magnitude=0.01)
    return case


def random_cases(slice_seed: int = 0, n: int = RANDOM_CASES) -> list[Case]:
    if slice_seed < 0:
        raise ValueError("the random suite's seed is >= 0")
    return [random_case(slice_seed, i) for i in range(n)]
