"""What a row may see: causal edges with a KV-cache offset, additive masks, rows that
see nothing, NaN inputs, sliding windows, rings and attention sinks."""

from __future__ import annotations

from ..case import Case
from ..kernel_blocks import KV_BLOCK, Q_BLOCK, X512_KV_BLOCK


def causal_offsets() -> list[Case]:
    """Causal edges with a KV-cache offset, and a start_pos without one."""
    cs: list[Case] = []
    for q, kv, sp in ((1, 100, 99), (4, 100, 96), (7, 135, 128), (3, 60, 0), (5, 80, 40)):
        cs.append(Case("causal", q_len=q, kv_len=kv, causal=True, start_pos=sp,
                       n_heads=4, n_kv_heads=2))
    # a start_pos with is_causal off: every key visible to every row (a kernel that takes
    # a given start_pos for a causal edge hides the keys past it)
    cs.append(Case("causal", q_len=4, kv_len=100, start_pos=40, n_heads=4, n_kv_heads=2))
    cs.append(Case("causal", q_len=1, kv_len=X512_KV_BLOCK * 2 + 3, start_pos=20, dtype="f16",
                   n_heads=8, n_kv_heads=2))
    cs.append(Case("causal", q_len=2, kv_len=70, start_pos=30, dtype="i8", n_heads=8,
                   n_kv_heads=2))
    return cs


def masks() -> list[Case]:
    """Additive masks, with and without causal, under large logits, on every path."""
    cs: list[Case] = []
    cs.append(Case("mask", q_len=6, kv_len=140, mask="random", n_heads=4, n_kv_heads=2))
    cs.append(Case("mask", q_len=6, kv_len=140, mask="random", causal=True, start_pos=134,
                   n_heads=4, n_kv_heads=2))
    cs.append(Case("mask", q_len=1, kv_len=300, mask="random", n_heads=8, n_kv_heads=2))
    # a mask over a causal edge 34 keys short of the cache's end, int8: the slots past the
    # edge hold stale NaN scales (inputs/storage.py) that a kernel reading every key under
    # the mask must not let through (0 x NaN); found by the random suite in ExecuTorch 1.5.1's
    # quantized op, NaN in every row (finite scales there: it passes), where its float op
    # and the bottom-edge cases pass
    cs.append(Case("mask", q_len=6, kv_len=140, mask="window:40", causal=True, start_pos=100,
                   dtype="i8", n_heads=4, n_kv_heads=2))
    # large logits under a mask: a hidden key with the row's largest raw score must not set
    # the softmax's max (the visible keys' weights would underflow to zero)
    cs.append(Case("mask", q_len=6, kv_len=140, mask="random", magnitude=100.0, n_heads=4,
                   n_kv_heads=2))
    cs.append(Case("mask", q_len=1, kv_len=300, mask="random", magnitude=100.0, n_heads=8,
                   n_kv_heads=2))
    # the same through the low-precision paths: a mask read as hidden / visible only (its
    # finite biases dropped), or a softmax without its max, on the F16 / BF16 / int8 path
    # alone passed every case, the random masks and large logits being F32 (and int8
    # decode) only
    cs.append(Case("mask", q_len=1, kv_len=300, mask="random", n_heads=8, n_kv_heads=2,
                   dtype="f16"))
    cs.append(Case("mask", q_len=6, kv_len=140, mask="random", causal=True, start_pos=134,
                   n_heads=4, n_kv_heads=2, dtype="f16"))
    cs.append(Case("mask", q_len=2, kv_len=140, mask="random", n_heads=4, n_kv_heads=2,
                   dtype="bf16"))
    cs.append(Case("mask", q_len=1, kv_len=300, mask="random", magnitude=100.0, n_heads=8,
                   n_kv_heads=2, dtype="i8"))
    return cs


