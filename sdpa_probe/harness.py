"""Running cases against backends in worker processes, so that a kernel that
crashes, aborts or hangs costs one case, not the run.

A job is one case with the list of backends to run on it: the worker builds
the inputs and the float64 reference once, then runs each backend and sends a
record per backend. If the worker dies, the backend in flight is reported as
`crash` (with the signal) and the rest of the job is re-queued on a fresh
worker; if a backend exceeds its time limit, it is `timeout`."""

from __future__ import annotations

import collections
import dataclasses
import multiprocessing as mp
import os
import signal
import tempfile
import time
import traceback
from multiprocessing.connection import wait

import numpy as np

from .cases import Case
from .errors import CaseUnavailable

STATUSES = ("pass", "fail", "crash", "timeout", "unsupported", "error")


def repro_command(backend: str, case_id: str, after: str | None = None) -> str:
    then = f" --after {after}" if after else ""
    if backend.startswith("user:"):
        return f"probe check --kernel {backend[5:]} --repro {case_id}{then}"
    return f"probe check --repro {case_id} --backend {backend}{then}"


def base_record(backend: str, case: Case) -> dict:
    return {"backend": backend, "case": case.id, "family": case.family, "status": "error",
            "reason": "", "max_abs_err": None, "max_rel_err": None, "nmse": None,
            "worst": None, "atol": None, "rtol": None, "torch_err": None, "seconds": None,
            "leak_bytes_per_call": None, "repeatable": None, "fresh_retry": None,
            "after_case": None,
            "repro": repro_command(backend, case.id)}


# ---- in-process execution (also used by --repro and pytest) -------------------------

@dataclasses.dataclass
class Prepared:
    data: object
    ref: object
    torch_err: float | None


def prepare_case(case: Case, golden=None) -> Prepared:
    """Inputs from the case's seed, plus the float64 reference and torch's own error:
    computed live, or with `golden` (a golden directory) read from the stored golden
    data, with no oracle or torch SDPA call (GoldenError if the case is not stored)."""
    from .inputs import materialise

    data = materialise(case)
    if not case.needs_reference:  # (an invalid call: judged on its status)
        return Prepared(data, None, None)
    if golden is not None:
        from .golden import store

        ref, terr = store(golden).reference(case, data)
        return Prepared(data, ref, terr)
    from .backends import torch_error
    from .reference import sdpa_reference

    ref = sdpa_reference(data.q, data.k, data.v, mask=data.mask_t, is_causal=case.causal,
                         start_pos=case.start_pos, scale=case.scale).numpy()
    return Prepared(data, ref, torch_error(data, ref))


def run_one(backend, case: Case, prep: Prepared, keep_output: bool = False) -> dict:
    """Run one backend on one prepared case; returns its record."""
    if case.invalid:
        return _run_invalid(backend, case, prep)
    if case.callers > 1:
        return _run_concurrent(backend, case, prep, keep_output)
    if case.reuse:
        return _run_reused(backend, case, prep, keep_output)
    if case.stack_kib:
        return _on_small_stack(case.stack_kib, lambda: _attempt(backend, case, prep, keep_output))
    return _attempt(backend, case, prep, keep_output)


def _run_invalid(backend, case: Case, prep: Prepared) -> dict:
    """The case's valid call with one argument broken (invalid_args): a native kernel
    must return SDPA_INVALID (SDPA_UNSUPPORTED is accepted) and write nothing, output
    guards included. torch and ExecuTorch make the call through their own API where it
    can express it (backend.INVALID) and must raise; elsewhere they are unsupported."""
    from . import invalid_args
    from .inputs import InputGuard, out_buffer

    rec = base_record(backend.name, case)
    if not hasattr(backend, "prepare"):  # torch, ExecuTorch: through their own API, if it can
        what = f"an invalid call ({invalid_args.describe(case.invalid)})"
        if case.invalid not in getattr(backend, "INVALID", ()):
            rec.update(status="unsupported", reason=f"its API cannot make {what}")
            return rec
        t0 = time.perf_counter()
        try:
            backend.run_invalid(prep.data, case.invalid)
        except Exception as exc:
            said = (str(exc).strip().splitlines() or [""])[0][:200]
            rec.update(status="pass", reason=f"raised {type(exc).__name__} for {what}: {said}")
        else:
            rec.update(status="fail", reason=f"answered {what} with an output, raising nothing")
        rec["seconds"] = time.perf_counter() - t0
        return rec
    out = out_buffer(case)
    before = out.arena.copy()
    guard = InputGuard(prep.data)
    call = backend.prepare(prep.data, out)
    invalid_args.corrupt(case.invalid, call.args, backend.kernel.ffi)
    t0 = time.perf_counter()
    status = int(backend.kernel.forward_args(call.args))
    rec["seconds"] = time.perf_counter() - t0
    changed = int((out.arena.view(np.uint8) != before.view(np.uint8)).sum())
    rec["status"], rec["reason"] = invalid_args.judge(case.invalid, status, changed,
                                                      guard.written())
    return rec


