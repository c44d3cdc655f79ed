"""Bench parties: what is timed on a shape. A party has a name, run(n) -> the
seconds of each of n calls, and call(n): n calls untimed one by one. Every SDPA
party of a run is made by make_party: a native kernel behind the C ABI (timed in
the library's C loop), torch's or ExecuTorch's SDPA (timed call by call from
Python, as their users call them)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from importlib import metadata

from .. import native
from ..errors import ProbeError
from .inputs import Inputs
from .kernels import resolve_kernels
from .shapes import Shape


class Party:
    """Something to time on a shape: run(n) makes n calls and returns their seconds;
    call(n) makes n calls without keeping them (what alloc_count counts)."""

    name: str

    def run(self, n: int) -> list[float]:
        raise NotImplementedError

    def call(self, n: int) -> None:
        self.run(n)


class NativeParty(Party):
    """A kernel behind the C ABI, timed in the library's C loop: a registered kernel
    by its index, a user kernel through its sdpa_forward's address."""

    def __init__(self, kernel: native.Kernel, shape: Shape, sets: list[Inputs], threads: int):
        self.name = kernel.name
        self.kernel = kernel
        self.shape = shape
        self.threads = threads
        # a registered kernel runs in its own library's loop; a user kernel's module has
        # none, so it runs in ours
        ffi, lib = (native.native_lib()[:2] if kernel.user else (kernel.ffi, kernel.lib))
        if not hasattr(lib, "sdpa_probe_bench_loop_fn"):
            raise ProbeError("the native library lacks sdpa_probe_bench_loop_fn (stale build?)")
        self._lib, self._ffi = lib, ffi
        self._fn = None
        if kernel.user:
            uffi = kernel.ffi
            address = int(uffi.cast("uintptr_t", uffi.addressof(kernel.lib, "sdpa_forward")))
            self._fn = ffi.cast("sdpa_probe_forward_fn", address)
        self._calls = [native.prepare(ffi, s.q, s.k, s.v, s.out, is_causal=shape.causal,
                                      start_pos=shape.start_pos, n_threads=threads)
                       for s in sets]
        self._args = ffi.new("sdpa_args[]", len(self._calls))
        for i, c in enumerate(self._calls):
            self._args[i] = c.args[0]
        self._next = 0

    def run(self, n: int) -> list[float]:
        buf = self._ffi.new("double[]", n)
        self.call(n, buf)
        return list(self._ffi.unpack(buf, n))

    def call(self, n: int, seconds_out=None) -> None:
        """n calls in the C loop (each call's seconds into seconds_out, if given)."""
        # rotate through the sets across batches: start where the last batch stopped
        k = len(self._calls)
        order = self._ffi.new("sdpa_args[]", k)
        for i in range(k):
            order[i] = self._args[(self._next + i) % k]
        buf = self._ffi.NULL if seconds_out is None else seconds_out
        if self._fn is not None:
            st = self._lib.sdpa_probe_bench_loop_fn(self._fn, order, k, n, buf)
        else:
            st = self._lib.sdpa_probe_bench_loop(self.kernel.info.index, order, k, n, buf)
        native.raise_for_status(int(st), self.name)
        self._next = (self._next + n) % k


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 to /dev/null (ExecuTorch's ops log every call there)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


class _PyParty(Party):
    """A Python callable per input set, timed call by call."""

    def __init__(self, name: str, fns: list[Callable[[], object]], quiet: bool = False):
        self.name = name
        self._fns = fns
        self._next = 0
        self._quiet = quiet

    def run(self, n: int) -> list[float]:
        import torch  # deferred: torch takes seconds to import

        out = []
        fns, k = self._fns, len(self._fns)
        with torch.no_grad(), (_quiet_stderr() if self._quiet else contextlib.nullcontext()):
            for _ in range(n):
                f = fns[self._next]
                self._next = (self._next + 1) % k
                t0 = time.perf_counter()
                f()
                out.append(time.perf_counter() - t0)
        return out


_TORCH_DT = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def torch_party(shape: Shape, sets: list[Inputs]) -> Party:
    """torch.nn.functional.scaled_dot_product_attention on contiguous [B, H, L, D]
    tensors in the shape's dtype (float32 on the dequantised values for int8), a
    copy per input set."""
    import torch  # deferred: torch takes seconds to import
    import torch.nn.functional as F  # (deferred with it)

    dt = getattr(torch, _TORCH_DT.get(shape.dtype, "float32"))
    gqa = shape.n_heads != shape.n_kv_heads
    mask = None
    is_causal = shape.causal
    if shape.causal and shape.q_len != shape.kv_len:
        # torch's is_causal is top-left aligned; ours is bottom-right
        i = torch.arange(shape.q_len)[:, None] + shape.start_pos
        mask = torch.arange(shape.kv_len)[None, :] <= i
        is_causal = False
    fns = []
    for s in sets:
        # (copy=True: a decode q [B, 1, H, D] permuted is contiguous already, and
        # would otherwise be the sets' one shared array)
        q, k, v = (torch.from_numpy(x).to(dt, copy=True).permute(0, 2, 1, 3).contiguous()
                   for x in (s.q32, s.k32, s.v32))

        def call(q=q, k=k, v=v):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                                  enable_gqa=gqa)
        fns.append(call)
    return _PyParty("torch", fns)


