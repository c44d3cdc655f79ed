"""Where the tensors lie: strided, transposed, misaligned and reversed views, offsets past
2^31, tensors of one call in different layouts, buffers flush against an inaccessible
page."""

from __future__ import annotations

from ..case import DTYPES, Case
from ..kernel_blocks import KV_BLOCK


def strided_layouts() -> list[Case]:
    """Layouts through strides, with NaN in every byte a kernel must not read."""
    cs: list[Case] = []
    for lay in ("bhsd", "padded", "dmajor", "offset"):
        cs.append(Case("layout", q_len=3, kv_len=KV_BLOCK + 3, layout=lay,
                       n_heads=4, n_kv_heads=2))
        cs.append(Case("layout", q_len=1, kv_len=200, layout=lay, dtype="f16"))
        cs.append(Case("layout", q_len=2, kv_len=90, layout=lay, dtype="i8",
                       n_heads=4, n_kv_heads=2))
    cs.append(Case("layout", batch=2, q_len=5, kv_len=75, layout="padded", causal=True,
                   start_pos=70, mask="random", n_heads=4, n_kv_heads=2))
    # (the mask too one element past a 64-byte boundary)
    cs.append(Case("layout", q_len=5, kv_len=75, layout="offset", causal=True, start_pos=70,
                   mask="random", n_heads=4, n_kv_heads=2))
    return cs


def far_offsets() -> list[Case]:
    """Element offsets past 2^31."""
    cs: list[Case] = []
    # element offsets past 2^31 (batch 1 of Q, K, V 2^31 + 4096 elements after batch 0, as
    # in a cache of many sequences or one interleaving every layer per position): a
    # kernel that forms an offset in int truncates it and reads far outside its tensor
    for dt in ("f32", "f16", "i8"):
        cs.append(Case("layout", batch=2, q_len=2, kv_len=70, layout="far", dtype=dt,
                       n_heads=4, n_kv_heads=2, causal=dt == "f16",
                       start_pos=68 if dt == "f16" else 0))
    return cs


def mixed_layouts() -> list[Case]:
    """Tensors of one call in different layouts, and BF16's own strides."""
    cs: list[Case] = []
    # tensors of one call in different layouts (K's strides are not V's, Q's not out's)
    cs.append(Case("layout", q_len=3, kv_len=KV_BLOCK + 3, layout="vdmajor",
                   n_heads=4, n_kv_heads=2, causal=True, start_pos=KV_BLOCK))
    cs.append(Case("layout", q_len=2, kv_len=90, layout="vdmajor", dtype="i8",
                   n_heads=4, n_kv_heads=2))
    cs.append(Case("layout", q_len=4, kv_len=70, layout="qfused", dtype="f16",
                   n_heads=8, n_kv_heads=2))
    # BF16 through a padded and a transposed view (its path's own stride handling), V
    # alone transposed, and element offsets past 2^31: the BF16 path forms its own
    # offsets, so the F32 / F16 / int8 cases above do not speak for it
    for lay in ("padded", "dmajor", "vdmajor"):
        cs.append(Case("layout", q_len=1, kv_len=200, layout=lay, dtype="bf16", n_heads=8,
                       n_kv_heads=2))
    cs.append(Case("layout", batch=2, q_len=2, kv_len=70, layout="far", dtype="bf16",
                   n_heads=4, n_kv_heads=2))
    # llama.cpp's own cache: F16, V transposed (head_dim-major) beside a plain K; and the
    # same over a static cache whose slots past the step's position are stale
    cs.append(Case("layout", q_len=1, kv_len=200, layout="vdmajor", dtype="f16",
                   n_heads=8, n_kv_heads=2))
    cs.append(Case("layout", q_len=1, kv_len=200, layout="vdmajor", dtype="f16", causal=True,
                   start_pos=150, n_heads=8, n_kv_heads=2))
    cs.append(Case("layout", q_len=4, kv_len=70, layout="qfused", n_heads=8, n_kv_heads=2))
    return cs


def reversed_strides() -> list[Case]:
    """Negative strides."""
    cs: list[Case] = []
    # negative strides, which the ABI allows (a view walked backwards): each position and
    # dim of Q, K, V (and int8 scales) first in memory is the last in order; a kernel that
    # keeps strides unsigned (uint32) passes every other case and reads far outside here
    for dt, q in (("f32", 3), ("f16", 1), ("bf16", 1), ("i8", 2)):
        cs.append(Case("layout", q_len=q, kv_len=90, layout="reversed", dtype=dt, n_heads=8,
                       n_kv_heads=2, causal=q > 1, start_pos=88 - q if q > 1 else 0))
    return cs


def fenced_buffers() -> list[Case]:
    """Every buffer flush against an inaccessible page."""
    cs: list[Case] = []
    # every buffer flush against an inaccessible page, after its last byte or before its
    # first: a full vector loaded over a row's tail, a block of keys (of int8 scales, of a
    # mask row) read past kv_len or a row read before the first faults here, where
    # elsewhere the read lands in slack and, its value thrown away, goes unseen. kv 77 and
    # 45, head_dim 67: tails for any vector width and key block
    for dt in DTYPES:
        cs.append(Case("layout", q_len=1, kv_len=77, layout="fenced", dtype=dt, mask="random",
                       n_heads=8, n_kv_heads=2, n_threads=2))
        cs.append(Case("layout", q_len=5, kv_len=45, head_dim=67, layout="fenced", dtype=dt,
                       causal=True, start_pos=40, mask="random", n_heads=4, n_kv_heads=2))
    for dt in ("f32", "f16", "i8"):
        cs.append(Case("layout", q_len=3, kv_len=77, head_dim=67, layout="fenced-start",
                       dtype=dt, mask="random", n_heads=4, n_kv_heads=2))
    cs.append(Case("layout", batch=2, q_len=2, kv_len=70, layout="vdmajor", dtype="i8",
                   n_heads=4, n_kv_heads=2, mask="random"))
    return cs
