"""Every native kernel against the float64 oracle, on the case matrix."""

import dataclasses

import numpy as np
import pytest

from sdpa_probe import golden, native
from sdpa_probe.backends import NativeBackend
from sdpa_probe.cases import Case, suite, tolerance
from sdpa_probe.check.calls import run_one
from sdpa_probe.inputs import materialise, out_buffer
from sdpa_probe.oracle import prepare_case

KERNELS = ["decomposed", "flash", "flash_maskskip", "quant_int8", "quant_int8_alloc"]
CASES = suite("default")
# The references come from the checked-in golden data (golden/, `probe golden`), not
# the live oracle: fixed across torch releases and machines. A case the golden set
# lacks falls back to the live oracle, and test_golden.py fails until it is added.
GOLDEN = golden.default_dir()
STORED = set(golden.store(GOLDEN).entries)
_prepared: dict = {}


def prepared(case):
    if case.id not in _prepared:
        _prepared[case.id] = prepare_case(case, golden=GOLDEN if case.id in STORED else None)
    return _prepared[case.id]


def test_registry_lists_every_kernel():
    # (flash_bf16, BF16 products, is judged at its precision in test_flash_bf16.py)
    assert list(native.builtin_kernels()) == KERNELS[:2] + ["flash_bf16"] + KERNELS[2:]
    flash = native.get_kernel("flash").info
    assert {"f32", "f16", "bf16"} <= set(flash.dtypes) and "i8" not in flash.dtypes
    assert "gqa-in-kernel" in flash.features
    assert "gqa-broadcast" in native.get_kernel("decomposed").info.features
    assert "alloc-per-block" in native.get_kernel("quant_int8_alloc").info.features


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_kernel_matches_oracle(kernel, case):
    rec = run_one(NativeBackend(kernel), case, prepared(case))
    if case.invalid:  # every built-in kernel refuses it with SDPA_INVALID, writing nothing
        assert rec["status"] == "pass" and "returned SDPA_INVALID" in rec["reason"], rec
        return
    supported = native.get_kernel(kernel).info.dtypes
    if case.dtype not in supported:
        assert rec["status"] == "unsupported", rec
        return
    if kernel.startswith("quant") and case.dtype != "i8" and case.kv_len > 0:
        assert rec["status"] == "unsupported", rec  # int8 kernels want int8 K/V (if any)
        return
    assert rec["status"] == "pass", rec["reason"]


@pytest.mark.parametrize("mask", ["window:100", "window:33", "ring:200", "ring:77", "sink:4:128"])
@pytest.mark.parametrize("q_len", [1, 7, 40])
def test_maskskip_equals_flash(mask, q_len):
    case = Case("maskskip", q_len=q_len, kv_len=300, mask=mask, n_heads=4, n_kv_heads=2,
                causal=mask.startswith("window"), start_pos=300 - q_len)
    data = materialise(case)
    outs = []
    for name in ("flash", "flash_maskskip"):
        buf = out_buffer(case)
        NativeBackend(name).run(data, buf)
        outs.append(buf.values())
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-6, atol=1e-6)


def test_threads_give_the_same_result():
    base = Case("threads", q_len=3, kv_len=2000, n_heads=8, n_kv_heads=2, causal=True,
                start_pos=1997)
    outs = []
    for t in (1, 2, 4):
        case = dataclasses.replace(base, n_threads=t)
        data = materialise(case)
        buf = out_buffer(case)
        NativeBackend("flash").run(data, buf)
        outs.append(buf.values())
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[2], outs[0], rtol=1e-5, atol=1e-6)


def test_flash_block_sizes_are_parameters():
    """Explicit query / key block sizes (and split-k) give the oracle's answer."""
    case = Case("blocks", q_len=37, kv_len=301, causal=True, start_pos=264, n_heads=4,
                n_kv_heads=2, mask="random")
    prep = prepare_case(case)
    ffi, lib, _ = native.native_lib()
    for qb, kb, splits in ((1, 1, 0), (7, 13, 0), (64, 512, 0), (32, 64, 3)):
        buf = out_buffer(case)
        call = native.prepare(ffi, prep.data.q_store, prep.data.k_store, prep.data.v_store,
                              buf.view, mask=prep.data.mask, is_causal=True, start_pos=264,
                              n_threads=2)
        opts = ffi.new("sdpa_probe_flash_opts *", {"q_block": qb, "kv_block": kb,
                                                   "n_splits": splits})
        for fn in (lib.sdpa_probe_flash_forward_ex, lib.sdpa_probe_flash_maskskip_forward_ex):
            assert fn(call.args, opts) == 0
            np.testing.assert_allclose(buf.values(), prep.ref, rtol=2e-5, atol=2e-5)


