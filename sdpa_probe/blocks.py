"""Thin numpy wrapper over the native decode building blocks (sdpa_probe_blocks.h).

Every function checks dtypes, shapes and C-contiguity, hands the buffers to C
with ffi.from_buffer (no copies) and turns a non-zero status into an exception
(sdpa_probe.errors.SdpaInvalid / SdpaUnsupported). A ValueError means the
arrays were rejected before any native call.
"""

from __future__ import annotations

import numpy as np

from . import native

ROPE_STYLES = {"half": 0, "interleaved": 1}
CACHE_DTYPES = {"f32": (native.F32, np.float32), "f16": (native.F16, np.float16),
                "i8": (native.I8, np.int8)}
PACK_NR = 8


def _lib():
    ffi, lib, _ = native.native_lib()
    return ffi, lib


def _check(a, dtype, name: str, shape: tuple | None = None, writable: bool = False) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise ValueError(f"{name}: expected a numpy array, got {type(a).__name__}")
    if a.dtype != np.dtype(dtype):
        raise ValueError(f"{name}: dtype must be {np.dtype(dtype)}, got {a.dtype}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: array must be C-contiguous")
    if shape is not None and a.shape != tuple(shape):
        raise ValueError(f"{name}: shape must be {tuple(shape)}, got {a.shape}")
    if writable and not a.flags.writeable:
        raise ValueError(f"{name}: array must be writable")
    return a


_CTYPES = {np.dtype(np.float32): "float[]", np.dtype(np.float16): "uint16_t[]",
           np.dtype(np.int8): "int8_t[]", np.dtype(np.int64): "int64_t[]",
           np.dtype(np.uint16): "uint16_t[]"}


def _ptr(ffi, a: np.ndarray):
    """A C pointer into a's buffer (NULL for an empty array: the C side accepts that for n = 0)."""
    if a.size == 0:
        return ffi.NULL
    return ffi.from_buffer(_CTYPES[a.dtype], a)


def _out(out, shape, dtype, name="out") -> np.ndarray:
    if out is None:
        return np.empty(shape, dtype=dtype)
    return _check(out, dtype, name, shape, writable=True)


def _status(st: int, what: str) -> None:
    native.raise_for_status(int(st), what)


# ---- normalisation, elementwise, casts ---------------------------------------

def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float = 1e-6, out: np.ndarray | None = None):
    """RMSNorm over the last axis of x (float32), weight w [n]."""
    ffi, lib = _lib()
    _check(x, np.float32, "x")
    if x.ndim < 1:
        raise ValueError("x: needs at least one axis")
    n = x.shape[-1]
    _check(w, np.float32, "w", (n,))
    y = _out(out, x.shape, np.float32)
    rows = x.size // n if n else 0
    _status(lib.sdpa_probe_rmsnorm(_ptr(ffi, x), _ptr(ffi, w), _ptr(ffi, y), rows, n, eps),
            "rmsnorm")
    return y


def residual_add(x: np.ndarray, r: np.ndarray) -> np.ndarray:
    """x += r in place (float32, same shape); returns x."""
    ffi, lib = _lib()
    _check(x, np.float32, "x", writable=True)
    _check(r, np.float32, "r", x.shape)
    _status(lib.sdpa_probe_residual_add(_ptr(ffi, x), _ptr(ffi, r), x.size), "residual_add")
    return x


def silu_gate(gate: np.ndarray, up: np.ndarray, out: np.ndarray | None = None,
              n_threads: int = 0) -> np.ndarray:
    """silu(gate) * up (float32)."""
    ffi, lib = _lib()
    _check(gate, np.float32, "gate")
    _check(up, np.float32, "up", gate.shape)
    y = _out(out, gate.shape, np.float32)
    _status(lib.sdpa_probe_silu_gate(_ptr(ffi, gate), _ptr(ffi, up), _ptr(ffi, y), gate.size,
                                     n_threads), "silu_gate")
    return y