def fully_masked_rows() -> list[Case]:
    """Query rows that see no key, and an empty cache."""
    cs: list[Case] = []
    for where in ("first", "middle", "last"):
        cs.append(Case("masked-rows", q_len=5, kv_len=140, mask=f"rows:{where}",
                       n_heads=4, n_kv_heads=2))
    cs.append(Case("masked-rows", q_len=Q_BLOCK + 8, kv_len=150, mask="rows:block",
                   n_heads=4, n_kv_heads=2))
    cs.append(Case("masked-rows", q_len=1, kv_len=200, mask="rows:first", n_heads=8,
                   n_kv_heads=2))
    cs.append(Case("masked-rows", q_len=4, kv_len=3 * KV_BLOCK + 5, mask="rows:far",
                   n_heads=4, n_kv_heads=2))
    cs.append(Case("masked-rows", q_len=4, kv_len=140, mask="rows:negfinite",
                   n_heads=4, n_kv_heads=2))
    cs.append(Case("masked-rows", q_len=3, kv_len=70, mask="rows:first", dtype="f16",
                   n_heads=4, n_kv_heads=2))
    # an empty cache (kv_len 0, K and V NULL): every row sees no key, zeros; a kernel that
    # reads a first key (a hoisted load, a scale) before its loop dereferences NULL
    cs.append(Case("masked-rows", q_len=2, kv_len=0, n_heads=4, n_kv_heads=2))
    for dt in ("f16", "i8"):  # (the per-dtype paths: an int8 scale or F16 K read early)
        cs.append(Case("masked-rows", q_len=1, kv_len=0, n_heads=8, n_kv_heads=2, dtype=dt))
    return cs


def nan_inputs() -> list[Case]:
    """NaN in visible inputs: the rows that read one NaN, the rest finite."""
    cs: list[Case] = []
    # NaN in visible inputs (K, V and Q; int8: their scales): the rows that read one are
    # NaN, the rest finite
    cs.append(Case("nan", kv_len=2 * X512_KV_BLOCK + 5, mask="nan-inputs", n_heads=12,
                   n_kv_heads=3, dtype="i8"))
    for dt in ("f32", "f16"):
        cs.append(Case("nan", q_len=3, kv_len=100, causal=True, start_pos=97, mask="nan-inputs",
                       n_heads=6, n_kv_heads=3, dtype=dt))
        cs.append(Case("nan", kv_len=2 * X512_KV_BLOCK + 5, mask="nan-inputs", n_heads=12,
                       n_kv_heads=3, dtype=dt))
    return cs


def windows_rings_sinks() -> list[Case]:
    """Sliding windows, wrapped rings and attention sinks."""
    cs: list[Case] = []
    # sliding window, wrapped ring and attention sinks over caches out of position order
    cs.append(Case("window", q_len=4, kv_len=300, mask="window:100", causal=True,
                   start_pos=296, n_heads=4, n_kv_heads=2))
    cs.append(Case("window", q_len=40, kv_len=300, mask="window:64", causal=True,
                   start_pos=260, n_heads=4, n_kv_heads=2))
    # a window far down a long cache: the first ~2000 keys are masked for every row, so
    # whole blocks of up to 1024 keys (and a 2-way split's first range) see no key; a
    # kernel that does not skip an empty block (-inf - -inf) or merge an empty split
    # safely fails here whatever its block size (docs/check.md, the tiling sweep)
    cs.append(Case("window", q_len=1, kv_len=2100, mask="window:64", causal=True,
                   start_pos=2099, n_heads=8, n_kv_heads=2))
    cs.append(Case("window", q_len=3, kv_len=2100, mask="window:64", causal=True,
                   start_pos=2097, n_heads=4, n_kv_heads=2, dtype="i8"))
    cs.append(Case("ring", q_len=1, kv_len=256, mask="ring:200", n_heads=8, n_kv_heads=2))
    cs.append(Case("ring", q_len=8, kv_len=256, mask="ring:192", n_heads=4, n_kv_heads=2))
    cs.append(Case("sink", q_len=1, kv_len=260, mask="sink:4:128", n_heads=8, n_kv_heads=2))
    cs.append(Case("sink", q_len=6, kv_len=260, mask="sink:4:128", n_heads=4, n_kv_heads=2))
    return cs
