"""The allocation counter's worker process (python -m sdpa_probe.alloc_count_worker,
started by alloc_count.count with the counting library preloaded): each job's party
called n and 2n times, its process-wide allocation counts read around the calls."""

from __future__ import annotations

import json
import os
import sys

import torch

from . import native, sandbox
from .alloc_count import MARK, per_call
from .bench.inputs import make_inputs
from .bench.parties import make_party
from .bench.shapes import parse_shape


def _stats(ffi, lib) -> tuple[int, int, int, int]:
    a, b, f, t = (ffi.new("int64_t *") for _ in range(4))
    if lib.sdpa_probe_process_alloc_stats(a, b, f, t) != 0:
        raise RuntimeError("the allocation counter is not preloaded in this process")
    return a[0], b[0], f[0], t[0]


def main() -> None:
    request = json.loads(sys.stdin.read())
    sandbox.confine(sandbox.Limits(**request["limits"]), request["parent"])
    # the results on a stdout of their own; what a kernel prints goes to stderr, a file
    # under the output cap
    results = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)
    threads, calls = int(request["threads"]), int(request["calls"])
    torch.set_num_threads(threads)
    ffi, lib, _ = native.native_lib()
    shape_name = None
    for job in request["jobs"]:
        if job["shape"] != shape_name:  # (jobs come shape by shape: inputs made once each)
            shape_name = job["shape"]
            shape = parse_shape(shape_name)
            sets = make_inputs(shape, 1)
        try:
            party = make_party(job["party"], shape, sets, threads)
            # (call: a native kernel without the timing buffer, whose bytes grow with n)
            result = per_call(party.call, calls, lambda: _stats(ffi, lib))
        except Exception as exc:  # a status, an unsupported shape: said, not a crash
            result = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        results.write(MARK + json.dumps(result) + "\n")
        results.flush()


if __name__ == "__main__":
    main()