def _cast(name: str, src: np.ndarray, src_dtype, dst_dtype, out, n_threads: int):
    ffi, lib = _lib()
    _check(src, src_dtype, "src")
    y = _out(out, src.shape, dst_dtype)
    _status(getattr(lib, f"sdpa_probe_{name}")(_ptr(ffi, src), _ptr(ffi, y), src.size,
                                               n_threads), name)
    return y


def cast_f16_f32(src: np.ndarray, out: np.ndarray | None = None, n_threads: int = 0):
    return _cast("cast_f16_f32", src, np.float16, np.float32, out, n_threads)


def cast_f32_f16(src: np.ndarray, out: np.ndarray | None = None, n_threads: int = 0):
    return _cast("cast_f32_f16", src, np.float32, np.float16, out, n_threads)


# ---- GEMV ----------------------------------------------------------------------

def gemv(w: np.ndarray, x: np.ndarray, out: np.ndarray | None = None, n_threads: int = 0):
    """y = W x for W [out, in] float32 or float16, x [in] float32."""
    ffi, lib = _lib()
    if not isinstance(w, np.ndarray) or w.ndim != 2:
        raise ValueError("w: expected a 2-D array [out, in]")
    if w.dtype == np.float32:
        fn = lib.sdpa_probe_gemv_f32
    elif w.dtype == np.float16:
        fn = lib.sdpa_probe_gemv_f16
    else:
        raise ValueError(f"w: dtype must be float32 or float16, got {w.dtype}")
    _check(w, w.dtype, "w")
    n_out, n_in = w.shape
    _check(x, np.float32, "x", (n_in,))
    y = _out(out, (n_out,), np.float32)
    _status(fn(_ptr(ffi, w), _ptr(ffi, x), _ptr(ffi, y), n_out, n_in, n_threads), "gemv")
    return y


# ---- RoPE ------------------------------------------------------------------------

def _style(style: str) -> int:
    if style not in ROPE_STYLES:
        raise ValueError(f"rope style must be one of {', '.join(ROPE_STYLES)}")
    return ROPE_STYLES[style]