def _on_small_stack(kib: int, fn):
    """fn() on a new thread whose stack is `kib` KiB: what a runtime's worker thread
    may give a kernel (macOS: 512 KiB, threads of embedded runtimes less). A kernel
    that puts a kv_len-long array on its stack overflows it (a crash, in a worker)."""
    import threading

    out: list = []
    old = threading.stack_size(kib * 1024)
    try:
        t = threading.Thread(target=lambda: out.append(fn()))
        t.start()
    finally:
        threading.stack_size(old)
    t.join()
    return out[0]


# Rounds of simultaneous calls a concurrent case makes (each caller its own inputs)
CONCURRENT_ROUNDS = 8
# A case's other inputs (a second caller's, a reuse case's rewritten buffers) come from
# its seed plus multiples of this
OTHER_INPUTS_SEED_STEP = 7919


def _run_concurrent(backend, case: Case, prep: Prepared, keep_output: bool) -> dict:
    """case.callers threads call the backend at once, CONCURRENT_ROUNDS times, each
    with its own inputs (caller k: seed + OTHER_INPUTS_SEED_STEP k, its reference
    computed live, as the golden data holds only the case's own) and its own output; the
    first caller's last record if every call passes, else the first failure, saying
    which call it was."""
    import threading

    from . import caller_state

    preps = [prep] + [prepare_case(dataclasses.replace(
        case, seed=case.seed + OTHER_INPUTS_SEED_STEP * k)) for k in range(1, case.callers)]
    barrier = threading.Barrier(case.callers)
    found: list = [None] * case.callers

    def start_together() -> None:
        try:
            barrier.wait(timeout=30)
        except threading.BrokenBarrierError:  # a caller stopped: go on unsynchronised
            pass

    def caller(k: int) -> None:
        try:
            for r in range(CONCURRENT_ROUNDS):
                rec = _attempt(backend, case, preps[k], keep_output and k == 0,
                               before_call=start_together)
                found[k] = (r, rec)
                if rec["status"] != "pass":
                    return
        except Exception as exc:  # (the harness's own failure, as one record)
            rec = base_record(backend.name, case)
            rec["reason"] = f"harness error in caller {k + 1}: {type(exc).__name__}: {exc}"
            found[k] = (0, rec)
        finally:
            barrier.abort()

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(case.callers)]
    state = caller_state.read()  # (read per call, one caller would restore another's change)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    changed = caller_state.left_changed(state)
    for k, (r, rec) in enumerate(found):
        if rec["status"] != "pass":
            if rec["status"] in ("fail", "error"):
                rec["reason"] = (f"with {case.callers} concurrent calls (caller {k + 1}, round "
                                 f"{r + 1} of {CONCURRENT_ROUNDS}): {rec['reason']}")
            return rec
    if changed:
        found[0][1].update(status="fail", reason=(
            f"left its caller changed after {case.callers} concurrent calls: "
            + "; ".join(changed)))
    return found[0][1]