def _assert_matches_oracle(case: Case, runs) -> None:
    """Runs (threads, kv splits; 0: the kernel's choice) of `flash` (`quant_int8` for
    int8, which takes no split count) on a case, each against the oracle."""
    prep = prepare_case(case)
    ffi, lib, _ = native.native_lib()
    atol, rtol = tolerance(case)
    for threads, splits in runs:
        buf = out_buffer(case)
        call = native.prepare(ffi, prep.data.q_store, prep.data.k_store, prep.data.v_store,
                              buf.view, mask=prep.data.mask, is_causal=case.causal,
                              start_pos=case.start_pos, n_threads=threads)
        if case.dtype == "i8":
            assert native.get_kernel("quant_int8").forward_args(call.args) == 0
        else:
            opts = ffi.new("sdpa_probe_flash_opts *", {"q_block": 0, "kv_block": 0,
                                                       "n_splits": splits})
            assert lib.sdpa_probe_flash_forward_ex(call.args, opts) == 0
        np.testing.assert_allclose(buf.values(), prep.ref, rtol=rtol, atol=atol,
                                   err_msg=f"threads {threads} splits {splits}")


@pytest.mark.parametrize("dtype", ["f32", "f16", "i8"])
def test_flash_decode_split_k_counts(dtype):
    """Decode (the AVX-512 block path where built) with 1 to 7 kv splits, ragged last
    ones included, merges to the oracle's answer. One-thread runs take one split, so
    the merge is exercised here explicitly."""
    case = Case("splits", q_len=1, kv_len=301, dtype=dtype, n_heads=8, n_kv_heads=2,
                start_pos=300)
    # quant_int8 has no options entry point: its default split count, per thread count
    runs = ((1, 0), (2, 0), (3, 0)) if dtype == "i8" else (
        (1, 1), (1, 2), (2, 3), (1, 7), (2, 0), (1, 0))
    _assert_matches_oracle(case, runs)


@pytest.mark.parametrize("dtype", ["f32", "f16", "i8"])
def test_flash_decode_wide_positions_long_task(dtype):
    """Decode with 16 kv heads of head_dim 128 (4-8 KiB a position) over a 600-key task:
    on the AVX-512 block path these are the blocks whose cross prefetches go to L2
    (FLASH_X512_PF_L2), a separate instantiation; it must match the oracle too."""
    case = Case("wide", q_len=1, kv_len=600, dtype=dtype, n_heads=16, n_kv_heads=16,
                head_dim=128, start_pos=599)
    _assert_matches_oracle(case, ((1, 0), (2, 0)))


@pytest.mark.parametrize("dtype", ["f32", "f16", "i8"])
def test_flash_decode_grouped_heads_long_task(dtype):
    """Decode with 4 query heads a kv head, 8 kv heads of head_dim 64, over tasks of
    more than 2 MiB of K / V (2,100 keys, one or two threads): F16 and F32 blocks of
    this shape take the L2 cross prefetches, and F16 moves part of the next block's
    K prefetch into the scores (fx_next_k_early); the answer must not change."""
    case = Case("grouped", q_len=1, kv_len=2100, dtype=dtype, n_heads=32, n_kv_heads=8,
                head_dim=64, start_pos=2099)
    _assert_matches_oracle(case, ((1, 0), (2, 0)))


@pytest.mark.parametrize("dtype", ["f32", "f16", "i8"])
@pytest.mark.parametrize("head_dim", [48, 80, 112])
@pytest.mark.parametrize("mask", ["none", "random"])
@pytest.mark.parametrize("group", [1, 2])
def test_flash_prefill_tiles_match_the_oracle(dtype, head_dim, mask, group):
    """Prefill over more query rows than a query block (128 on the AVX-512 panel, 32
    elsewhere), a KV-cache offset: tiles of 8 rows and their tails (the last block's
    21 rows: 8 + 8 + 4 + 1 with one query head a kv head, 5 x 8 + 2 with two), key
    steps of 32 and 16, head_dims whose last slice is 16 wide, causal or under an
    additive mask, on one and two threads."""
    case = Case("prefill", q_len=149, kv_len=170, causal=mask == "none", start_pos=21,
                mask=mask, head_dim=head_dim, dtype=dtype, n_heads=3 * group, n_kv_heads=3)
    _assert_matches_oracle(case, ((1, 0), (2, 0)))


def test_quant_alloc_counts_allocations_per_block():
    """quant_int8_alloc allocates per key block; quant_int8 a fixed number per call."""
    case = Case("alloc", q_len=1, kv_len=1024, dtype="i8", n_heads=8, n_kv_heads=2)
    data = materialise(case)
    ffi, lib, _ = native.native_lib()
    counts = {}
    for name in ("quant_int8", "quant_int8_alloc"):
        buf = out_buffer(case)
        lib.sdpa_probe_alloc_reset()
        NativeBackend(name).run(data, buf)
        c, b = ffi.new("int64_t *"), ffi.new("int64_t *")
        lib.sdpa_probe_alloc_stats(c, b)
        counts[name] = c[0]
    assert counts["quant_int8"] <= 3
    # 2 kv heads x 8 key blocks x (K + V) buffers
    assert counts["quant_int8_alloc"] >= counts["quant_int8"] + 2 * 8 * 2


def test_fully_masked_rows_are_zero_not_nan():
    case = Case("zeros", q_len=4, kv_len=200, mask="rows:middle", n_heads=4, n_kv_heads=2)
    data = materialise(case)
    for name in ("decomposed", "flash", "flash_maskskip"):
        buf = out_buffer(case)
        NativeBackend(name).run(data, buf)
        vals = buf.values()
        assert np.all(vals[:, 2] == 0.0), name
        assert np.isfinite(vals).all(), name


