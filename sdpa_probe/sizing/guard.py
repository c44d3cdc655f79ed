"""The runtime's guarded allocator, seen from Python: it fills each native block, puts
canaries on both sides and, on free, records how far the block was written. A write
past either end is an overrun; a block whose high-water mark stays far below its size
is waste."""

from __future__ import annotations

import contextlib
import dataclasses

from .. import native


@dataclasses.dataclass(frozen=True)
class AllocRecord:
    seq: int
    bytes: int
    high_water: int   # 1 + offset of the last byte written
    touched: int      # bytes written
    overrun: int      # tail canary bytes changed
    underrun: int     # head canary bytes changed

    @property
    def damaged(self) -> bool:
        return self.overrun > 0 or self.underrun > 0

    @property
    def waste(self) -> float:
        """Share of the block past its high-water mark."""
        return 1.0 - self.high_water / self.bytes if self.bytes else 0.0


def _records(ffi, lib) -> list[AllocRecord]:
    n = int(lib.sdpa_probe_alloc_guard_records(ffi.NULL, 0))
    if n == 0:
        return []
    buf = ffi.new("sdpa_probe_alloc_record[]", n)
    lib.sdpa_probe_alloc_guard_records(buf, n)
    return [AllocRecord(int(r.seq), int(r.bytes), int(r.high_water), int(r.touched),
                        int(r.overrun), int(r.underrun)) for r in buf]


@contextlib.contextmanager
def guarded():
    """Guard every native allocation in the block; yields a list filled with the records
    (in free order) when the block ends."""
    ffi, lib, _ = native.native_lib()
    found: list[AllocRecord] = []
    lib.sdpa_probe_alloc_guard(1)
    try:
        yield found
    finally:
        lib.sdpa_probe_alloc_guard(0)
        found.extend(_records(ffi, lib))


def guard_selftest() -> list[tuple[str, AllocRecord, bool]]:
    """The guard on blocks written in bounds, one byte past the end, one byte before the
    start, and not at all: (what, record, detected as expected)."""
    _, lib, _ = native.native_lib()
    plan = [("in bounds", 100, 0, 100), ("1 byte past the end", 100, 0, 101),
            ("1 byte before the start", 100, -1, 50), ("half written", 256, 0, 128),
            ("untouched", 64, 0, 0)]
    with guarded() as recs:
        for _, n, lo, hi in plan:
            if lib.sdpa_probe_alloc_guard_test(n, lo, hi) != 0:
                raise RuntimeError("sdpa_probe_alloc_guard_test refused a valid request")
    out = []
    for (what, n, lo, hi), r in zip(plan, recs, strict=True):
        ok = (r.bytes == n and r.overrun == max(0, hi - n) and r.underrun == max(0, -lo)
              and r.high_water == min(hi, n) and r.touched == min(hi, n) - max(lo, 0))
        out.append((what, r, ok))
    return out