def rope_table(n_pos: int, head_dim: int, theta: float = 10000.0):
    """(cos, sin), each float32 [n_pos, head_dim // 2]."""
    ffi, lib = _lib()
    if head_dim <= 0 or head_dim % 2 or n_pos < 0:
        raise ValueError("rope_table: head_dim must be even and positive, n_pos >= 0")
    cos = np.empty((n_pos, head_dim // 2), np.float32)
    sin = np.empty_like(cos)
    _status(lib.sdpa_probe_rope_table(_ptr(ffi, cos), _ptr(ffi, sin), n_pos, head_dim, theta),
            "rope_table")
    return cos, sin


def _table(cos, sin):
    _check(cos, np.float32, "cos")
    if cos.ndim != 2:
        raise ValueError("cos: expected [n_pos, head_dim // 2]")
    _check(sin, np.float32, "sin", cos.shape)
    return cos.shape[0], cos.shape[1] * 2


def rope(x: np.ndarray, pos: int, cos: np.ndarray, sin: np.ndarray, style: str = "half"):
    """Rotate one token's heads x [n_heads, head_dim] (float32) in place to position pos."""
    ffi, lib = _lib()
    n_pos, D = _table(cos, sin)
    _check(x, np.float32, "x", writable=True)
    if x.ndim != 2 or x.shape[1] != D:
        raise ValueError(f"x: expected [n_heads, {D}]")
    _status(lib.sdpa_probe_rope(_ptr(ffi, x), x.shape[0], D, pos, _ptr(ffi, cos), _ptr(ffi, sin),
                                n_pos, _style(style)), "rope")
    return x


def rope_window(src: np.ndarray, cos: np.ndarray, sin: np.ndarray, pos0: int = 0,
                positions: np.ndarray | None = None, out: np.ndarray | None = None,
                style: str = "half", n_threads: int = 0) -> np.ndarray:
    """RoPE over a window src [len, n_heads, head_dim]: row j at pos0 + j or positions[j]."""
    ffi, lib = _lib()
    n_pos, D = _table(cos, sin)
    _check(src, np.float32, "src")
    if src.ndim != 3 or src.shape[2] != D:
        raise ValueError(f"src: expected [len, n_heads, {D}]")
    y = _out(out, src.shape, np.float32)
    pp = ffi.NULL
    if positions is not None:
        _check(positions, np.int64, "positions", (src.shape[0],))
        pp = _ptr(ffi, positions)
    _status(lib.sdpa_probe_rope_window(_ptr(ffi, src), _ptr(ffi, y), src.shape[0], src.shape[1],
                                       D, pos0, pp, _ptr(ffi, cos), _ptr(ffi, sin), n_pos,
                                       _style(style), n_threads), "rope_window")
    return y


# ---- KV cache ----------------------------------------------------------------------

class KVCache:
    """One cache tensor (K or V of one layer) in numpy memory: data [capacity, n_kv_heads,
    head_dim] of f32 / f16 / i8; for i8 also scale (float32) and zero_point (int8)
    [capacity, n_kv_heads], real = (data - zero_point) * scale. ring_size > 0 makes it a
    ring (slot = pos % ring_size)."""

    def __init__(self, capacity: int, n_kv_heads: int, head_dim: int, dtype: str = "f32",
                 ring_size: int = 0, zero_point: bool = True):
        if dtype not in CACHE_DTYPES:
            raise ValueError(f"cache dtype must be one of {', '.join(CACHE_DTYPES)}")
        code, npdt = CACHE_DTYPES[dtype]
        self.dtype = dtype
        self.data = np.zeros((capacity, n_kv_heads, head_dim), npdt)
        self.scale = self.zero_point = None
        if code == native.I8:
            self.scale = np.ones((capacity, n_kv_heads), np.float32)
            if zero_point:
                self.zero_point = np.zeros((capacity, n_kv_heads), np.int8)
        ffi, _ = _lib()
        self._c = ffi.new("sdpa_probe_kv_cache *")
        self._keep = [ffi.from_buffer(_CTYPES[self.data.dtype], self.data)]
        self._c.data = self._keep[0]
        if self.scale is not None:
            self._keep.append(ffi.from_buffer("float[]", self.scale))
            self._c.scale = self._keep[-1]
        if self.zero_point is not None:
            self._keep.append(ffi.from_buffer("int8_t[]", self.zero_point))
            self._c.zero_point = self._keep[-1]
        self._c.dtype = code
        self._c.capacity, self._c.n_kv_heads, self._c.head_dim = capacity, n_kv_heads, head_dim
        self._c.ring_size = ring_size

    @property
    def shape(self):
        return self.data.shape

    def slot(self, pos: int) -> int:
        _, lib = _lib()
        return int(lib.sdpa_probe_kv_slot(self._c, pos))

    def write(self, pos: int, src: np.ndarray) -> None:
        """Store src [n_kv_heads, head_dim] (float32) as position pos."""
        ffi, lib = _lib()
        _check(src, np.float32, "src", self.data.shape[1:])
        _status(lib.sdpa_probe_kv_write(self._c, pos, _ptr(ffi, src)), "kv_write")

    def read(self, slot0: int = 0, n: int | None = None, out: np.ndarray | None = None,
             n_threads: int = 0) -> np.ndarray:
        """Slots [slot0, slot0 + n) as float32 [n, n_kv_heads, head_dim]."""
        ffi, lib = _lib()
        if n is None:
            n = self.data.shape[0] - slot0
        if n < 0:
            raise ValueError("n must be >= 0")
        y = _out(out, (n,) + self.data.shape[1:], np.float32)
        _status(lib.sdpa_probe_kv_read(self._c, slot0, n, _ptr(ffi, y), n_threads), "kv_read")
        return y

    def dequantized(self) -> np.ndarray:
        """The whole cache as float32, computed in numpy (a reference for read())."""
        if self.scale is None:
            return self.data.astype(np.float32)
        zp = 0 if self.zero_point is None else self.zero_point.astype(np.float32)
        return ((self.data.astype(np.float32) - np.asarray(zp)[..., None])
                * self.scale[..., None]).astype(np.float32)


# ---- the decomposed attention graph ------------------------------------------------

def gqa_broadcast(src: np.ndarray, n_heads: int, out: np.ndarray | None = None,
                  n_threads: int = 0) -> np.ndarray:
    """[len, n_kv_heads, D] -> [n_heads, len, D], head h reading kv head h // (n_heads / n_kv)."""
    ffi, lib = _lib()
    _check(src, np.float32, "src")
    if src.ndim != 3:
        raise ValueError("src: expected [len, n_kv_heads, head_dim]")
    L, hkv, D = src.shape
    y = _out(out, (n_heads, L, D), np.float32)
    _status(lib.sdpa_probe_gqa_broadcast(_ptr(ffi, src), _ptr(ffi, y), L, hkv, n_heads, D,
                                         n_threads), "gqa_broadcast")
    return y


def pack_k(k: np.ndarray, n_threads: int = 0) -> np.ndarray:
    """Pack K [heads, len, D] into panels [heads, ceil(len / 8), D, 8] (zero padded)."""
    ffi, lib = _lib()
    _check(k, np.float32, "k")
    if k.ndim != 3:
        raise ValueError("k: expected [heads, len, head_dim]")
    H, L, D = k.shape
    y = np.empty((H, (L + PACK_NR - 1) // PACK_NR, D, PACK_NR), np.float32)
    _status(lib.sdpa_probe_pack_k(_ptr(ffi, k), _ptr(ffi, y), H, L, D, n_threads), "pack_k")
    return y


def qk_packed(q: np.ndarray, kp: np.ndarray, length: int, scale: float = 0.0,
              n_threads: int = 0) -> np.ndarray:
    """scores [heads, length] = scale * q [heads, D] . K from pack_k()."""
    ffi, lib = _lib()
    _check(q, np.float32, "q")
    if q.ndim != 2:
        raise ValueError("q: expected [heads, head_dim]")
    H, D = q.shape
    _check(kp, np.float32, "kp", (H, (length + PACK_NR - 1) // PACK_NR, D, PACK_NR))
    y = np.empty((H, length), np.float32)
    _status(lib.sdpa_probe_qk_packed(_ptr(ffi, q), _ptr(ffi, kp), _ptr(ffi, y), H, length, D,
                                     scale, n_threads), "qk_packed")
    return y


def softmax(x: np.ndarray, n_threads: int = 0) -> np.ndarray:
    """Softmax over the last axis of x (float32), in place; returns x."""
    ffi, lib = _lib()
    _check(x, np.float32, "x", writable=True)
    if x.ndim < 1:
        raise ValueError("x: needs at least one axis")
    n = x.shape[-1]
    rows = x.size // n if n else 0
    _status(lib.sdpa_probe_softmax(_ptr(ffi, x), rows, n, n_threads), "softmax")
    return x


def pv(p: np.ndarray, v: np.ndarray, n_threads: int = 0) -> np.ndarray:
    """out [heads, D] = sum_j p[h, j] v[h, j, :]."""
    ffi, lib = _lib()
    _check(p, np.float32, "p")
    if p.ndim != 2:
        raise ValueError("p: expected [heads, len]")
    H, L = p.shape
    _check(v, np.float32, "v")
    if v.ndim != 3 or v.shape[:2] != (H, L):
        raise ValueError(f"v: expected [{H}, {L}, head_dim]")
    D = v.shape[2]
    y = np.empty((H, D), np.float32)
    _status(lib.sdpa_probe_pv(_ptr(ffi, p), _ptr(ffi, v), _ptr(ffi, y), H, L, D, n_threads), "pv")
    return y