def _run_reused(backend, case: Case, prep: Prepared, keep_output: bool) -> dict:
    """Two calls on the same buffers: the case's inputs, then new values (seed +
    OTHER_INPUTS_SEED_STEP) written into those very buffers (same pointers, strides and
    shapes, as a runtime's static KV cache and mask are rewritten between decode steps),
    each judged against its own reference. A kernel that keeps what it derived from a buffer
    by its address (dequantised or packed K, a mask's visible ranges) answers the second
    call with the first's. The buffers get their first values back afterwards (the next
    backend in this worker reads them)."""
    import numpy as np

    from .inputs import input_buffers

    first = _attempt(backend, case, prep, keep_output)
    if first["status"] != "pass":
        return first
    new = prepare_case(dataclasses.replace(case, seed=case.seed + OTHER_INPUTS_SEED_STEP))
    bufs, new_bufs = input_buffers(prep.data), input_buffers(new.data)
    saved = {name: a.copy() for name, a in bufs.items()}
    d = prep.data
    data = dataclasses.replace(new.data, q_store=d.q_store, k_store=d.k_store,
                               v_store=d.v_store, mask=d.mask)
    try:
        for name, a in bufs.items():
            np.copyto(a, new_bufs[name])
        rec = _attempt(backend, case, Prepared(data, new.ref, new.torch_err), keep_output)
    finally:
        for name, a in bufs.items():
            np.copyto(a, saved[name])
    if rec["status"] in ("fail", "error"):
        rec["reason"] = ("on a second call with its buffers rewritten in place (same pointers, "
                         "new values): " + rec["reason"])
    if keep_output:
        rec["_ref"] = new.ref  # (the output kept is the second call's)
    return rec


def _judge_watched(case: Case, prep: Prepared, out, **kw):
    """verdict.judge, where output left unwritten is watched LATE_WRITE_WAIT more: it may
    be a thread of the kernel that writes later than the verdict looked, which given the
    time shows itself (verdict layer 0)."""
    from .verdict import judge

    v = judge(case, prep.ref, out, prep.torch_err, **kw)
    if v.status == "fail" and out.at_return is not None and "never written" in v.reason:
        time.sleep(LATE_WRITE_WAIT)
        if out.written_after_return()[0]:
            v = judge(case, prep.ref, out, prep.torch_err, **kw)
    return v


def _attempt(backend, case: Case, prep: Prepared, keep_output: bool = False,
             before_call=None) -> dict:
    """One call and its verdict; before_call runs just before the kernel is called."""
    from . import caller_state
    from .backends import Unsupported, describe_failure
    from .errors import KernelError
    from .inputs import InputGuard, out_buffer
    from .native import describe_fp_change, fp_control, set_fp_control

    rec = base_record(backend.name, case)
    out = out_buffer(case)
    guard = InputGuard(prep.data)
    if before_call is not None:
        before_call()
    # (concurrent callers: the process's state is read around all of them, _run_concurrent)
    state_before = caller_state.read() if before_call is None else None
    fp_before = fp_control()
    fp_changed, state_changed = None, []
    t0 = time.perf_counter()
    try:
        try:
            backend.run(prep.data, out)
        finally:  # put the environment back, so that the next case and the oracle run in it
            fp_after = fp_control()
            if fp_after != fp_before:
                fp_changed = describe_fp_change(fp_before, fp_after)
                set_fp_control(fp_before)
            if state_before is not None:
                state_changed = caller_state.left_changed(state_before)
    except Unsupported as exc:
        rec.update(status="unsupported", reason=str(exc), seconds=time.perf_counter() - t0)
        return rec
    except KernelError as exc:
        rec.update(status="fail", reason=describe_failure(exc), seconds=time.perf_counter() - t0)
        return rec
    except Exception as exc:  # a backend's own error (e.g. a RuntimeError from a torch op)
        rec.update(status="error", reason=describe_failure(exc),
                   seconds=time.perf_counter() - t0)
        return rec
    rec["seconds"] = time.perf_counter() - t0
    v = _judge_watched(case, prep, out, inputs_written=guard.written(),
                       fp_changed=fp_changed, caller_changed=state_changed)
    rec.update(v.as_dict())
    if (LEAK_CHECK and v.status == "pass" and before_call is None
            and rec["seconds"] < LEAK_PROBE_MAX_SECONDS):
        _repeat_verdict(rec, backend, case, prep, out)
    if keep_output:
        rec["_out"] = out
    return rec


