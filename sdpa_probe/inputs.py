"""Turning a Case into buffers: seeded inputs in their storage dtype, laid out
as views into larger arenas whose slack holds NaN (so an over-read shows),
the mask from its recipe, and an output buffer framed by guard regions and
pre-filled with poison (so a missing or out-of-bounds write shows)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import torch

from .cases import KV_BLOCK, Q_BLOCK, VALUE_RECIPES, ZERO_ROWS_EVERY, ZERO_ROWS_FIRST, Case
from .errors import CaseUnavailable
from .native import QuantTensor, _root_array

KV_SLACK = 16      # cache slots past kv_len, NaN
HEAD_PAD = 8       # padded layout: elements between heads, NaN
NEG_FINITE = float(np.finfo(np.float32).min)

STORAGE_NP = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16, "i8": np.int8}
OUT_NP = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16, "i8": np.float32}
# Bit patterns: poison is what an unwritten output element still holds; guard
# fills the regions around the output. Both are finite, so NaN checks stay clean.
POISON = {np.dtype(np.float32): (np.uint32, 0xFF7A5A5A), np.dtype(np.float16): (np.uint16, 0xFBFE),
          np.dtype(np.uint16): (np.uint16, 0xFF5A)}
GUARD = {np.dtype(np.float32): (np.uint32, 0x7F3C3C3C), np.dtype(np.float16): (np.uint16, 0x7BCD),
         np.dtype(np.uint16): (np.uint16, 0x7F3C)}
NAN_BITS = {np.dtype(np.float32): (np.uint32, 0x7FC00000),
            np.dtype(np.float16): (np.uint16, 0x7E00), np.dtype(np.uint16): (np.uint16, 0x7FC0)}

MASKS = ("none", "random", "rows:first", "rows:middle", "rows:last", "rows:block", "rows:far",
         "rows:negfinite", "window:W", "ring:W", "sink:S:W", *VALUE_RECIPES)


@dataclasses.dataclass
class CaseData:
    case: Case
    q: torch.Tensor            # real (stored, dequantised) values, float64 [B, Lq, H, D]
    k: torch.Tensor            # float64 [B, Lkv, Hkv, D]
    v: torch.Tensor
    mask: np.ndarray | None    # float32 [Lq, Lkv]
    q_store: object            # np.ndarray view or QuantTensor
    k_store: object
    v_store: object

    @property
    def mask_t(self) -> torch.Tensor | None:
        return None if self.mask is None else torch.from_numpy(self.mask)


# ---- masks -----------------------------------------------------------------------

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


# ---- storage ---------------------------------------------------------------------

def quantize_symmetric(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per (b, s, h) over the last dim: real = q * scale, no zero point."""
    amax = np.abs(x).max(axis=-1)
    scale = np.where(amax > 0, amax / 127.0, 1.0)
    q = np.clip(np.round(x / scale[..., None]), -127, 127)
    return q.astype(np.int8), scale.astype(np.float32)


