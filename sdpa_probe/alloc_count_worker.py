"""The allocation counter's worker process (python -m sdpa_probe.alloc_count_worker,
started by alloc_count.count with the counting library preloaded): each job's party
called n and 2n times, its process-wide allocation counts read around the calls."""

from __future__ import annotations

import json
import sys

import torch

from . import bench, native
from .alloc_count import MARK, per_call


def _stats(ffi, lib) -> tuple[int, int, int, int]:
    a, b, f, t = (ffi.new("int64_t *") for _ in range(4))
    if lib.sdpa_probe_process_alloc_stats(a, b, f, t) != 0:
        raise RuntimeError("the allocation counter is not preloaded in this process")
    return a[0], b[0], f[0], t[0]


def _party(job: dict, shape, sets, threads: int):
    p = job["party"]
    if p == "torch":
        return bench.torch_party(shape, sets)
    if p == "executorch":
        return bench.executorch_party(shape, sets)
    (kernel,) = bench.resolve_kernels([p])
    return bench.NativeParty(kernel, shape, sets, threads)


def main() -> None:
    request = json.loads(sys.stdin.read())
    threads, calls = int(request["threads"]), int(request["calls"])
    torch.set_num_threads(threads)
    ffi, lib, _ = native.native_lib()
    shape_name = None
    for job in request["jobs"]:
        if job["shape"] != shape_name:  # (jobs come shape by shape: inputs made once each)
            shape_name = job["shape"]
            shape = bench.parse_shape(shape_name)
            sets = bench.make_inputs(shape, 1)
        try:
            party = _party(job, shape, sets, threads)
            # a native kernel without the timing buffer, whose bytes grow with the batch
            run = getattr(party, "call", party.run)
            result = per_call(run, calls, lambda: _stats(ffi, lib))
        except Exception as exc:  # a status, an unsupported shape: said, not a crash
            result = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        sys.stdout.write(MARK + json.dumps(result) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
