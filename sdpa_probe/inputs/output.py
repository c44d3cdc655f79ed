"""The output buffer: framed by guard regions and pre-filled with poison, so a missing or
out-of-bounds write shows, and copied the moment a call returns, so a late write shows."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..cases import Case
from .placement import FENCES, HEAD_PAD, fenced_empty, misaligned_empty, tensor_layouts

OUT_NP = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16, "i8": np.float32}

# Bit patterns: poison is what an unwritten output element still holds; guard
# fills the regions around the output. Both are finite, so NaN checks stay clean.
POISON = {np.dtype(np.float32): (np.uint32, 0xFF7A5A5A), np.dtype(np.float16): (np.uint16, 0xFBFE),
          np.dtype(np.uint16): (np.uint16, 0xFF5A)}

GUARD = {np.dtype(np.float32): (np.uint32, 0x7F3C3C3C), np.dtype(np.float16): (np.uint16, 0x7BCD),
         np.dtype(np.uint16): (np.uint16, 0x7F3C)}


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