# A passing call is made again to look for a leak: LEAK_WARMUP calls first (a thread pool,
# a cache grown once), then LEAK_CALLS with the heap read after each. Calls slower than
# LEAK_PROBE_MAX_SECONDS are not repeated.
LEAK_WARMUP, LEAK_CALLS, LEAK_PROBE_MAX_SECONDS = 2, 4, 0.5
LEAK_CHECK = True  # probe check --no-leak-check turns it off
LATE_WRITE_WAIT = 0.02  # seconds unwritten native output is watched for a late write


def _heap_count_exact() -> bool:
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
    from .native import program_break

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
    from .native import heap_in_use

    heap_ok = heap_in_use() is not None and _heap_count_exact()
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

    seen = [read()]
    for _ in range(LEAK_CALLS):
        again()
        seen.append(read())
    growth = {}
    for i, name in enumerate(("heap", "address_space", "fds")):
        series = [s[i] for s in seen]
        if series[0] is None:
            growth[name] = None
        elif all(b > a for a, b in zip(series[:-1], series[1:], strict=True)):
            growth[name] = (series[-1] - series[0]) // LEAK_CALLS
        else:
            growth[name] = 0
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
    import threading

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


def _repeat_verdict(rec: dict, backend, case: Case, prep: Prepared, out) -> None:
    """The verdict's last layer, the call made again: a kernel whose heap grows on every
    repeat (a leak) fails, and so does one whose answer changes when the same call is
    made once more into the same output, poisoned again (state a call leaves behind:
    a staging buffer zeroed only when allocated, a result kept by address). A repeat
    that passes but differs bit for bit sets rec["repeatable"] False (a note, not a
    failure: a reduction order that follows thread timing). Last, a kernel given one
    thread is called again while its threads are watched (thread_use)."""
    from . import caller_state
    from .backends import describe_failure
    from .native import fp_control, set_fp_control

    first = out.values()  # (float64: F16 / BF16 exactly)
    fp, state = fp_control(), caller_state.read()

    def put_back() -> list[str]:  # (the first call's environment check stands)
        set_fp_control(fp)
        return caller_state.left_changed(state)

    changed: list[str] = []
    try:
        grew = growth_per_call(backend, prep.data, out)
        out.repoison()
        backend.run(prep.data, out)
    except Exception as exc:  # a repeat of a call that passed: the kernel is not repeatable
        rec.update(status="fail", reason="a repeated, identical call failed: "
                   + describe_failure(exc))
        return
    finally:  # (the cases after run in the caller as it was)
        changed = put_back()
    if changed:
        rec.update(status="fail", reason=(
            f"left its caller changed on a repeat of the same call ({LEAK_WARMUP + LEAK_CALLS + 1}"
            " made; the first did not): " + "; ".join(changed)))
        return
    rec["leak_bytes_per_call"] = grew["heap"]
    each = f"on each of {LEAK_CALLS} repeats of the same call"
    after = f"(after {LEAK_WARMUP} warm-up calls)"
    if grew["fds"]:
        rec.update(status="fail", reason=(
            f"leaks file descriptors: the open ones grew {each}, {grew['fds']} a call {after}"
            f"; a process that decodes runs out of them"))
        return
    if grew["address_space"]:
        rec.update(status="fail", reason=(
            f"leaks address space: the process's mappings grew {each}, "
            f"{grew['address_space']:,} bytes a call {after} (a thread created and never "
            "joined keeps its stack mapped; a mapping never unmapped)"
            + (f"; the heap in use grew {grew['heap']:,} bytes a call" if grew["heap"] else "")))
        return
    if grew["heap"]:
        rec.update(status="fail", reason=(
            f"leaks memory: the heap in use grew {each}, {grew['heap']:,} bytes a call "
            f"{after}"))
        return
    again = _judge_watched(case, prep, out)
    if again.status != "pass":
        rec.update(status="fail", reason="the same call made again, into the same output "
                   "poisoned again, gives another answer: " + again.reason)
        return
    rec["repeatable"] = bool(np.array_equal(first, out.values(), equal_nan=True))
    if case.n_threads < 1 or not hasattr(backend, "prepare"):
        return
    try:  # (more calls, after the answers above were judged)
        use = thread_use(backend, prep.data, out, case.n_threads)
    except Exception:  # (its repeats passed: a call that fails here is not this layer's)
        use = None
    finally:
        put_back()
    if use and use["busy"] >= THREADS_BUSY:
        n = case.n_threads
        given = "the one thread" if n == 1 else f"the {n} threads"
        rec.update(status="fail", reason=(
            f"kept more than {given} it was given at work (n_threads = {n}): in "
            f"{use['busy']:.0%} of {use['samples']} samples over {use['calls']} identical "
            f"calls more than {n} of its threads, the caller included, were running or "
            f"waiting for a CPU; a runtime that gives SDPA {n} thread{'s' if n > 1 else ''} "
            "runs its own work on the others (threads started regardless of n_threads, or "
            "spinning)"), _no_retry=True)  # (not the inputs')


