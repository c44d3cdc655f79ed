"""The files the harness and the native worker exchange (native/worker/sdpa_probe_worker.c
reads and writes them; all little-endian 64-bit words, byte strings padded to 8).

An arena holds every buffer of a case's calls as the harness laid them out (inputs with
their NaN slack, the output framed by guards and poisoned) with each buffer's address
modulo 64, its fence (flush against an inaccessible page, after or before) or, for a
buffer spread over gigabytes (the far layout), only the segments that hold elements;
then each call's sdpa_args, every pointer a (buffer, offset) pair. A result holds, per
call, its status, the output buffer as the call returned and after a short watch, the
inputs it wrote and the floating-point control state around it; the caller's state
before and after; and for a repeated call the heap, descriptors and mappings over the
repeats."""

from __future__ import annotations

import ctypes
import dataclasses
import struct

import numpy as np

from ..inputs.placement import FAR_MARGIN, FENCES
from ..native import _root_array, byte_bounds

ARENA_MAGIC = 0x314B525741504453   # "SDPAWRK1"
RESULT_MAGIC = 0x3153455241504453  # "SDPARES1"
MODE_SINGLE, MODE_REUSE, MODE_CONCURRENT = 0, 1, 2
FENCE_CODE = {None: 0, "after": 1, "before": 2}
SPARSE_OVER = 1 << 30  # bytes: a buffer this large is a far layout's sparse mapping
LATE_WRITE_WATCH_MS = 200  # judge.watched.LATE_WRITE_WAIT, in the worker


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class Writer:
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def u64(self, *values: int) -> None:
        self.parts.append(struct.pack(f"<{len(values)}q", *values))

    def raw(self, data: bytes) -> None:
        self.parts.append(data)
        self.parts.append(b"\0" * (-len(data) % 8))

    def bytes(self) -> bytes:
        return b"".join(self.parts)


@dataclasses.dataclass
class Buffer:
    array: np.ndarray          # the allocation (a root array: input_buffers' own)
    fence: str | None = None
    is_out: bool = False

    @property
    def lo(self) -> int:
        """Its first byte's address (a strided root, the far layout's, spans its gaps)."""
        return byte_bounds(self.array)[0]

    @property
    def size(self) -> int:
        lo, hi = byte_bounds(self.array)
        return max(hi - lo, 0)

    @property
    def sparse(self) -> bool:
        return self.size > SPARSE_OVER

    def segments(self) -> list[tuple[int, int]]:
        """(offset, length) of the bytes to send: all, or each batch of a far layout's
        buffer with the margin its mapping has either side (placement.far_empty)."""
        if not self.sparse:
            return [(0, self.size)]
        out = []
        for b in range(self.array.shape[0]):
            blo, bhi = byte_bounds(self.array[b])
            lo = max(0, blo - self.lo - FAR_MARGIN)
            out.append((lo, min(self.size, bhi - self.lo + FAR_MARGIN) - lo))
        return out

    def read(self, off: int, n: int) -> bytes:
        if not self.array.flags.c_contiguous:  # (its gaps are the harness's own mapping)
            return ctypes.string_at(self.lo + off, n)
        return self.array.reshape(-1).view(np.uint8)[off:off + n].tobytes()


class Layout:
    """A case's buffers, found from the arrays the harness made (input_buffers' roots and
    each output arena), and the pointers into them."""

    def __init__(self, fence: str | None) -> None:
        self.buffers: list[Buffer] = []
        self.fence = fence

    def add(self, array: np.ndarray, is_out: bool = False) -> int:
        root = _root_array(array)
        for i, b in enumerate(self.buffers):
            if b.array is root:
                return i
        self.buffers.append(Buffer(root, self.fence, is_out))
        return len(self.buffers) - 1

    def where(self, address: int) -> tuple[int, int]:
        """(buffer, offset) of a pointer; (-1, 0) for NULL."""
        if address == 0:
            return -1, 0
        for i, b in enumerate(self.buffers):
            if b.lo <= address < b.lo + max(b.size, 1):
                return i, address - b.lo
        raise ValueError(f"a pointer ({address:#x}) into no buffer the harness made")


def fence_of(layout: str) -> str | None:
    return FENCES.get(layout)


def _tensor(w: Writer, lay: Layout, ffi, t) -> None:
    addr = lambda p: int(ffi.cast("uintptr_t", p))  # noqa: E731
    w.u64(*lay.where(addr(t.data)), int(t.dtype), *[int(s) for s in t.stride])
    w.u64(*lay.where(addr(t.scale)), *lay.where(addr(t.zero_point)))
    w.u64(*[int(s) for s in t.qstride])


