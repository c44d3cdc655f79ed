"""Heap allocations per call, of any party `probe bench` times: our kernels, a user's
kernel, torch's and ExecuTorch's SDPA.

ExecuTorch PR 15610 is about its quantized SDPA allocating a dequantisation buffer per key
block: a cost that shows in a timing only as much as the allocator is slow that day,
and that a count shows exactly. Our own kernels allocate through a counting allocator
(sdpa_probe_alloc_stats); everyone else calls malloc / new. So the counting happens in
a worker process with native/preload/alloc_count.c preloaded, which counts every heap
allocation of the process (every thread, every entry point of the C allocator).

Per call = the allocations of 2n calls minus twice those of n calls, over n, after a
warm-up: the first call's one-off setup (a thread pool, a lazy table) and whatever a
batch of calls costs the caller once are not per call; the median of three such
estimates (the one whose count is the median, with its bytes and frees). A party
whose worker dies is reported as such, and the worker is restarted for the rest.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence

from . import sandbox
from .build import PRELOAD_DIR, build_preload
from .children import TAIL_BYTES, child_env, signal_name
from .errors import BuildError

WARMUP = 2
CALLS = 4             # n: the counted batches are n and 2n calls
REPEATS = 3           # estimates per party, the median reported
MARK = "@@alloc "     # the worker's result lines (anything else on its stdout is not ours)
# per call: heap allocations, bytes asked for, frees, threads started (pthread_create)
COUNTED = ("allocs", "bytes", "frees", "threads")


def preload_library() -> tuple[str | None, str | None]:
    """(path of the counting library, None) or (None, why counts cannot be taken)."""
    if os.environ.get("LD_PRELOAD"):
        return None, (f"LD_PRELOAD is set ({os.environ['LD_PRELOAD']}): heap allocations "
                      "were not counted (the counter would have to come first)")
    if not sys.platform.startswith("linux"):
        return None, "heap allocations are counted on Linux (glibc) only"
    try:
        return str(build_preload(PRELOAD_DIR / "alloc_count.c")), None
    except BuildError as exc:
        return None, f"heap allocations not counted: {exc}"


def count(jobs: Sequence[dict], threads: int, calls: int = CALLS,
          timeout_per_job: float = 120.0) -> tuple[list[dict | None], str | None]:
    """Allocations per call for each job ({"shape": bench shape name, "party": "torch",
    "executorch" or a kernel spec: a registered name or a kernel file}): a list of
    {"allocs", "bytes", "frees", "threads"} per call (floats) or {"error": why}, in job order;
    all None with the reason when nothing can be counted here."""

    lib, why = preload_library()
    if lib is None:
        return [None] * len(jobs), why
    env = child_env(LD_PRELOAD=lib)
    results: list[dict | None] = [None] * len(jobs)
    start = 0
    while start < len(jobs):
        todo = list(range(start, len(jobs)))
        timeout = 60.0 + timeout_per_job * len(todo)
        limits = sandbox.limits(1, timeout)
        request = {"threads": threads, "calls": calls, "jobs": [jobs[i] for i in todo],
                   "limits": dataclasses.asdict(limits), "parent": os.getpid()}
        stdout, died, said = _run_worker(request, env, timeout)
        done = [json.loads(line[len(MARK):]) for line in stdout.splitlines()
                if line.startswith(MARK)]
        for i, r in zip(todo, done, strict=False):
            results[i] = r
        if len(done) == len(todo):
            break
        bad = todo[len(done)]
        if died is None:
            results[bad] = {"error": f"no answer within {timeout:g} s"}
        else:
            results[bad] = {"error": f"the counting worker died ({signal_name(died)}"
                            f"{sandbox.death_note(died, limits)})"
                            + (f": {said[-1][:200]}{sandbox.memory_note(said[-1], limits)}"
                               if said else "")}
        start = bad + 1
    return results, None


def _run_worker(request: dict, env: dict, timeout: float) -> tuple[str, int | None, list]:
    """The counting worker on one request: its result lines, its exit code (None: no
    answer in time) and the lines it (its kernels) printed, from a file it writes under
    the output cap."""
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.run([sys.executable, "-m", "sdpa_probe.alloc_count_worker"],
                                  input=json.dumps(request), stdout=subprocess.PIPE, stderr=err,
                                  text=True, timeout=timeout, env=env)
            stdout, died = proc.stdout, proc.returncode
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout or ""
            stdout = out.decode(errors="replace") if isinstance(out, bytes) else out
            died = None
        size = err.seek(0, os.SEEK_END)
        err.seek(max(0, size - TAIL_BYTES))
        said = [ln for ln in err.read().decode(errors="replace").splitlines() if ln.strip()]
    return stdout, died, said


def per_call(run: Callable[[int], object], calls: int, stats: Callable[[], tuple],
             repeats: int = REPEATS) -> dict:
    """Allocations per call of run(n) (n calls), the fixed cost of one run taken out: the
    median of `repeats` estimates, so that a one-off allocation during one of them (a
    lazily grown pool, the interpreter's own) does not show as a fraction per call."""
    run(WARMUP)
    estimates = []
    for _ in range(repeats):
        s0 = stats()
        run(calls)
        s1 = stats()
        run(2 * calls)
        s2 = stats()
        estimates.append([((c - b) - (b - a)) / calls
                          for a, b, c in zip(s0, s1, s2, strict=True)])
    mid = sorted(range(repeats), key=lambda i: estimates[i][0])[repeats // 2]
    return {k: round(v, 2) for k, v in zip(COUNTED, estimates[mid], strict=True)}
