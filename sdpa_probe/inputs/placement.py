"""Where a tensor's elements lie: views into larger arenas whose slack holds NaN (so an
over-read shows), transposed, padded, reversed and misaligned views, batches 2^31
elements apart, and buffers flush against an inaccessible page."""

from __future__ import annotations

import os

import numpy as np
import torch

from ..errors import CaseUnavailable
from ..native import native_lib


def nan_fill(arena: np.ndarray) -> None:
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


FAR_MARGIN = 1 << 16  # bytes committed either side of a far layout's batch


def far_empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """An uninitialised [B, ...] array whose batches lie FAR_STRIDE elements apart, in
    one anonymous mapping reserved but not committed (PROT_NONE, MAP_NORESERVE): only
    the pages the batches' elements sit on are made readable and writable, a few KiB
    of gigabytes of address space (so a worker's limit on writable memory counts those
    alone). Its base is not an ndarray, so the harness's guards copy the elements, not
    the mapping."""
    dt = np.dtype(dtype)
    per = int(np.prod(shape[1:]))
    if per > FAR_STRIDE:
        raise ValueError(f"layout far: a batch of {per} elements exceeds the batch stride")
    nbytes = ((shape[0] - 1) * FAR_STRIDE + per) * dt.itemsize
    ffi, lib = native_lib()[:2]
    ptr = lib.sdpa_probe_reserve(nbytes)
    if ptr == ffi.NULL:  # (strict overcommit ignores MAP_NORESERVE)
        raise CaseUnavailable(f"layout far: cannot map {nbytes >> 30} GiB of address space "
                              f"({os.strerror(ffi.errno)})")
    ptr = ffi.gc(ptr, lambda p: lib.sdpa_probe_release(p, nbytes))
    for b in range(shape[0]):
        # (FAR_MARGIN either side: a read just past a batch lands in memory, as it would
        # in one mapping; the fenced layouts are the ones that fault on it)
        lo = max(0, b * FAR_STRIDE * dt.itemsize - FAR_MARGIN)
        hi = min(nbytes, (b * FAR_STRIDE + per) * dt.itemsize + FAR_MARGIN)
        if lib.sdpa_probe_commit(ptr, lo, hi - lo):
            raise CaseUnavailable(f"layout far: cannot commit batch {b}'s pages "
                                  f"({os.strerror(ffi.errno)})")
    flat = np.frombuffer(ffi.buffer(ptr, nbytes), dtype=dt)  # (the buffer keeps ptr)
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


HEAD_PAD = 8       # padded layout: elements between heads, NaN


def place(values: np.ndarray, layout: str, slack: int, label: str = "") -> np.ndarray:
    """Copy [B, S, H, D] values into an arena laid out per `layout`, return the view."""
    B, S, H, D = values.shape
    if layout in FENCES:  # no slack: the fence is what follows the last key
        view = fenced_empty((B, S, H, D), values.dtype, layout, label)
    elif layout == "bhsd":
        arena = np.empty((B, H, S + slack, D), dtype=values.dtype)
        nan_fill(arena)
        view = arena[:, :, :S, :].transpose(0, 2, 1, 3)
    elif layout == "qfused":  # [B, S, H + 2 H, D]: q heads, then room for k and v heads
        arena = np.empty((B, S + slack, 3 * H, D), dtype=values.dtype)
        nan_fill(arena)
        view = arena[:, :S, :H]
    elif layout == "dmajor":  # each (head, dim) a row of positions: dim stride S + slack
        arena = np.empty((B, H, D, S + slack), dtype=values.dtype)
        nan_fill(arena)
        view = arena[..., :S].transpose(0, 3, 1, 2)
    elif layout == "padded":
        arena = np.empty((B, S + slack, H + 1, D + HEAD_PAD), dtype=values.dtype)
        nan_fill(arena)
        view = arena[:, :S, :H, :D]
    elif layout == "reversed":  # positions and dims walked backwards: negative strides
        arena = np.empty((B, S + slack, H, D), dtype=values.dtype)
        nan_fill(arena)  # (the slack, past the last position, lies below the first)
        view = arena[:, slack:][:, ::-1, :, ::-1]
    elif layout == "far":
        arena = far_empty((B, S + slack, H, D), values.dtype)
        nan_fill(arena)
        view = arena[:, :S]
    else:  # bshd; offset: its base one element past a 64-byte boundary
        alloc = misaligned_empty if layout == "offset" else np.empty
        arena = alloc((B, S + slack, H, D), values.dtype)
        nan_fill(arena)
        view = arena[:, :S]
    view[...] = values
    return view


MASK_PAD = 5  # NaN floats after each mask row: the row stride is not kv_len


def padded_mask(mask: np.ndarray | None, layout: str = "bshd") -> np.ndarray | None:
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
