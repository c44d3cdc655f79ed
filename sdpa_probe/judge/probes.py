"""What the process gains per call (heap, address space, descriptors) and how many
of its threads are at work: the measurements the repeat layer judges."""

from __future__ import annotations

import os
import threading
import time

from ..native import heap_in_use, program_break

# A passing call is made again to look for a leak: LEAK_WARMUP calls first (a thread pool,
# a cache grown once), then LEAK_CALLS with the heap read after each. Calls slower than
# LEAK_PROBE_MAX_SECONDS are not repeated.
LEAK_WARMUP, LEAK_CALLS, LEAK_PROBE_MAX_SECONDS = 2, 4, 0.5
# A growth on each of LEAK_CALLS is confirmed over LEAK_CONFIRM_CALLS more: a runtime
# whose allocator settles in small steps (OpenVINO's state, a few KiB over its first
# thousands of calls) can grow four calls in a row, and a leak grows on every call
LEAK_CONFIRM_CALLS = 12


def heap_count_exact() -> bool:
    """Whether a leaked block shows in the heap count on the call that leaks it: glibc's
    per-thread cache keeps up to 7 freed blocks of a size and counts them as in use, so
    with it on a small leak can be served from it for calls on end, and posix_memalign's
    split-off pieces filling it look like growth; check's workers run without it
    (WorkerPool), and only there is the probe run (in pytest it read 29 bytes a call
    for a kernel that keeps nothing)."""
    return "tcache_count=0" in os.environ.get("GLIBC_TUNABLES", "")


PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096  # (the break's rounding)


def process_resources() -> tuple[int, int] | None:
    """(address space in bytes, open file descriptors) of this process, from /proc;
    None where it cannot be read. The address space leaves out the main heap below the
    program break: the allocator grows it while it warms up (a fresh process's first
    calls moved it on 4 calls running, 400-500 KB each), and what is in use there is
    the heap count's to judge."""

    try:
        with open("/proc/self/status") as fh:
            vm = next(int(ln.split()[1]) * 1024 for ln in fh if ln.startswith("VmSize:"))
        brk = program_break()
        vm -= (brk + PAGE - 1) // PAGE * PAGE  # ([heap] ends at the break's page)
        return vm, len(os.listdir("/proc/self/fd"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def growth_per_call(backend, data, out) -> dict:
    """What the process gains per call when it gains on every one of LEAK_CALLS
    identical calls after the warm-up (a leak: a decode loop makes this call per layer
    per token), else 0, for `heap` (bytes in use: None where the count would not be
    exact, glibc's per-thread cache on outside check's workers, or the C library does
    not count), `address_space` (bytes mapped: a thread never joined keeps its stack,
    a mapping never unmapped; None without /proc) and `fds` (open descriptors).
    (torch and ExecuTorch convert their inputs again each call; those tensors are freed
    before the heap is read, and over the default suite their heap holds steady.)"""

    heap_ok = heap_in_use() is not None and heap_count_exact()
    if hasattr(backend, "prepare"):  # an ABI kernel: the same argument block every call
        call = backend.prepare(data, out)
        again = lambda: backend.run(data, out, call)  # noqa: E731
    else:  # torch, ExecuTorch: their inputs converted again each call, and freed
        again = lambda: backend.run(data, out)  # noqa: E731
    for _ in range(LEAK_WARMUP):
        again()

    def read() -> tuple:
        res = process_resources()
        return (heap_in_use() if heap_ok else None, *(res or (None, None)))

    def window(calls: int) -> dict:
        seen = [read()]
        for _ in range(calls):
            again()
            seen.append(read())
        growth = {}
        for i, name in enumerate(("heap", "address_space", "fds")):
            series = [s[i] for s in seen]
            if series[0] is None:
                growth[name] = None
            elif all(b > a for a, b in zip(series[:-1], series[1:], strict=True)):
                growth[name] = (series[-1] - series[0]) // calls
            else:
                growth[name] = 0
        return growth

    growth = window(LEAK_CALLS)
    if any(growth.values()):
        confirmed = window(LEAK_CONFIRM_CALLS)
        growth = {k: (confirmed[k] if v else v) for k, v in growth.items()}
    return growth


# A kernel that has more threads at work than the n_threads it was given: a sampler
# thread reads every thread's scheduler state during repeated calls (at least
# THREADS_SAMPLES samples, at most THREADS_MAX_SECONDS); more than n_threads of them
# running or waiting for a CPU (the caller included) in THREADS_BUSY of the samples or
# more is more than it was given.
THREADS_SAMPLES, THREADS_MAX_SECONDS, THREADS_MAX_CALLS, THREADS_BUSY = 16, 0.05, 4096, 0.5


# ... once no other thread has been at work for THREADS_QUIET seconds running: torch's
# OpenMP workers spin for a while after its ops (the oracle's), and were seen in 10 % of
# flash's default cases otherwise; waited for at most THREADS_SETTLE seconds.
THREADS_QUIET, THREADS_SETTLE = 0.001, 0.2


def _runnable_threads(skip: int) -> int | None:
    """Threads of this process other than `skip` running or waiting for a CPU (state R in
    /proc/self/task/*/stat); None without /proc."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    n = 0
    for tid in tids:
        if int(tid) == skip:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:  # (ended since the listing)
            continue
        state = stat.rindex(b")") + 2  # (after the name, which may hold anything)
        n += stat[state:state + 1] == b"R"
    return n


def thread_use(backend, data, out, limit: int = 1) -> dict | None:
    """While an ABI kernel's call is repeated, the share of samples in which more than
    `limit` of the process's threads, the caller included, were running or runnable
    (`busy`), with `samples` and `calls`; None where it cannot be judged (no /proc, one
    CPU allowed, too few samples). Scheduler states, not CPU time: another process on the
    same CPUs (probe check's other worker) takes CPU time from a kernel's extra thread,
    not its runnable state, and a thread waiting for a CPU counts (so 3 threads at work
    show on 2 CPUs). A kernel that hands its work to one worker and sleeps keeps one
    thread at work, as it may; one whose caller computes, or spins waiting, while a worker
    computes keeps two."""

    try:
        if len(os.sched_getaffinity(0)) < 2 or _runnable_threads(-1) is None:
            return None
    except (AttributeError, OSError):
        return None
    call = backend.prepare(data, out)
    caller, seen, stop = threading.get_native_id(), [], threading.Event()
    t0 = quiet = time.perf_counter()
    while time.perf_counter() - quiet < THREADS_QUIET:
        if _runnable_threads(caller):
            quiet = time.perf_counter()
            if quiet - t0 > THREADS_SETTLE:
                return None  # (something else is at work in this process)
        time.sleep(0.0002)

    def sample() -> None:
        me = threading.get_native_id()
        while not stop.is_set():
            n = _runnable_threads(me)
            seen.append(n is not None and n > limit)  # (the caller is one of them)
            time.sleep(0.0002)

    sampler = threading.Thread(target=sample, daemon=True)
    n, t0 = 0, time.perf_counter()
    sampler.start()
    try:
        while (n < THREADS_MAX_CALLS and len(seen) < THREADS_SAMPLES
               and time.perf_counter() - t0 < THREADS_MAX_SECONDS):
            backend.run(data, out, call)
            n += 1
    finally:
        stop.set()
        sampler.join()
    if len(seen) < THREADS_SAMPLES // 2:
        return None
    return {"busy": sum(seen) / len(seen), "samples": len(seen), "calls": n}
