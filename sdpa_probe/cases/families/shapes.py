"""Head counts and groups, decode and prefill lengths at the kernels' block edges,
head dims and long contexts."""

from __future__ import annotations

from ..case import DTYPES, Case
from ..kernel_blocks import DECODE_KV_BLOCK, KV_BLOCK, Q_BLOCK, X512_KV_BLOCK, decode_kv_block


def gqa() -> list[Case]:
    """GQA ratios 1 to 8 and MQA at a key block's edge, and groups real models have."""
    cs: list[Case] = []
    for h, hkv in ((8, 8), (8, 4), (8, 2), (8, 1), (16, 2), (32, 8)):
        cs.append(Case("gqa", n_heads=h, n_kv_heads=hkv, kv_len=KV_BLOCK + 1))
    # GQA groups real models have that are not a power of two, or wider than 8: Qwen2.5's
    # 14 heads over 2 (7 a group), SmolLM2's 15 over 5 (3), 16 a group (Llama 3.1 405B,
    # Qwen3 235B), Falcon-7B's 71 heads over one; a kernel that maps a head to its kv head
    # by a shift, or keeps a group's rows in a fixed-size tile, is right on every power of
    # two up to 8 and wrong here
    for h, hkv, q, dt in ((14, 2, 1, "f32"), (15, 5, 1, "f32"), (32, 2, 1, "f32"),
                          (71, 1, 1, "f32"), (14, 2, 3, "f16"), (15, 5, 2, "i8"),
                          (32, 2, 1, "i8")):
        cs.append(Case("gqa", n_heads=h, n_kv_heads=hkv, q_len=q, dtype=dt,
                       kv_len=KV_BLOCK + 1, causal=q > 1,
                       start_pos=KV_BLOCK + 1 - q if q > 1 else 0))
    return cs


def decode_block_edges() -> list[Case]:
    """Decode at the key-block edges of every dtype, byte-sized blocks and the AVX-512 path's."""
    cs: list[Case] = []
    for kv in (1, KV_BLOCK - 1, KV_BLOCK, KV_BLOCK + 1, 2 * KV_BLOCK + 1):
        cs.append(Case("decode", kv_len=kv))
    cs.append(Case("decode", kv_len=2049, dtype="f16", n_heads=4, n_kv_heads=1))
    for dt, blk in DECODE_KV_BLOCK.items():
        for kv in (blk - 1, blk, blk + 1):
            if dt == "f32" and kv in (1, KV_BLOCK - 1, KV_BLOCK, KV_BLOCK + 1):
                continue
            cs.append(Case("decode", kv_len=kv, dtype=dt, n_heads=8, n_kv_heads=2))
    # wide positions (16 kv heads x 128): byte-sized blocks of 16 / 16 / 32 keys
    for dt in ("f32", "f16", "i8"):
        blk = decode_kv_block(dt, 16, 128)
        for kv in (blk - 1, blk + 1):
            cs.append(Case("decode", kv_len=kv, dtype=dt, n_heads=16, n_kv_heads=16,
                           head_dim=128))
    # decode tasks on the AVX-512 block path: its block edges, rows per kv head of 8 and 16
    # (short chunks, speculative decode: a query row each, causal and masked), a partial
    # lane chunk of heads (24 kv heads, 1 row each), head_dim not a multiple of 32 (int8)
    for kv in (X512_KV_BLOCK - 1, X512_KV_BLOCK + 1):
        cs.append(Case("decode", kv_len=kv, n_heads=8, n_kv_heads=2))
    cs.append(Case("decode", q_len=4, kv_len=100, causal=True, start_pos=96, n_heads=8,
                   n_kv_heads=2))
    cs.append(Case("decode", q_len=2, kv_len=77, mask="random", n_heads=16, n_kv_heads=2))
    cs.append(Case("decode", q_len=2, kv_len=70, causal=True, start_pos=68, dtype="i8",
                   n_heads=8, n_kv_heads=2))
    return cs