def retry_on_fresh_inputs(rec: dict, backend, case: Case, prep: Prepared,
                          earlier: Case | None) -> None:
    """A failed case run once more on fresh copies of its inputs (the same values in new
    buffers, at other addresses: the first ones are still held). If that passes, the
    failure came from something other than the inputs: what an earlier call left behind
    (a cache keyed by a buffer's address that a freed buffer's recycled address hits,
    scratch kept between calls) or a race. The record stays a failure, says so, and its
    repro replays the case this backend ran before it in the same process."""
    from .inputs import materialise

    fresh = Prepared(materialise(case), prep.ref, prep.torch_err)
    again = run_one(backend, case, fresh)
    rec["fresh_retry"] = again["status"]
    if again["status"] != "pass":
        return
    if case.callers > 1:  # (its callers race each other: the likelier cause)
        rec["reason"] = (f"wrong in one run of {case.callers} concurrent calls, right in "
                         "another on fresh copies of the same inputs: a race between the "
                         "callers (or state an earlier call left): " + rec["reason"])
        return
    if earlier is None:
        rec["reason"] = ("wrong on the first call, right on fresh copies of the same inputs "
                         "(a race, or state the first call depended on): " + rec["reason"])
        return
    rec["after_case"] = earlier.id
    rec["repro"] = repro_command(backend.name, case.id, after=earlier.id)
    rec["reason"] = (f"wrong after {earlier.id} ran in the same process, right on fresh "
                     "copies of the same inputs: the answer depends on an earlier call (state "
                     "kept between calls, e.g. keyed by a buffer's address, which a freed "
                     "buffer's recycled address hits) or on a race: " + rec["reason"])


# ---- the worker process -------------------------------------------------------------

