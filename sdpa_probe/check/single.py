"""`probe run`: one backend on one case, checked in a worker process (a crash is a
result) and, if it passed, timed in this one."""

from __future__ import annotations

import statistics
import time

from ..backends import BackendSpec, make
from ..cases import Case
from ..inputs import out_buffer
from ..oracle import prepare_case
from ..records import Record
from .pool import WorkerPool


def check_and_time(spec: BackendSpec, case: Case, repeat: int) -> dict:
    """The case's record, its parameters, FLOPs and bytes, and for a pass on the host the
    median of `repeat` timed calls after a warm-up (median_us, gb_s, gflop_s)."""
    records: list[Record] = []
    WorkerPool(jobs=1, timeout=120).run([(case, [spec.name])], records.append)
    rec = records[0]
    times: list[float] = []
    if rec.status == "pass" and not spec.target:  # (another CPU's, emulated: not timed)
        backend = make(spec)
        prep = prepare_case(case)
        buf = out_buffer(case)
        call = backend.prepare(prep.data, buf)
        backend.run(prep.data, buf, call)
        for _ in range(repeat):
            t0 = time.perf_counter()
            backend.run(prep.data, buf, call)
            times.append(time.perf_counter() - t0)
    result = rec.as_dict() | {"params": case.params(), "flops": case.flops,
                             "bytes": case.bytes}
    if times:
        med = statistics.median(times)
        result.update(median_us=med * 1e6, gb_s=case.bytes / med / 1e9,
                      gflop_s=case.flops / med / 1e9)
    return result
