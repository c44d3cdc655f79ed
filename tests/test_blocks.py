"""The decode building blocks against numpy / torch references."""

import numpy as np
import pytest
import torch

from sdpa_probe import blocks
from sdpa_probe.errors import SdpaInvalid


def rnd(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ---- norm, elementwise, casts ---------------------------------------------------

@pytest.mark.parametrize("n", [1, 7, 64, 576, 1003])
def test_rmsnorm(rng, n):
    x = rnd(rng, 3, n, scale=3.0)
    w = rnd(rng, n)
    got = blocks.rmsnorm(x, w, eps=1e-5)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-6)
    # in place
    y = x.copy()
    blocks.rmsnorm(y, w, eps=1e-5, out=y)
    np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-6)


def test_residual_add(rng):
    x, r = rnd(rng, 1001), rnd(rng, 1001)
    ref = x + r
    blocks.residual_add(x, r)
    np.testing.assert_array_equal(x, ref)


@pytest.mark.parametrize("n", [5, 1536, 100003])
def test_silu_gate(rng, n):
    g, u = rnd(rng, n, scale=4.0), rnd(rng, n)
    got = blocks.silu_gate(g, u)
    ref = (torch.nn.functional.silu(torch.from_numpy(g).double()) * torch.from_numpy(u)).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    assert np.isfinite(blocks.silu_gate(np.array([-200.0, 200.0, 0.0], np.float32),
                                        np.ones(3, np.float32))).all()


@pytest.mark.parametrize("n", [3, 1000, 300001])
def test_casts(rng, n):
    h = rnd(rng, n, scale=100.0).astype(np.float16)
    h[:3] = [np.inf, -0.0, 6e-8]  # inf, signed zero, a subnormal
    f = blocks.cast_f16_f32(h)
    np.testing.assert_array_equal(f, h.astype(np.float32))
    x = rnd(rng, n, scale=100.0)
    np.testing.assert_array_equal(blocks.cast_f32_f16(x), x.astype(np.float16))


# ---- GEMV ----------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (37, 19), (576, 576), (192, 1536), (1000, 8)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gemv(rng, shape, dtype):
    w = rnd(rng, *shape, scale=0.05).astype(dtype)
    x = rnd(rng, shape[1])
    ref = w.astype(np.float64) @ x.astype(np.float64)
    for threads in (1, 2):
        got = blocks.gemv(w, x, n_threads=threads)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * np.sqrt(shape[1]))


def test_gemv_rejects_bad_input(rng):
    with pytest.raises(ValueError):
        blocks.gemv(rnd(rng, 4, 3), rnd(rng, 4))
    with pytest.raises(ValueError):
        blocks.gemv(rnd(rng, 4, 6)[:, ::2], rnd(rng, 3))  # not contiguous
    with pytest.raises(ValueError):
        blocks.gemv(rnd(rng, 4, 3).astype(np.float64), rnd(rng, 3))


# ---- RoPE ------------------------------------------------------------------------------