def _worker_main(conn, setup: dict) -> None:
    import os

    # what the kernel prints (an abort's message, a library's logging) goes to a
    # log the parent reads when this process dies
    if setup.get("log"):
        fd = os.open(setup["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    import torch

    torch.set_num_threads(1)
    from .backends import make_backend
    from .native import configure

    configure(**setup.get("build", {}))
    global LEAK_CHECK
    LEAK_CHECK = setup.get("leak_check", True)
    backends: dict = {}
    earlier: dict[str, Case] = {}  # the case each backend ran last in this process
    conn.send(("ready",))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        params, names = msg
        case = Case(**params)
        try:
            prep = prepare_case(case, golden=setup.get("golden"))
        except Exception as exc:
            if isinstance(exc, CaseUnavailable):
                status, reason = "unsupported", f"not on this machine: {exc}"
            else:
                err = traceback.format_exc(limit=3).strip().splitlines()[-1]
                status, reason = "error", f"harness could not build the case: {err}"
            for name in names:
                rec = base_record(name, case)
                rec.update(status=status, reason=reason)
                conn.send(("rec", rec))
            conn.send(("done",))
            continue
        for name in names:
            try:
                if name not in backends:
                    backends[name] = make_backend(name)
                rec = run_one(backends[name], case, prep)
                about_inputs = not rec.pop("_no_retry", False)  # (a sampled verdict)
                if rec["status"] == "fail" and not case.invalid and about_inputs:
                    retry_on_fresh_inputs(rec, backends[name], case, prep, earlier.get(name))
            except Exception as exc:
                rec = base_record(name, case)
                rec["reason"] = f"{type(exc).__name__}: {exc}"[:300]
            earlier[name] = case
            conn.send(("rec", rec))
        conn.send(("done",))


def _last_words(log: str) -> str:
    """The most telling line a dead worker printed: an assert or error if any."""
    try:
        with open(log, errors="replace") as fh:
            lines = [ln.strip() for ln in fh.readlines()[-50:] if ln.strip()]
    except OSError:
        return ""
    for ln in reversed(lines):
        low = ln.lower()
        if any(w in low for w in ("assert", "error", "abort", "fault", "terminate")):
            return ln[:240]
    return lines[-1][:240] if lines else ""


def signal_name(code: int | None) -> str:
    """How a child process ended, from its exit code: 'SIGSEGV', 'exit code 3'; a
    SIGILL with what usually raises it."""
    if code is None:
        return "unknown"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
        return name + SIGNAL_NOTES.get(name, "")
    return f"exit code {code}"


def died_in_call(code: int | None) -> str:
    """How a process died inside a kernel's call: a signal's name, or for an exit code
    (which only exit() or _exit() gives there) that the kernel called one."""
    if code is not None and code >= 0:
        return f"exited (code {code}) inside the call: exit() in the kernel?"
    return signal_name(code)


# What a signal's name does not say. Linux answers an AMX tile instruction with SIGILL
# until the process has asked for the tile data state (measured here: tilezero after
# ldtilecfg, without the arch_prctl, dies so).
SIGNAL_NOTES = {
    "SIGILL": (" (an instruction this CPU or OS does not allow: code built for another "
               "-march, a trap such as __builtin_trap(), or AMX tiles used before "
               "arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA))"),
}


@dataclasses.dataclass
class _Slot:
    proc: mp.Process
    conn: object
    log: str
    ready: bool = False
    case: Case | None = None
    pending: list = dataclasses.field(default_factory=list)
    deadline: float = 0.0


MALLOC_PERTURB = 0x80  # glibc fills a malloc'd block with this ^ 0xFF, freed ones with it


def malloc_debug_library() -> str | None:
    """glibc's malloc debugging library (2.34 on), beside the libc this process runs on:
    with glibc.malloc.check=3 it puts a guard byte right after each block's requested
    size and aborts when a block whose guard was overwritten is freed. None where there
    is none, or LD_PRELOAD is already set (the user's own preload, e.g. a sanitizer,
    stays alone)."""
    if os.environ.get("LD_PRELOAD") or os.environ.get("SDPA_PROBE_NO_MALLOC_CHECK"):
        return None
    try:
        with open("/proc/self/maps") as fh:
            libc = next((ln.split()[-1] for ln in fh if ln.rstrip().endswith("/libc.so.6")),
                        None)
    except OSError:
        return None
    if libc is None:
        return None
    path = os.path.join(os.path.dirname(libc), "libc_malloc_debug.so.0")
    return path if os.path.exists(path) else None


# what glibc prints when it aborts on a corrupted heap (malloc/malloc.c, malloc-check.c)
HEAP_ABORTS = ("free(): invalid", "double free or corruption", "invalid next size",
               "corrupted size vs. prev_size", "corrupted double-linked list",
               "munmap_chunk(): invalid pointer", "realloc(): invalid", "malloc(): ",
               "free(): corrupted", "malloc_consolidate(): ")


def explain_heap_abort(said: str) -> str:
    """A note on glibc's heap-corruption aborts, whose own words do not say what the
    kernel did; empty for anything else."""
    if not any(m in said for m in HEAP_ABORTS):
        return ""
    return (" (glibc found its heap corrupted: a block written past its end (check's "
            "workers guard the byte after each block's requested size), freed twice, or "
            "a pointer freed that malloc did not return)")


class WorkerPool:
    """Runs jobs on N worker processes with crash and timeout isolation."""

    def __init__(self, jobs: int = 1, timeout: float = 30.0, setup: dict | None = None,
                 startup_timeout: float = 180.0, fresh_per_job: bool = False):
        self.n = max(1, jobs)
        self.fresh_per_job = fresh_per_job  # a new process for every job (check --isolate)
        self.malloc_debug = malloc_debug_library()  # (looked up once, not per worker)
        self.timeout = timeout
        self.startup_timeout = startup_timeout
        self.setup = setup or {}
        self.ctx = mp.get_context("spawn")
        self.slots: list[_Slot] = []
        self.logdir = tempfile.TemporaryDirectory(prefix="sdpa_probe_check_")
        self.n_spawned = 0

    def _spawn(self) -> _Slot:
        parent, child = self.ctx.Pipe()
        self.n_spawned += 1
        log = os.path.join(self.logdir.name, f"worker{self.n_spawned}.log")
        proc = self.ctx.Process(target=_worker_main, args=(child, {**self.setup, "log": log}),
                                daemon=True)
        # glibc fills every block the worker mallocs with 0x7F bytes (3.4e38 as F32, NaN
        # as F16): a kernel that reads scratch it never wrote gets garbage every time,
        # not what the heap held (often zeros: a pass by luck). Without the per-thread
        # cache, which hands blocks back unfilled.
        tunables = [f"glibc.malloc.perturb={MALLOC_PERTURB}", "glibc.malloc.tcache_count=0"]
        env = {}
        if self.malloc_debug is not None:  # (not over the user's own preload: a sanitizer)
            env["LD_PRELOAD"] = self.malloc_debug
            tunables.append("glibc.malloc.check=3")
        saved = {k: os.environ.get(k) for k in ("GLIBC_TUNABLES", *env)}
        os.environ["GLIBC_TUNABLES"] = ":".join(
            t for t in (saved["GLIBC_TUNABLES"], *tunables) if t)
        os.environ.update(env)
        try:
            proc.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        child.close()
        return _Slot(proc, parent, log, deadline=time.monotonic() + self.startup_timeout)

    @staticmethod
    def _kill(slot: _Slot) -> None:
        if slot.proc.is_alive():
            slot.proc.kill()
        slot.proc.join(5)
        slot.conn.close()

    def _retire(self, slot: _Slot) -> None:
        """Ask the worker to exit, and kill it if it has not within 2 s."""
        try:
            slot.conn.send(None)
        except (OSError, BrokenPipeError):
            pass
        slot.proc.join(2)
        self._kill(slot)

    def run(self, work: list[tuple[Case, list[str]]], on_record) -> None:
        queue = collections.deque(work)
        self.slots = [self._spawn() for _ in range(min(self.n, len(queue)) or 1)]
        try:
            while queue or any(s.case is not None for s in self.slots):
                for s in self.slots:
                    if s.ready and s.case is None and queue:
                        case, names = queue.popleft()
                        s.case, s.pending = case, list(names)
                        s.deadline = time.monotonic() + self.timeout
                        s.conn.send((case.params(), names))
                now = time.monotonic()
                wait_for = max(0.01, min(s.deadline for s in self.slots) - now)
                ready = wait([s.conn for s in self.slots] + [s.proc.sentinel for s in self.slots],
                             timeout=wait_for)
                for i, s in enumerate(list(self.slots)):
                    if s.conn in ready or s.proc.sentinel in ready:
                        self.slots[i] = self._service(s, queue, on_record)
                now = time.monotonic()
                for i, s in enumerate(list(self.slots)):
                    if now > s.deadline and (s.case is not None or not s.ready):
                        self.slots[i] = self._expire(s, queue, on_record)
        finally:
            for s in self.slots:
                self._retire(s)
            self.logdir.cleanup()

    def _service(self, s: _Slot, queue, on_record) -> _Slot:
        try:
            finished = False  # (a job, in this call)
            while s.conn.poll():
                msg = s.conn.recv()
                if msg[0] == "ready":
                    s.ready = True
                elif msg[0] == "rec":
                    rec = msg[1]
                    if s.pending and s.pending[0] == rec["backend"]:
                        s.pending.pop(0)
                    on_record(rec)
                    s.deadline = time.monotonic() + self.timeout
                elif msg[0] == "done":
                    s.case, s.pending, finished = None, [], True
                    if self.fresh_per_job:
                        break
            if self.fresh_per_job and finished:
                self._retire(s)
                return self._spawn()
            return s
        except (EOFError, OSError):
            pass
        # the worker died
        s.proc.join(5)
        why = died_in_call(s.proc.exitcode) if s.pending else signal_name(s.proc.exitcode)
        said = _last_words(s.log)
        if said:
            why += f"; it printed: {said}{explain_heap_abort(said)}"
        if s.case is not None and s.pending:
            on = ""
            if s.case.invalid:  # (the call it died in was one it should have refused)
                from .invalid_args import describe

                on = f" on an invalid call ({describe(s.case.invalid)}), not refused"
            return self._replace(s, queue, on_record, status="crash",
                                 reason=f"worker process died{on}: {why}")
        if not s.ready:
            raise RuntimeError(f"a check worker failed to start ({why})")
        self._kill(s)
        return self._spawn()

    def _expire(self, s: _Slot, queue, on_record) -> _Slot:
        if not s.ready:
            self._kill(s)
            raise RuntimeError("a check worker did not start in time")
        return self._replace(s, queue, on_record, status="timeout",
                             reason=f"no result within {self.timeout:g} s", seconds=self.timeout)

    def _replace(self, s: _Slot, queue, on_record, **outcome) -> _Slot:
        """Record the backend in flight with this outcome, re-queue the rest of its job
        and put a fresh worker in the slot."""
        rec = base_record(s.pending[0], s.case)
        rec.update(outcome)
        on_record(rec)
        if s.pending[1:]:
            queue.appendleft((s.case, s.pending[1:]))
        self._kill(s)
        return self._spawn()


# ---- one trial call of a user kernel, in a child process ------------------------------

# what the trial child writes last: a kernel that calls exit() ends it without this
TRIAL_DONE = b"sdpa_probe trial call returned"


def _trial_child() -> None:
    """The child of trial_call: (BuildResult, shape fields, threads) pickled on stdin."""
    import pickle
    import sys

    result, shape, threads = pickle.load(sys.stdin.buffer)
    try:
        from . import bench, native
        from .build import load

        mod = load(result)
        sh = bench.Shape(**shape)
        s = bench.make_inputs(sh, 1)[0]
        call = native.prepare(mod.ffi, s.q, s.k, s.v, s.out, is_causal=sh.causal,
                              start_pos=sh.start_pos, n_threads=threads)
        mod.lib.sdpa_forward(call.args)
    except Exception:  # not the trial's business: the caller's own first call reports it
        pass
    sys.stdout.flush()
    os.write(1, b"\n" + TRIAL_DONE)


def child_env(**extra: str) -> dict:
    """The environment for a `python -c` / `-m` child that imports this package: ours,
    with the package's parent put first on PYTHONPATH (a checkout that is not installed
    still imports), plus `extra`."""
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (package_parent, os.environ.get("PYTHONPATH")) if p), **extra)


def trial_call(result, shape: dict, threads: int = 0, timeout: float = 120.0) -> str | None:
    """Call a built user kernel (result: its BuildResult) once on a bench.Shape's fields
    in a child process, before a caller runs it in its own: None if the child lived
    through the call, else how it died, e.g. 'SIGSEGV' or 'no return within 120 s'.
    (Its status is not judged here; an error of the trial itself counts as lived.)"""
    import pickle
    import subprocess
    import sys

    env = child_env()
    try:
        out = subprocess.run([sys.executable, "-c",
                              "from sdpa_probe.harness import _trial_child; _trial_child()"],
                             input=pickle.dumps((result, shape, threads)), capture_output=True,
                             timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return f"no return within {timeout:g} s"
    said = [ln.strip() for ln in out.stderr.decode(errors="replace").splitlines() if ln.strip()]
    tail = f"; it printed: {said[-1][:240]}" if said else ""
    if out.returncode < 0 or not out.stdout.endswith(TRIAL_DONE):  # (ended inside the call)
        return died_in_call(out.returncode) + tail
    return None