def quantize_per_token(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Asymmetric int8 per (b, s, h) over the last dim: real = (q - zp) * scale."""
    lo = x.min(axis=-1)
    hi = x.max(axis=-1)
    rng_ = hi - lo
    scale = np.where(rng_ > 0, rng_ / 255.0, np.where(np.abs(hi) > 0, np.abs(hi) / 127.0, 1.0))
    zp = np.clip(np.round(-128.0 - lo / scale), -128, 127)
    q = np.clip(np.round(x / scale[..., None] + zp[..., None]), -128, 127)
    return q.astype(np.int8), scale.astype(np.float32), zp.astype(np.int8)


def _nan_fill(arena: np.ndarray) -> None:
    if arena.dtype == np.int8:
        arena.fill(0x7F)
    elif arena.dtype == np.uint16:
        arena.fill(0x7FC0)  # bf16 NaN
    else:
        arena.fill(np.nan)


def tensor_layouts(layout: str) -> tuple[str, str, str]:
    """The (Q, K, V) storage layouts of a case layout; the output takes Q's, except
    for `qfused`, whose output is a plain [B, S, H, D] tensor."""
    if layout == "vdmajor":   # llama.cpp's cache: K as usual, V transposed
        return "bshd", "bshd", "dmajor"
    if layout == "qfused":    # Q a view of a fused QKV projection's output
        return "qfused", "bshd", "bshd"
    return layout, layout, layout


ALIGN = 64  # the widest vector a kernel may load (AVX-512)


def misaligned_empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """np.empty whose first element sits one element past a 64-byte boundary: a kernel
    that assumes aligned rows (movaps, _mm512_load_ps, __builtin_assume_aligned) faults
    or reads the wrong bytes here, where a whole allocation's base, 16- or 64-aligned,
    hides it. Real tensors are views at any offset: a cache slice from a start position,
    one head of a fused projection."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape)) * dt.itemsize
    raw = np.zeros(n + 2 * ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGN + dt.itemsize
    return raw[start:start + n].view(dt).reshape(shape)


FAR_STRIDE = 2 ** 31 + 4096  # elements between the batches of the `far` layout


def far_empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """An uninitialised [B, ...] array whose batches lie FAR_STRIDE elements apart, in
    one anonymous mapping reserved but not committed (MAP_NORESERVE): only the pages
    the batches' elements sit on are ever touched, a few KiB of gigabytes of address
    space. Its base is not an ndarray, so the harness's guards copy the elements,
    not the mapping."""
    import mmap

    dt = np.dtype(dtype)
    per = int(np.prod(shape[1:]))
    if per > FAR_STRIDE:
        raise ValueError(f"layout far: a batch of {per} elements exceeds the batch stride")
    nbytes = ((shape[0] - 1) * FAR_STRIDE + per) * dt.itemsize
    try:
        mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                       | getattr(mmap, "MAP_NORESERVE", 0))
    except (OSError, OverflowError) as exc:  # (strict overcommit ignores MAP_NORESERVE)
        raise CaseUnavailable(f"layout far: cannot map {nbytes >> 30} GiB of address space "
                              f"({exc})") from None
    flat = np.frombuffer(mm, dtype=dt)
    inner = np.empty(shape[1:], dtype=dt).strides  # C order within a batch
    return np.lib.stride_tricks.as_strided(flat, shape=shape,
                                           strides=(FAR_STRIDE * dt.itemsize, *inner))


# layouts whose every input ends (or starts) flush against an inaccessible page
FENCES = {"fenced": "after", "fenced-start": "before"}


def fenced_empty(shape: tuple[int, ...], dtype, layout: str, label: str) -> np.ndarray:
    """An uninitialised C-order array whose last byte ends a page with an inaccessible
    page after it (`fenced`), or whose first byte starts one after such a page
    (`fenced-start`): a kernel that touches a byte past the tensor's end or before its
    start (a full vector loaded over a row's tail, a block of keys read past kv_len, a
    row before the first) faults at once and the record names the tensor. Everywhere
    else such a read lands in slack and goes unseen when its value is discarded."""
    from .native import native_lib

    ffi, lib = native_lib()[:2]
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dt.itemsize
    where = (lib.SDPA_PROBE_FENCE_AFTER if FENCES[layout] == "after"
             else lib.SDPA_PROBE_FENCE_BEFORE)
    ptr = lib.sdpa_probe_fence_alloc(nbytes, where, label.encode())
    if ptr == ffi.NULL:
        raise CaseUnavailable(f"layout {layout}: cannot map a fenced buffer for {label} "
                              f"({os.strerror(ffi.errno)})")
    ptr = ffi.gc(ptr, lib.sdpa_probe_fence_free)  # (the buffer keeps ptr, the array it)
    return np.frombuffer(ffi.buffer(ptr, nbytes), dtype=dt).reshape(shape)


def fenced_tensor(t: torch.Tensor, layout: str, label: str) -> torch.Tensor:
    """A contiguous copy of t in a fenced buffer (`layout` one of FENCES): torch's and
    ExecuTorch's inputs on a fenced case, so that the peers meet the same fences."""
    if layout not in FENCES:
        return t
    bits = {torch.bfloat16: np.uint16}.get(t.dtype)  # (numpy has no bfloat16)
    arr = fenced_empty(tuple(t.shape), bits or torch.empty(0, dtype=t.dtype).numpy().dtype,
                       layout, label)
    out = torch.from_numpy(arr)
    out = out.view(t.dtype) if bits else out
    out.copy_(t)
    return out


def _place(values: np.ndarray, layout: str, slack: int, label: str = "") -> np.ndarray:
    """Copy [B, S, H, D] values into an arena laid out per `layout`, return the view."""
    B, S, H, D = values.shape
    if layout in FENCES:  # no slack: the fence is what follows the last key
        view = fenced_empty((B, S, H, D), values.dtype, layout, label)
    elif layout == "bhsd":
        arena = np.empty((B, H, S + slack, D), dtype=values.dtype)
        _nan_fill(arena)
        view = arena[:, :, :S, :].transpose(0, 2, 1, 3)
    elif layout == "qfused":  # [B, S, H + 2 H, D]: q heads, then room for k and v heads
        arena = np.empty((B, S + slack, 3 * H, D), dtype=values.dtype)
        _nan_fill(arena)
        view = arena[:, :S, :H]
    elif layout == "dmajor":  # each (head, dim) a row of positions: dim stride S + slack
        arena = np.empty((B, H, D, S + slack), dtype=values.dtype)
        _nan_fill(arena)
        view = arena[..., :S].transpose(0, 3, 1, 2)
    elif layout == "padded":
        arena = np.empty((B, S + slack, H + 1, D + HEAD_PAD), dtype=values.dtype)
        _nan_fill(arena)
        view = arena[:, :S, :H, :D]
    elif layout == "reversed":  # positions and dims walked backwards: negative strides
        arena = np.empty((B, S + slack, H, D), dtype=values.dtype)
        _nan_fill(arena)  # (the slack, past the last position, lies below the first)
        view = arena[:, slack:][:, ::-1, :, ::-1]
    elif layout == "far":
        arena = far_empty((B, S + slack, H, D), values.dtype)
        _nan_fill(arena)
        view = arena[:, :S]
    else:  # bshd; offset: its base one element past a 64-byte boundary
        alloc = misaligned_empty if layout == "offset" else np.empty
        arena = alloc((B, S + slack, H, D), values.dtype)
        _nan_fill(arena)
        view = arena[:, :S]
    view[...] = values
    return view


def _store(x64: np.ndarray, dtype: str, layout: str, slack: int, symmetric: bool = False,
           name: str = ""):
    """x64 [B, S, H, D] -> (stored real values as float64, storage object); name (Q, K,
    V) labels a fenced buffer."""
    if dtype == "f32":
        s = x64.astype(np.float32)
        return s.astype(np.float64), _place(s, layout, slack, name)
    if dtype == "f16":
        s = x64.astype(np.float16)
        return s.astype(np.float64), _place(s, layout, slack, name)
    if dtype == "bf16":
        t = torch.from_numpy(x64).to(torch.bfloat16)
        bits = t.view(torch.int16).numpy().view(np.uint16)
        return t.to(torch.float64).numpy(), _place(bits, layout, slack, name)
    ql = layout if layout in ("offset", "reversed", *FENCES) else "bshd"
    if symmetric:  # no zero-point array at all: the ABI's NULL
        q, scale = quantize_symmetric(x64)
        real = q.astype(np.float64) * scale[..., None]
        return real, QuantTensor(_place(q, layout, slack, name),
                                 _place(scale[..., None], ql, slack, f"{name} scales")[..., 0],
                                 None)
    q, scale, zp = quantize_per_token(x64)
    real = (q.astype(np.float64) - zp[..., None].astype(np.float64)) * scale[..., None]
    qv = _place(q, layout, slack, name)
    # scale / zero point with the same slack; NaN scales past kv_len poison over-reads
    sc = _place(scale[..., None], ql, slack, f"{name} scales")[..., 0]
    zpv = _place(zp[..., None], ql, slack, f"{name} zero points")[..., 0]
    return real, QuantTensor(qv, sc, zpv)


MASK_PAD = 5  # NaN floats after each mask row: the row stride is not kv_len


def _padded_rows(mask: np.ndarray | None, layout: str = "bshd") -> np.ndarray | None:
    """The mask as a view into wider rows, as a slice of a model's precomputed
    [max_seq, max_seq] mask is: a kernel that takes kv_len for the row stride
    reads the NaN padding or the wrong row. (A fenced layout's mask is its rows alone,
    against the fence.)"""
    if mask is None:
        return None
    if layout in FENCES:
        fenced = fenced_empty(mask.shape, np.float32, layout, "the mask")
        fenced[...] = mask
        return fenced
    misaligned = layout == "offset"
    shape = (mask.shape[0], mask.shape[1] + MASK_PAD)
    arena = misaligned_empty(shape, np.float32) if misaligned else np.empty(shape, np.float32)
    arena.fill(np.nan)
    view = arena[:, :mask.shape[1]]
    view[...] = mask
    return view


def _poison_future_slots(store, first: int) -> None:
    """NaN in the stored K / V of positions >= first (int8: their scales), which
    bottom-right causal hides from every query row. A static KV cache holds stale
    or uninitialised slots there; a kernel that still multiplies them in (an
    additive -inf on their scores, then 0 x V) turns garbage into NaN rows. The
    real values the oracle and torch get stay finite: those keys weigh exactly 0."""
    from .native import QuantTensor

    if isinstance(store, QuantTensor):
        store.scale[:, first:] = np.nan
    elif store.dtype == np.uint16:
        store[:, first:] = NAN_BITS[np.dtype(np.uint16)][1]
    else:
        store[:, first:] = np.nan


def _nan_sites(case: Case) -> list[tuple[str, int, int, int]]:
    """Where the nan-inputs recipe puts its NaN, as (tensor, position, head, dim): one
    element of K (kv head 0) and of V (kv head 1), each at a key every row sees, and
    one of Q (row 0 of the last head). The rows that read one are NaN, as in torch;
    the last kv head's other rows stay finite, so a kernel that gives NaN everywhere
    fails too. A kernel whose running max passes over NaN (`if (s > mx) mx = s`) takes
    a row whose every score is NaN for one that sees no key and gives zeros. int8
    values cannot be NaN: there the token's scale is. (Keys hidden from only some
    rows are left alone: whether NaN + -inf reaches such a row is a matter of
    convention, and torch's math and flash paths differ.)"""
    if case.n_kv_heads < 3:
        raise ValueError("nan-inputs: at least 3 kv heads (one of them left clean)")
    seen = min(case.start_pos + 1, case.kv_len) if case.causal else case.kv_len
    D = case.head_dim
    return [("k", seen // 2, 0, 5 % D), ("v", seen // 3, 1, 7 % D),
            ("q", 0, case.n_heads - 1, 3 % D)]


def materialise(case: Case) -> CaseData:
    rng = np.random.default_rng([case.seed, 0x5D9A])
    B, Lq, H, Hkv, D, Lkv = (case.batch, case.q_len, case.n_heads, case.n_kv_heads,
                             case.head_dim, case.kv_len)
    q = rng.standard_normal((B, Lq, H, D)) * case.magnitude
    k = rng.standard_normal((B, Lkv, Hkv, D)) * case.magnitude
    v = rng.standard_normal((B, Lkv, Hkv, D)) * case.v_magnitude
    nan_sites = _nan_sites(case) if case.mask == "nan-inputs" else []
    for name, j, h, d in nan_sites:  # (in an int8 tensor: its token's scale, below)
        if (case.out_dtype if name == "q" else case.dtype) != "i8":
            {"q": q, "k": k, "v": v}[name][:, j, h, d] = np.nan
    if case.mask == "constant-token" and Lkv > 5:
        k[:, 3] = 0.75      # a constant token: zero quantization range
        v[:, 5] = -1.25
        v[:, 4] = 0.0
    if case.mask == "zero-tokens":
        v[:, ZERO_ROWS_FIRST::ZERO_ROWS_EVERY] = 0.0  # (cases.ZERO_ROWS_*)
    mask = _padded_rows(make_mask(case, rng), case.layout)
    lq, lk, lv = tensor_layouts(case.layout)
    sym = case.quant == "sym"
    q_real, q_store = _store(q, case.out_dtype, lq, 0, sym, "Q")
    k_real, k_store = _store(k, case.dtype, lk, KV_SLACK, sym, "K")
    v_real, v_store = _store(v, case.dtype, lv, KV_SLACK, sym, "V")
    stored = {"q": (q_real, q_store), "k": (k_real, k_store), "v": (v_real, v_store)}
    for name, j, h, _d in nan_sites:  # int8: the token's scale, and so all its real values
        real, store = stored[name]
        if isinstance(store, QuantTensor):
            store.scale[:, j, h] = np.nan
            real[:, j, h, :] = np.nan
    if case.causal:  # cache slots no row can see: stale or never written in a real cache
        _poison_future_slots(k_store, case.start_pos + Lq)
        _poison_future_slots(v_store, case.start_pos + Lq)
    t = torch.from_numpy
    return CaseData(case, t(q_real), t(k_real), t(v_real), mask, q_store, k_store, v_store)


# ---- the inputs are read-only -------------------------------------------------------

def input_buffers(data: CaseData) -> dict[str, np.ndarray]:
    """Every buffer a kernel is given to read, whole (the allocation a view lies in,
    slack included: what a stray write can reach), by what it is."""
    bufs: dict[str, np.ndarray] = {}
    for name, st in (("Q", data.q_store), ("K", data.k_store), ("V", data.v_store)):
        if isinstance(st, QuantTensor):
            bufs[name] = _root_array(st.data)
            bufs[f"{name} scales"] = _root_array(st.scale)
            if st.zero_point is not None:
                bufs[f"{name} zero points"] = _root_array(st.zero_point)
        else:
            bufs[name] = _root_array(st)
    if data.mask is not None:
        bufs["mask"] = _root_array(data.mask)
    out: dict[str, np.ndarray] = {}
    for name, a in bufs.items():  # (one allocation may hold two inputs: count it once)
        if not any(a is b for b in out.values()):
            out[name] = a
    return out


class InputGuard:
    """A copy of the inputs before a call, to tell afterwards which ones it wrote: a
    kernel that scales Q in place, dequantises into K or uses the mask as scratch can
    still return the right output, while the caller's tensors (a KV cache the next
    decode step reads) are corrupted."""

    def __init__(self, data: CaseData):
        self.bufs = input_buffers(data)
        self.before = {n: a.copy() for n, a in self.bufs.items()}

    def written(self) -> list[tuple[str, int]]:
        """(input, elements changed) for each input the call wrote, bitwise (NaN included)."""
        out = []
        for name, a in self.bufs.items():
            bits = np.dtype(f"u{a.dtype.itemsize}")
            n = int((a.reshape(-1).view(bits) != self.before[name].reshape(-1).view(bits)).sum())
            if n:
                out.append((name, n))
        return out


# ---- the output buffer ------------------------------------------------------------

GUARD_ELEMS = 64


@dataclasses.dataclass
class OutBuffer:
    arena: np.ndarray      # every element, guard regions included
    view: np.ndarray       # [B, Lq, H, D] as the kernel sees it
    inside: np.ndarray     # bool, arena elements that belong to the view
    # the arena as the last native call left it, copied in C the moment it returned
    at_return: np.ndarray | None = None

    def written_after_return(self) -> tuple[int, tuple | None]:
        """Elements of the arena changed since the call returned (a kernel's thread
        still writing), and the first one's [b, q, h, d] (None: in a guard region)."""
        if self.at_return is None:
            return 0, None
        bits_t = POISON[self.arena.dtype][0]
        n = int((self.arena.view(bits_t) != self.at_return.view(bits_t)).sum())
        if not n:
            return 0, None
        # the copy seen through the view's own offset and strides (a view may be strided)
        off = self._view_offset() // self.arena.itemsize
        then = np.lib.stride_tricks.as_strided(self.at_return.reshape(-1)[off:],
                                               shape=self.view.shape,
                                               strides=self.view.strides)
        moved = np.argwhere(self.view.view(bits_t) != then.view(bits_t))
        return n, (tuple(int(x) for x in moved[0]) if len(moved) else None)

    def snapshot(self) -> OutBuffer:
        """The arena as it is now, copied, with the view at the same offset and strides:
        a verdict's layers read one moment, while a kernel's stray thread may still be
        storing (read live, poison could be gone by the poison layer and still be in the
        values the error layer compares)."""
        arena = self.arena.copy()
        view = np.ndarray(self.view.shape, self.view.dtype, arena, self._view_offset(),
                          self.view.strides)
        return OutBuffer(arena, view, self.inside, self.at_return)

    def _view_offset(self) -> int:
        """Bytes from the arena's start to the view's first element."""
        return (self.view.__array_interface__["data"][0]
                - self.arena.__array_interface__["data"][0])

    @property
    def bits_dtype(self):
        return POISON[self.arena.dtype][0]

    def poison_count(self) -> tuple[int, tuple | None]:
        bits_t, poison = POISON[self.arena.dtype]
        hit = self.view.view(bits_t) == poison
        n = int(hit.sum())
        return n, (tuple(int(x) for x in np.argwhere(hit)[0]) if n else None)

    def guard_violations(self) -> tuple[int, int | None]:
        bits_t, guard = GUARD[self.arena.dtype]
        bad = (self.arena.view(bits_t) != guard) & ~self.inside
        n = int(bad.sum())
        return n, (int(np.argwhere(bad.reshape(-1))[0][0]) if n else None)

    def repoison(self) -> None:
        """The view's elements to the poison pattern (before a call, or a repeated one)."""
        bits_t, poison = POISON[self.arena.dtype]
        self.view.view(bits_t)[...] = poison

    def values(self) -> np.ndarray:
        """The view as float64 (bf16 bits decoded)."""
        if self.view.dtype == np.uint16:
            t = torch.from_numpy(np.ascontiguousarray(self.view).view(np.int16))
            return t.view(torch.bfloat16).to(torch.float64).numpy()
        return self.view.astype(np.float64)


def out_buffer(case: Case) -> OutBuffer:
    B, Lq, H, D = case.batch, case.q_len, case.n_heads, case.head_dim
    dt = np.dtype(OUT_NP[case.out_dtype])
    g = GUARD_ELEMS
    layout = tensor_layouts(case.layout)[0]
    if layout == "qfused":
        layout = "bshd"
    if layout == "padded":
        shape = (B, Lq, H + 1, D + HEAD_PAD)
        n = int(np.prod(shape))
        flat = np.empty(n + 2 * g, dtype=dt)
        body = flat[g:g + n].reshape(shape)
        view = body[:, :, :H, :D]
    elif layout == "bhsd":
        n = B * H * Lq * D
        flat = np.empty(n + 2 * g, dtype=dt)
        view = flat[g:g + n].reshape(B, H, Lq, D).transpose(0, 2, 1, 3)
    elif layout == "dmajor":
        n = B * H * Lq * D
        flat = np.empty(n + 2 * g, dtype=dt)
        view = flat[g:g + n].reshape(B, H, D, Lq).transpose(0, 3, 1, 2)
    elif layout in FENCES:  # the fence on one side of the body, a guard region on the other
        n = B * Lq * H * D
        flat = fenced_empty((n + g,), dt, layout, "the output")
        at = g if FENCES[layout] == "after" else 0
        view = flat[at:at + n].reshape(B, Lq, H, D)
    else:  # bshd; offset misaligned (the guard is a multiple of 64 bytes: the body too)
        n = B * Lq * H * D
        flat = (misaligned_empty if layout == "offset" else np.empty)((n + 2 * g,), dt)
        view = flat[g:g + n].reshape(B, Lq, H, D)
    bits_t, guard = GUARD[dt]
    # mark the view's elements to learn which arena elements belong to it
    flat.view(bits_t).fill(0)
    view.view(bits_t)[...] = 1
    inside = flat.view(bits_t) == 1
    flat.view(bits_t).fill(guard)
    buf = OutBuffer(flat, view, inside)
    buf.repoison()
    return buf


__all__ = ["CaseData", "OutBuffer", "materialise", "out_buffer", "make_mask", "KV_BLOCK"]
