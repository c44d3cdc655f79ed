"""One backend's calls on one case, in this process, and the record of their verdict:
the plain call, an invalid call, concurrent callers, buffers reused in place, a
small stack. (--repro and pytest call these directly; `probe check` in workers.)"""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np

from .. import caller_state, invalid_args
from ..backends import Unsupported, describe_failure
from ..cases import Case
from ..errors import KernelError
from ..inputs import InputGuard, input_buffers, out_buffer
from ..judge import repeat
from ..judge.convention import convention_of
from ..judge.probes import LEAK_PROBE_MAX_SECONDS
from ..judge.watched import judge_watched
from ..native import describe_fp_change, fp_control, set_fp_control
from ..oracle import Prepared, for_products, prepare_case
from ..records import Record, base_record


def run_one(backend, case: Case, prep: Prepared, keep_output: bool = False) -> Record:
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


def _run_invalid(backend, case: Case, prep: Prepared) -> Record:
    """The case's valid call with one argument broken (invalid_args): a native kernel
    must return SDPA_INVALID (SDPA_UNSUPPORTED is accepted) and write nothing, output
    guards included. torch and ExecuTorch make the call through their own API where it
    can express it (backend.INVALID) and must raise; elsewhere they are unsupported."""

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
        rec.seconds = time.perf_counter() - t0
        return rec
    out = out_buffer(case)
    before = out.arena.copy()
    guard = InputGuard(prep.data)
    call = backend.prepare(prep.data, out)
    invalid_args.corrupt(case.invalid, call.args, backend.kernel.ffi)
    t0 = time.perf_counter()
    status = int(backend.kernel.forward_args(call.args))
    rec.seconds = time.perf_counter() - t0
    changed = int((out.arena.view(np.uint8) != before.view(np.uint8)).sum())
    rec.status, rec.reason = invalid_args.judge(case.invalid, status, changed,
                                                      guard.written())
    return rec


def _on_small_stack(kib: int, fn):
    """fn() on a new thread whose stack is `kib` KiB: what a runtime's worker thread
    may give a kernel (macOS: 512 KiB, threads of embedded runtimes less). A kernel
    that puts a kv_len-long array on its stack overflows it (a crash, in a worker)."""

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


def _run_concurrent(backend, case: Case, prep: Prepared, keep_output: bool) -> Record:
    """case.callers threads call the backend at once, CONCURRENT_ROUNDS times, each
    with its own inputs (caller k: seed + OTHER_INPUTS_SEED_STEP k, its reference
    computed live, as the golden data holds only the case's own) and its own output; the
    first caller's last record if every call passes, else the first failure, saying
    which call it was."""


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
                if rec.status != "pass":
                    return
        except Exception as exc:  # (the harness's own failure, as one record)
            rec = base_record(backend.name, case)
            rec.reason = f"harness error in caller {k + 1}: {type(exc).__name__}: {exc}"
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
        if rec.status != "pass":
            if rec.status in ("fail", "error"):
                rec.reason = (f"with {case.callers} concurrent calls (caller {k + 1}, round "
                                 f"{r + 1} of {CONCURRENT_ROUNDS}): {rec['reason']}")
            return rec
    if changed:
        found[0][1].update(status="fail", reason=(
            f"left its caller changed after {case.callers} concurrent calls: "
            + "; ".join(changed)))
    return found[0][1]


def _run_reused(backend, case: Case, prep: Prepared, keep_output: bool) -> Record:
    """Two calls on the same buffers: the case's inputs, then new values (seed +
    OTHER_INPUTS_SEED_STEP) written into those very buffers (same pointers, strides and
    shapes, as a runtime's static KV cache and mask are rewritten between decode steps),
    each judged against its own reference. A kernel that keeps what it derived from a buffer
    by its address (dequantised or packed K, a mask's visible ranges) answers the second
    call with the first's. The buffers get their first values back afterwards (the next
    backend in this worker reads them)."""


    first = _attempt(backend, case, prep, keep_output)
    if first.status != "pass":
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
        rec = _attempt(backend, case, dataclasses.replace(new, data=data), keep_output)
    finally:
        for name, a in bufs.items():
            np.copyto(a, saved[name])
    if rec.status in ("fail", "error"):
        rec.reason = ("on a second call with its buffers rewritten in place (same pointers, "
                         "new values): " + rec.reason)
    if keep_output:
        rec.reference = new.ref  # (the output kept is the second call's)
    return rec


def _attempt(backend, case: Case, prep: Prepared, keep_output: bool = False,
             before_call=None) -> Record:
    """One call and its verdict; before_call runs just before the kernel is called."""

    rec = base_record(backend.name, case)
    prep = for_products(prep, getattr(backend, "products", None))
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
    rec.seconds = time.perf_counter() - t0
    v = judge_watched(case, prep, out, convention_of(backend, case),
                      inputs_written=guard.written(), fp_changed=fp_changed,
                      caller_changed=state_changed)
    rec.update(**v.as_dict())
    if (repeat.LEAK_CHECK and v.status == "pass" and before_call is None
            and rec.seconds < LEAK_PROBE_MAX_SECONDS):
        repeat.repeat_verdict(rec, backend, case, prep, out)
    if keep_output:
        rec.output = out
    return rec