def executorch_unsupported(shape: Shape) -> str | None:
    """Why ExecuTorch's custom ops cannot take this shape (they abort instead of
    returning an error), or None."""
    if shape.q_len > shape.kv_len:
        return "q_len > kv_len"
    if shape.n_heads % shape.n_kv_heads:
        return "n_heads not a multiple of n_kv_heads"
    if shape.dtype not in ("f32", "f16", "bf16", "i8"):
        return f"no {shape.dtype} path"
    return None


def executorch_inputs(shape: Shape, s: Inputs) -> tuple:
    """One input set as the ExecuTorch op's tensors: (q, k, v) for float shapes,
    (q, k, v, qz, qs, kz, ks, vz, vs) for int8; each set's own memory, so that a
    cold rotation reads what it says."""
    import torch  # deferred: torch takes seconds to import

    if shape.dtype == "i8":
        def parts(x: native.QuantTensor):
            return (torch.from_numpy(x.data), torch.from_numpy(x.zero_point)[..., None],
                    torch.from_numpy(x.scale)[..., None])

        (q, qz, qs), (k, kz, ks), (v, vz, vs) = (parts(x) for x in (s.q, s.k, s.v))
        return q, k, v, qz, qs, kz, ks, vz, vs
    # a copy: the sets share their float32 values, and .to(float32) of them is none
    # (else every cold F32 call would read the one same buffer)
    dt = getattr(torch, _TORCH_DT[shape.dtype])
    return tuple(torch.from_numpy(x).to(dt, copy=True) for x in (s.q32, s.k32, s.v32))


def executorch_party(shape: Shape, sets: list[Inputs]) -> Party:
    """llama.custom_sdpa (float) / llama.custom_quantized_sdpa (int8 per token) on
    [B, S, H, D]; start_pos makes the op read keys [0, kv_len)."""
    import torch  # deferred: torch takes seconds to import

    from ..backends import _load_executorch  # deferred: backends imports torch

    _load_executorch()
    start_pos = shape.kv_len - shape.q_len
    fns = []
    for s in sets:
        t = executorch_inputs(shape, s)
        if shape.dtype == "i8":
            def call(t=t):
                q, k, v, qz, qs, kz, ks, vz, vs = t
                return torch.ops.llama.custom_quantized_sdpa(
                    q, k, v, start_pos, None, 0.0, shape.causal, None, qz, qs, kz, ks, vz, vs,
                    False)
        else:
            def call(t=t):
                return torch.ops.llama.custom_sdpa(*t, start_pos, None, 0.0, shape.causal, None)
        fns.append(call)
    return _PyParty("executorch", fns, quiet=True)


def executorch_version() -> str | None:
    try:
        return metadata.version("executorch")
    except metadata.PackageNotFoundError:
        return None


def make_party(spec: str | native.Kernel, shape: Shape, sets: list[Inputs],
               threads: int) -> Party:
    """The party for a spec on a shape's input sets: "torch", "executorch", a registered
    kernel's name or a kernel file (see resolve_kernels), or a kernel already resolved."""
    if spec == "torch":
        return torch_party(shape, sets)
    if spec == "executorch":
        return executorch_party(shape, sets)
    if isinstance(spec, str):
        (spec,) = resolve_kernels([spec])
    return NativeParty(spec, shape, sets, threads)