def write_call(w: Writer, lay: Layout, ffi, args, out_buf: int,
               rewrites: list[tuple[int, np.ndarray]] = ()) -> None:
    """One call: its output buffer, the buffers rewritten before it, its sdpa_args."""
    w.u64(out_buf, len(rewrites))
    for buf, content in rewrites:
        w.u64(buf)
        w.raw(np.ascontiguousarray(content).view(np.uint8).tobytes())
    a = args
    w.u64(int(a.abi_version), int(a.batch), int(a.n_heads), int(a.n_kv_heads), int(a.q_len),
          int(a.kv_len), int(a.head_dim))
    for t in (a.q, a.k, a.v, a.out):
        _tensor(w, lay, ffi, t)
    w.u64(*lay.where(int(ffi.cast("uintptr_t", a.mask))), int(a.mask_row_stride),
          int(a.is_causal), int(a.start_pos))
    w.parts.append(struct.pack("<d", float(a.scale)))
    w.u64(int(a.n_threads))


def arena_bytes(mode: int, kernel_name: str, lay: Layout, calls: list[bytes], *,
                callers: int = 1, rounds: int = 1, stack_kib: int = 0,
                repeats: bool = False) -> bytes:
    """The whole arena: header, buffers, then the calls (each made by write_call)."""
    w = Writer()
    w.u64(ARENA_MAGIC, 1, mode, len(lay.buffers), len(calls), callers, rounds, stack_kib,
          int(repeats), LATE_WRITE_WATCH_MS)
    w.raw(kernel_name.encode()[:63].ljust(64, b"\0"))
    for b in lay.buffers:
        segs = b.segments()
        w.u64(b.size, b.lo % 64, FENCE_CODE[b.fence], b.array.itemsize, int(b.is_out),
              len(segs), int(b.sparse))
        for off, n in segs:
            w.u64(off, n)
            w.raw(b.read(off, n))
    return w.bytes() + b"".join(calls)


# ---- the result ---------------------------------------------------------------

class Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def u64(self) -> int:
        if self.at + 8 > len(self.data):
            raise ValueError("the worker's result is truncated")
        (v,) = struct.unpack_from("<q", self.data, self.at)
        self.at += 8
        return v

    def raw(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise ValueError("the worker's result is truncated")
        out = self.data[self.at:self.at + n]
        self.at += n + (-n % 8)
        return out


@dataclasses.dataclass
class CallResult:
    status: int
    seconds: float
    fp_before: int
    fp_after: int
    written: list[tuple[int, int]]  # (buffer, elements changed)
    at_return: bytes
    final: bytes


@dataclasses.dataclass
class State:
    raw: bytes       # sdpa_probe_caller_state as the target laid it out
    env: dict[str, str]


@dataclasses.dataclass
class WorkerResult:
    calls: list[CallResult]
    state_before: State
    state_after: State
    repeat_resources: list[tuple[int, int, int]] | None = None  # heap, fds, mapped bytes
    repeat: CallResult | None = None
    state_after_repeats: State | None = None


def _call(r: Reader) -> CallResult:
    status, ns, fb, fa = r.u64(), r.u64(), r.u64() & (2**64 - 1), r.u64() & (2**64 - 1)
    written = [(r.u64(), r.u64()) for _ in range(r.u64())]
    size = r.u64()
    return CallResult(status, ns / 1e9, fb, fa, written, r.raw(size), r.raw(size))


def _state(r: Reader) -> State:
    raw = r.raw(r.u64())
    env: dict[str, str] = {}
    for item in r.raw(r.u64()).split(b"\0"):
        if item:
            name, _, value = item.decode("utf-8", "replace").partition("=")
            env[name] = value
    return State(raw, env)


def read_result(data: bytes) -> WorkerResult:
    r = Reader(data)
    if r.u64() != RESULT_MAGIC:
        raise ValueError("the worker's result does not start as one")
    before = _state(r)
    calls = [_call(r) for _ in range(r.u64())]
    res = WorkerResult(calls, before, _state(r))
    if r.u64():
        res.repeat_resources = [(r.u64(), r.u64(), r.u64()) for _ in range(r.u64())]
        res.repeat = _call(r)
        res.state_after_repeats = _state(r)
    return res
