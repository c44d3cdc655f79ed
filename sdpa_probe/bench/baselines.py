"""What a kernel's time is held against in the same rounds: `probe info`'s DRAM read
and F32 FMA benchmarks (what the memory and the core did during these very rounds,
on a shared machine) and `flash` on the F32 twin of a F16 / BF16 / int8 shape."""

from __future__ import annotations

import dataclasses

from .. import native
from ..errors import ProbeError
from .inputs import make_inputs
from .parties import Party, make_party
from .shapes import Shape

F32_REFERENCE = "flash@f32"
DRAM_READ = "dram-read"


class ReadParty(Party):
    """`probe info`'s DRAM read benchmark (one pass over its buffer per call), timed
    in the same rounds as the kernels: on a shared machine the bandwidth a kernel
    is held against then had the same neighbours as the kernel."""

    def __init__(self, threads: int, nbytes: int):
        self.name = DRAM_READ
        self._ffi, self._lib, _ = native.native_lib()
        self._threads = threads
        self._buf = self._ffi.new("sdpa_probe_mb_buffer **")
        st = int(self._lib.sdpa_probe_mb_buffer_new(nbytes, threads, self._buf))
        if st != 0:
            raise ProbeError(f"could not allocate the {nbytes >> 20} MiB read buffer")
        self.nbytes = int(self._lib.sdpa_probe_mb_buffer_bytes(self._buf[0]))
        self._res = self._ffi.new("sdpa_probe_mb_result *")

    def run(self, n: int) -> list[float]:
        out = []
        for _ in range(n):
            st = int(self._lib.sdpa_probe_mb_read(self._buf[0], self._threads, 1, 1, self._res))
            if st != 0:
                raise ProbeError(f"the DRAM read benchmark failed (status {st})")
            out.append(float(self._res.best_seconds))
        return out

    def close(self) -> None:
        if self._buf[0] != self._ffi.NULL:
            self._lib.sdpa_probe_mb_buffer_free(self._buf[0])
            self._buf[0] = self._ffi.NULL

    def __del__(self):
        self.close()


FMA_PEAK = "fma-peak"
FMA_ITERS_PER_THREAD = 1 << 16  # x chains x lanes x 2 flops a thread: well under a ms here
SLOW_CORE = 0.85  # a same-run FMA rate under this share of probe info's gets a note


class FmaParty(Party):
    """`probe info`'s F32 FMA benchmark (independent chains on every thread), timed in
    the same rounds as the kernels: a core-bound kernel's time moves with the core's
    clock, which a shared host's neighbours change (345 GFLOP/s one hour, 455 the next on
    one host), and this says what the core did during these very rounds."""

    def __init__(self, threads: int):
        self.name = FMA_PEAK
        self._ffi, self._lib, _ = native.native_lib()
        self._threads = threads
        self._res = self._ffi.new("sdpa_probe_mb_result *")
        self.flops = 0

    def run(self, n: int) -> list[float]:
        out = []
        for _ in range(n):
            st = int(self._lib.sdpa_probe_mb_fma(self._threads, FMA_ITERS_PER_THREAD, 1,
                                                 self._res))
            if st != 0:
                raise ProbeError(f"the FMA benchmark failed (status {st})")
            self.flops = int(self._res.work)
            out.append(float(self._res.best_seconds))
        return out

def f32_reference(shape: Shape, threads: int, n_sets: int = 1) -> Party | None:
    """`flash` on the F32 twin of a F16 / BF16 / int8 shape, named F32_REFERENCE."""
    if shape.dtype == "f32":
        return None
    twin = dataclasses.replace(shape, dtype="f32")
    party = make_party("flash", twin, make_inputs(twin, n_sets), threads)
    party.name = F32_REFERENCE
    return party