def decode_static_cache() -> list[Case]:
    """One decode step over a static cache whose slots past the step are stale."""
    cs: list[Case] = []
    # decode over a static cache: kv_len is the cache's length, causal with start_pos the
    # step's position, the slots past it stale (NaN here) -- how a runtime with a
    # preallocated cache calls its op (ExecuTorch's custom_sdpa: start_pos, is_causal).
    # A decode path that reads every slot of the cache because a single query row "sees
    # everything" passed every case before these, each of whose decode rows saw a full
    # cache. On the first step (start_pos 0) the row sees one key; over two threads the
    # visible range, not the cache, is what a split must divide
    for dt in DTYPES:
        cs.append(Case("decode", kv_len=300, causal=True, start_pos=200, dtype=dt,
                       n_heads=8, n_kv_heads=2))
    cs.append(Case("decode", kv_len=64, causal=True, start_pos=0, n_heads=8, n_kv_heads=2))
    for dt in ("f32", "i8"):
        cs.append(Case("decode", kv_len=1030, causal=True, start_pos=700, dtype=dt,
                       n_heads=8, n_kv_heads=2, n_threads=2))
    return cs


def batched_decode() -> list[Case]:
    """Decode over several sequences at once."""
    cs: list[Case] = []
    # batched decode (several sequences a step, as a server or beam search runs them):
    # every decode case before these had one sequence, so a decode path that indexes
    # K / V (or int8 scales) by batch wrongly, or serves batch 0 alone, passed them all
    for dt, t in (("f32", 1), ("f16", 1), ("i8", 1), ("f32", 2), ("bf16", 2)):
        cs.append(Case("decode", batch=3, kv_len=150, causal=True, start_pos=120, dtype=dt,
                       n_heads=8, n_kv_heads=2, n_threads=t))
    return cs


def decode_odd_shapes() -> list[Case]:
    """Decode on the AVX-512 block path's odd shapes: a partial lane chunk of heads (24
    kv heads), head_dims not a multiple of 32."""
    cs: list[Case] = []
    cs.append(Case("decode", kv_len=40, n_heads=24, n_kv_heads=24, dtype="f16"))
    cs.append(Case("decode", kv_len=70, head_dim=80, dtype="i8"))
    cs.append(Case("decode", kv_len=70, head_dim=48, dtype="bf16", n_heads=16, n_kv_heads=2))
    return cs


def prefill() -> list[Case]:
    """Prefill at the query-block edges, batched, and longer than its cache."""
    cs: list[Case] = []
    for q in (Q_BLOCK - 1, Q_BLOCK, Q_BLOCK + 1):
        cs.append(Case("prefill", q_len=q, kv_len=q, causal=True, n_heads=4, n_kv_heads=2))
    cs.append(Case("prefill", batch=3, q_len=20, kv_len=45, causal=True, start_pos=25,
                   n_heads=4, n_kv_heads=2))
    cs.append(Case("prefill", q_len=40, kv_len=20, causal=True, n_heads=4, n_kv_heads=1))
    cs.append(Case("prefill", q_len=17, kv_len=150, n_heads=4, n_kv_heads=2))
    return cs


def head_dims() -> list[Case]:
    """Head dims past a fixed-size row buffer and under a vector's width."""
    cs: list[Case] = []
    # (512: past the 256 a kernel's fixed-size row buffer, `float acc[256]`, assumes)
    for d in (64, 80, 96, 128, 256, 67, 512):
        cs.append(Case("hdim", head_dim=d, q_len=2, kv_len=70, n_heads=4, n_kv_heads=2))
    # head_dims under a vector's width (a kernel whose first load, or an unsigned
    # `d < D - 16` loop bound, assumes at least 16 elements), as tiny test models have
    for d, dt in ((16, "f32"), (8, "f32"), (1, "f32"), (16, "f16"), (8, "i8"), (4, "bf16")):
        cs.append(Case("hdim", head_dim=d, q_len=2, kv_len=70, n_heads=4, n_kv_heads=2,
                       dtype=dt))
    return cs
