"""Numbers a kernel must carry right: logit magnitudes and explicit scales, storage
dtypes, F16 subnormals, int8 zero rows, a float query over a low-precision cache and
symmetric int8."""

from __future__ import annotations

from ..case import Case
from ..kernel_blocks import KV_BLOCK


def logits() -> list[Case]:
    """Logit magnitudes and explicit scales, on every dtype's path."""
    cs: list[Case] = []
    cs.append(Case("logits", q_len=3, kv_len=130, magnitude=10.0, n_heads=4, n_kv_heads=2))
    cs.append(Case("logits", q_len=3, kv_len=130, magnitude=100.0, n_heads=4, n_kv_heads=2))
    cs.append(Case("logits", q_len=3, kv_len=130, magnitude=10.0, n_heads=4, n_kv_heads=2,
                   dtype="f16"))
    # large logits at head_dim 128 in F16 and BF16, whose 1/sqrt(128) no half-precision
    # float holds: a scale (or q * scale) rounded to the storage dtype shifts every logit
    # by up to 2^-12 (F16) / 2^-9 (BF16) of itself, here a weight error of up to 10 %.
    # At head_dim 64 the scale, 1/8, is exact and hides it
    for dt in ("f16", "bf16"):
        cs.append(Case("logits", q_len=1, kv_len=130, head_dim=128, magnitude=10.0,
                       n_heads=8, n_kv_heads=2, dtype=dt))
    cs.append(Case("logits", q_len=3, kv_len=130, magnitude=1e-3, n_heads=4, n_kv_heads=2))
    cs.append(Case("logits", q_len=3, kv_len=130, scale=0.5, n_heads=4, n_kv_heads=2))
    # an explicit scale through the F16, BF16 and int8 paths (decode and a short prefill):
    # a kernel whose low-precision path alone falls back to 1/sqrt(head_dim) passed
    # every case with the F32 one above as the only explicit scale
    for q, dt, qdt in ((1, "f16", ""), (3, "f16", "f32"), (3, "bf16", ""), (1, "i8", ""),
                       (3, "i8", "")):
        cs.append(Case("logits", q_len=q, kv_len=130, scale=0.5, n_heads=8, n_kv_heads=2,
                       dtype=dt, q_dtype=qdt))
    return cs


def storage_dtypes() -> list[Case]:
    """F16, BF16 and int8 storage, F16 subnormals, int8 through the edge cases."""
    cs: list[Case] = []
    for dt in ("f16", "bf16", "i8"):
        cs.append(Case("dtype", q_len=1, kv_len=KV_BLOCK + 1, dtype=dt))
        cs.append(Case("dtype", q_len=9, kv_len=100, dtype=dt, causal=True, start_pos=91,
                       n_heads=4, n_kv_heads=2))
    cs.append(Case("dtype", q_len=1, kv_len=2049, dtype="bf16", n_heads=4, n_kv_heads=1))
    # F16 V and outputs in the subnormal range (|x| < 6.1e-5): a conversion that flushes
    # them to zero, in or out, was within the F16 tolerance everywhere else (decode through
    # the block path, a causal prefill through the panel)
    cs.append(Case("dtype", q_len=1, kv_len=KV_BLOCK + 1, dtype="f16", v_magnitude=1e-5))
    cs.append(Case("dtype", q_len=9, kv_len=100, dtype="f16", causal=True, start_pos=91,
                   n_heads=4, n_kv_heads=2, v_magnitude=1e-5))
    # the int8 paths through the edge-case families
    cs.append(Case("dtype", q_len=1, kv_len=2049, dtype="i8", n_heads=16, n_kv_heads=2))
    cs.append(Case("dtype", q_len=1, kv_len=KV_BLOCK + 1, dtype="i8", n_heads=8, n_kv_heads=1))
    cs.append(Case("dtype", q_len=5, kv_len=140, dtype="i8", mask="rows:middle",
                   n_heads=4, n_kv_heads=2))
    cs.append(Case("dtype", q_len=3, kv_len=256, dtype="i8", mask="ring:200",
                   n_heads=4, n_kv_heads=2))
    cs.append(Case("dtype", q_len=3, kv_len=70, dtype="i8", head_dim=67, causal=True,
                   start_pos=67, n_heads=4, n_kv_heads=2))
    cs.append(Case("dtype", q_len=2, kv_len=70, dtype="i8", mask="constant-token",
                   n_heads=4, n_kv_heads=2))
    return cs


def int8_zero_rows() -> list[Case]:
    """int8 V rows of zeros among the keys."""
    cs: list[Case] = []
    # V rows of zeros among the keys (ZERO_ROWS_*): int8 scale 1.0, no weight in the
    # output. A P.V that rounds P x v_scale to a fixed point below the largest scale of a
    # block passed every case but constant-token (docs/check.md). Decode on the
    # AVX-512 block path, a causal chunk, symmetric int8; V at 0.01 (ordinary scales
    # 1.3e-4-2.8e-4): the tolerance scales with V, the bits the fixed point loses do not
    cs.append(Case("dtype", kv_len=300, dtype="i8", mask="zero-tokens", v_magnitude=0.01,
                   n_heads=8, n_kv_heads=2))
    cs.append(Case("dtype", q_len=3, kv_len=130, dtype="i8", mask="zero-tokens", causal=True,
                   start_pos=127, v_magnitude=0.01, n_heads=4, n_kv_heads=2))
    cs.append(Case("dtype", kv_len=300, dtype="i8", mask="zero-tokens", quant="sym",
                   v_magnitude=0.01, n_heads=8, n_kv_heads=2))
    return cs


def float_query() -> list[Case]:
    """A float query and output over an F16, BF16 or int8 cache."""
    cs: list[Case] = []
    # a float query (and output) over an F16 / BF16 / int8 cache, as llama.cpp and
    # ExecuTorch's quantized cache run: Q's dtype is not K's
    cs.append(Case("dtype", q_len=1, kv_len=KV_BLOCK + 1, dtype="f16", q_dtype="f32",
                   n_heads=8, n_kv_heads=2))
    cs.append(Case("dtype", q_len=9, kv_len=100, dtype="f16", q_dtype="f32", causal=True,
                   start_pos=91, n_heads=4, n_kv_heads=2))
    cs.append(Case("dtype", q_len=1, kv_len=KV_BLOCK + 1, dtype="bf16", q_dtype="f32",
                   n_heads=8, n_kv_heads=2))
    cs.append(Case("dtype", q_len=3, kv_len=100, dtype="i8", q_dtype="f32", causal=True,
                   start_pos=97, n_heads=8, n_kv_heads=2))
    return cs


def symmetric_int8() -> list[Case]:
    """Symmetric int8: no zero points."""
    cs: list[Case] = []
    # symmetric int8 (no zero-point array: the ABI's NULL), decode and a causal prefill
    cs.append(Case("dtype", q_len=1, kv_len=KV_BLOCK + 1, dtype="i8", quant="sym"))
    cs.append(Case("dtype", q_len=9, kv_len=100, dtype="i8", causal=True, start_pos=91,
                   n_heads=4, n_kv_heads=2, quant="sym"))
    return cs
