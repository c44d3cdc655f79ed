"""What bench times: a party has a name, run(n) -> the seconds of each of n calls,
and call(n): n calls untimed one by one (what alloc_count counts). A native kernel
behind the C ABI is timed in the library's C loop; a Python callable (torch's or a
runtime's op) call by call, as its users call it. Backends make their parties
(Backend.timer); bench.parties.make_party asks them."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable

from . import native
from .errors import ProbeError


class Party:
    """Something to time on a shape: run(n) makes n calls and returns their seconds;
    call(n) makes n calls without keeping them (what alloc_count counts)."""

    name: str

    def run(self, n: int) -> list[float]:
        raise NotImplementedError

    def call(self, n: int) -> None:
        self.run(n)


class CLoopParty(Party):
    """Calls made in a C loop that writes each call's seconds: a subclass gives `_ffi`
    and call(n, seconds_out)."""

    _ffi: object

    def run(self, n: int) -> list[float]:
        buf = self._ffi.new("double[]", n)
        self.call(n, buf)
        return list(self._ffi.unpack(buf, n))

    def call(self, n: int, seconds_out=None) -> None:
        raise NotImplementedError


class NativeParty(CLoopParty):
    """A kernel behind the C ABI, timed in the library's C loop: a registered kernel
    by its index, a user kernel through its sdpa_forward's address."""

    def __init__(self, kernel: native.Kernel, shape, sets, threads: int):
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
def quiet_stderr():
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


class PyParty(Party):
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
        with torch.no_grad(), (quiet_stderr() if self._quiet else contextlib.nullcontext()):
            for _ in range(n):
                f = fns[self._next]
                self._next = (self._next + 1) % k
                t0 = time.perf_counter()
                f()
                out.append(time.perf_counter() - t0)
        return out