@pytest.mark.parametrize("dtype", ["f32", "f16", "i8"])
@pytest.mark.parametrize("q_len", [1, 4])
def test_nan_in_a_visible_key_poisons_only_its_rows(dtype, q_len):
    """NaN in one key of kv head 1: every query row that sees the key is NaN, every
    other row (other heads, or rows the causal mask hides the key from) exact as before.
    Decode shapes: the heads-together block path, rows of several heads per vector."""
    case = Case("nan", q_len=q_len, kv_len=70, causal=True, start_pos=70 - q_len,
                n_heads=8, n_kv_heads=2, dtype=dtype)
    name = "quant_int8" if dtype == "i8" else "flash"
    data = materialise(case)
    clean = out_buffer(case)
    NativeBackend(name).run(data, clean)
    key = 70 - q_len + 1 if q_len > 1 else 40  # q_len > 1: only the later rows see it
    if dtype == "i8":  # a NaN scale poisons the key's real values
        data.k_store.scale[0, key, 1] = np.nan
    else:
        data.k_store[0, key, 1, 5] = np.nan
    buf = out_buffer(case)
    NativeBackend(name).run(data, buf)
    vals, ref = buf.values(), clean.values()
    for i in range(q_len):
        sees = 70 - q_len + i >= key
        assert np.isnan(vals[0, i, 4:8]).all() == sees, (i, sees)
        np.testing.assert_array_equal(vals[0, i, 0:4], ref[0, i, 0:4])
        if not sees:
            np.testing.assert_array_equal(vals[0, i, 4:8], ref[0, i, 4:8])


@pytest.mark.parametrize("q_len", [1, 4])
def test_quant_params_read_in_place_or_copied_agree(q_len):
    """quant_int8 reads per-token scales and zero points in place when each position's
    heads are adjacent, and copies them per block otherwise (strided, or no zero
    point): both give the same result to the bit. GQA decode shapes, integer Q.K^T."""
    case = Case("qp", q_len=q_len, kv_len=77, causal=True, start_pos=77 - q_len,
                n_heads=16, n_kv_heads=4, head_dim=64, dtype="i8")
    data = materialise(case)

    def run():
        buf = out_buffer(case)
        NativeBackend("quant_int8").run(data, buf)
        return buf.values()

    def strided(a):  # the same values, every other element of a wider array
        wide = np.zeros(a.shape[:2] + (2 * a.shape[2],), dtype=a.dtype)
        wide[..., ::2] = a
        return wide[..., ::2]

    direct = run()
    for name in ("k_store", "v_store", "q_store"):
        t = getattr(data, name)
        t.scale, t.zero_point = strided(t.scale), strided(t.zero_point)
    np.testing.assert_array_equal(run(), direct)
    for name in ("k_store", "v_store"):  # zero points of 0, given or not
        getattr(data, name).zero_point[...] = 0
    zeros = run()
    for name in ("k_store", "v_store"):
        getattr(data, name).zero_point = None
    np.testing.assert_array_equal(run(), zeros)
    assert not np.array_equal(zeros, direct)


@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim,kv_len", [
    (8, 2, 64, 100), (8, 4, 128, 65), (16, 2, 64, 33), (4, 4, 64, 129), (16, 1, 128, 31)])
def test_float_q_with_int8_kv_matches_the_dequantised_oracle(n_heads, n_kv_heads, head_dim,
                                                              kv_len):
    """quant_int8 with a float Q (no integer Q.K^T): the decode paths that convert int8 K
    in registers (one row per kv head, and 2-16 rows: head by head), block edges included."""
    from sdpa_probe.inputs import quantize_per_token

    rng = np.random.default_rng([n_heads, n_kv_heads, head_dim, kv_len])
    q = rng.standard_normal((1, 1, n_heads, head_dim)).astype(np.float32)
    kq, ks, kz = quantize_per_token(rng.standard_normal((1, kv_len, n_kv_heads, head_dim)))
    vq, vs, vz = quantize_per_token(rng.standard_normal((1, kv_len, n_kv_heads, head_dim)))
    kd = (kq.astype(np.float64) - kz[..., None]) * ks[..., None]
    vd = (vq.astype(np.float64) - vz[..., None]) * vs[..., None]
    g = n_heads // n_kv_heads
    ref = np.empty((1, 1, n_heads, head_dim))
    for h in range(n_heads):
        s = kd[0, :, h // g] @ q[0, 0, h].astype(np.float64) / np.sqrt(head_dim)
        p = np.exp(s - s.max())
        ref[0, 0, h] = (p / p.sum()) @ vd[0, :, h // g]
    out = np.full((1, 1, n_heads, head_dim), np.nan, np.float32)
    native.get_kernel("quant_int8")(q, native.QuantTensor(kq, ks, kz),
                                    native.QuantTensor(vq, vs, vz), out)
    np.testing.assert_allclose(out, ref, atol=2e-6 * max(1.0, kv_len / 64) ** 0.5, rtol=2e-5)