def rope_ref(x, positions, theta=10000.0, style="half"):
    """x [len, heads, D] at positions [len], in float64 (HF rotate_half / GPT-J pairs)."""
    D = x.shape[-1]
    inv = theta ** (-np.arange(0, D, 2, dtype=np.float64) / D)
    ang = np.asarray(positions, np.float64)[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x = x.astype(np.float64)
    if style == "half":
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)
    out = np.empty_like(x)
    out[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
    out[..., 1::2] = x[..., 1::2] * c + x[..., 0::2] * s
    return out


@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("D", [2, 6, 64, 128])
def test_rope_one_token(rng, style, D):
    cos, sin = blocks.rope_table(3000, D, 10000.0)
    for pos in (0, 1, 17, 2999):
        x = rnd(rng, 5, D)
        ref = rope_ref(x[None], [pos], style=style)[0]
        blocks.rope(x, pos, cos, sin, style=style)
        np.testing.assert_allclose(x, ref, rtol=1e-5, atol=1e-5)


def test_rope_matches_hf_llama_rotary(rng):
    """The HF Llama formula: q * cos + rotate_half(q) * sin, cos/sin from inv_freq."""
    D, pos, theta = 64, 123, 500000.0
    q = torch.from_numpy(rnd(rng, 4, D))
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    emb = torch.cat([pos * inv_freq, pos * inv_freq])
    rot = torch.cat([-q[..., D // 2:], q[..., : D // 2]], -1).double()
    ref = (q.double() * emb.cos() + rot * emb.sin()).numpy()
    cos, sin = blocks.rope_table(pos + 1, D, theta)
    x = q.numpy().copy()
    blocks.rope(x, pos, cos, sin)
    np.testing.assert_allclose(x, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_rope_window(rng, style):
    L, H, D = 700, 3, 64
    cos, sin = blocks.rope_table(2048, D)
    src = rnd(rng, L, H, D)
    for threads in (1, 2):
        got = blocks.rope_window(src, cos, sin, pos0=100, style=style, n_threads=threads)
        np.testing.assert_allclose(got, rope_ref(src, np.arange(100, 100 + L), style=style),
                                   rtol=1e-5, atol=1e-5)
    pos = rng.integers(0, 2048, L).astype(np.int64)
    got = blocks.rope_window(src, cos, sin, positions=pos, style=style)
    np.testing.assert_allclose(got, rope_ref(src, pos, style=style), rtol=1e-5, atol=1e-5)
    inplace = src.copy()
    blocks.rope_window(inplace, cos, sin, positions=pos, out=inplace, style=style)
    np.testing.assert_array_equal(inplace, got)


def test_rope_rejects(rng):
    cos, sin = blocks.rope_table(10, 8)
    with pytest.raises(SdpaInvalid):
        blocks.rope(rnd(rng, 2, 8), 10, cos, sin)  # position beyond the table
    with pytest.raises(SdpaInvalid):
        blocks.rope_window(rnd(rng, 4, 2, 8), cos, sin, pos0=7)
    with pytest.raises(SdpaInvalid):
        blocks.rope_window(rnd(rng, 2, 2, 8), cos, sin, positions=np.array([0, 10]))
    with pytest.raises(ValueError):
        blocks.rope_table(10, 7)


# ---- KV cache ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["f32", "f16", "i8"])
def test_kv_cache_linear(rng, dtype):
    cap, H, D = 40, 3, 64
    c = blocks.KVCache(cap, H, D, dtype)
    rows = rnd(rng, cap, H, D, scale=2.0)
    rows[5] += 3.0  # all positive rows: the zero point must still cover them
    rows[6] = 0.0
    for p in range(cap):
        c.write(p, rows[p])
    got = c.read(0, cap, n_threads=2)
    np.testing.assert_array_equal(got, c.dequantized())
    if dtype == "f32":
        np.testing.assert_array_equal(got, rows)
    elif dtype == "f16":
        np.testing.assert_array_equal(got, rows.astype(np.float16).astype(np.float32))
    else:
        # asymmetric per (token, head): error at most half a step
        step = (np.maximum(rows.max(-1), 0) - np.minimum(rows.min(-1), 0)) / 255
        assert (np.abs(got - rows) <= step[..., None] * 0.5001 + 1e-6).all()
        np.testing.assert_array_equal(got[6], 0.0)
        assert c.scale.shape == (cap, H) and c.zero_point.dtype == np.int8
    np.testing.assert_array_equal(c.read(10, 5), got[10:15])
    with pytest.raises(SdpaInvalid):
        c.write(cap, rows[0])  # linear cache is full
    with pytest.raises(SdpaInvalid):
        c.read(cap - 2, 3)


def test_kv_cache_i8_symmetric(rng):
    c = blocks.KVCache(4, 2, 16, "i8", zero_point=False)
    x = rnd(rng, 2, 16)
    c.write(1, x)
    got = c.read(1, 1)[0]
    step = np.abs(x).max(-1) / 127
    assert (np.abs(got - x) <= step[:, None] * 0.5001 + 1e-6).all()


@pytest.mark.parametrize("dtype", ["f32", "f16", "i8"])
def test_kv_cache_ring(rng, dtype):
    c = blocks.KVCache(16, 2, 8, dtype, ring_size=8)
    rows = rnd(rng, 21, 2, 8)
    for p in range(21):
        c.write(p, rows[p])
        assert c.slot(p) == p % 8
    lin = blocks.KVCache(8, 2, 8, dtype)
    for s in range(8):
        lin.write(s, rows[13 + ((s - 13) % 8)])  # the newest position in each slot
    np.testing.assert_array_equal(c.read(0, 8), lin.read(0, 8))


# ---- decomposed attention pieces -------------------------------------------------------

@pytest.mark.parametrize("hkv,H", [(1, 1), (2, 14), (8, 32), (3, 9)])
def test_gqa_broadcast(rng, hkv, H):
    L, D = 301, 64
    src = rnd(rng, L, hkv, D)
    ref = torch.from_numpy(src).permute(1, 0, 2).repeat_interleave(H // hkv, dim=0).numpy()
    for threads in (1, 2):
        np.testing.assert_array_equal(blocks.gqa_broadcast(src, H, n_threads=threads), ref)


def test_gqa_broadcast_rejects_non_multiple(rng):
    with pytest.raises(SdpaInvalid):
        blocks.gqa_broadcast(rnd(rng, 4, 3, 8), 7)


@pytest.mark.parametrize("L", [1, 7, 8, 33, 1000])
def test_pack_and_qk(rng, L):
    H, D = 4, 64
    k = rnd(rng, H, L, D)
    kp = blocks.pack_k(k, n_threads=2)
    P = (L + 7) // 8
    padded = np.zeros((H, P * 8, D), np.float32)
    padded[:, :L] = k
    np.testing.assert_array_equal(kp, padded.reshape(H, P, 8, D).transpose(0, 1, 3, 2))
    q = rnd(rng, H, D)
    for threads in (1, 2):
        got = blocks.qk_packed(q, kp, L, n_threads=threads)
        ref = np.einsum("hd,hjd->hj", q.astype(np.float64), k) / np.sqrt(D)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    got = blocks.qk_packed(q, kp, L, scale=0.5)
    np.testing.assert_allclose(got, np.einsum("hd,hjd->hj", q, k) * 0.5, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [1, 9, 64, 4001])
def test_softmax(rng, n):
    x = rnd(rng, 5, n, scale=10.0)
    x[1, :] = -np.inf
    if n > 2:
        x[2, 1] = -np.inf
    ref = torch.softmax(torch.from_numpy(x).double(), -1).nan_to_num(0.0).numpy()
    got = blocks.softmax(x.copy(), n_threads=2)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(got[1], 0.0)


@pytest.mark.parametrize("D", [8, 64, 80, 5])
def test_pv(rng, D):
    H, L = 6, 257
    p = np.abs(rnd(rng, H, L))
    v = rnd(rng, H, L, D)
    for threads in (1, 2):
        got = blocks.pv(p, v, n_threads=threads)
        np.testing.assert_allclose(got, np.einsum("hj,hjd->hd", p.astype(np.float64), v),
                                   rtol=1e-5, atol=1e-4)


def test_decomposed_chain_matches_torch_sdpa(rng):
    """cache -> cast -> rope window -> repeat_interleave -> pack -> QK^T -> softmax -> PV
    equals torch SDPA with GQA on the roped keys."""
    L, Hkv, H, D = 130, 2, 8, 64
    cos, sin = blocks.rope_table(256, D)
    kc, vc = blocks.KVCache(256, Hkv, D, "f16"), blocks.KVCache(256, Hkv, D, "f16")
    k_raw, v_raw = rnd(rng, L, Hkv, D), rnd(rng, L, Hkv, D)
    for p in range(L):
        kc.write(p, k_raw[p])
        vc.write(p, v_raw[p])
    q = rnd(rng, H, D)
    blocks.rope(q, L - 1, cos, sin)
    k = blocks.rope_window(kc.read(0, L), cos, sin)
    kb = blocks.gqa_broadcast(k, H)
    vb = blocks.gqa_broadcast(vc.read(0, L), H)
    s = blocks.softmax(blocks.qk_packed(q, blocks.pack_k(kb), L))
    got = blocks.pv(s, vb)
    kt = torch.from_numpy(rope_ref(k_raw.astype(np.float16).astype(np.float32), np.arange(L)))
    vt = torch.from_numpy(v_raw.astype(np.float16).astype(np.float64))
    ref = torch.nn.functional.scaled_dot_product_attention(
        torch.from_numpy(q).double()[:, None, :], kt.permute(1, 0, 2).repeat_interleave(4, 0),
        vt.permute(1, 0, 2).repeat_interleave(4, 0))[:, 0, :].numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
