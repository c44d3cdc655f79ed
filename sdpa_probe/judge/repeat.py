"""The verdict's last layer: a passing call made again (leaks, a changed answer, a
changed caller, more threads at work than given)."""

from __future__ import annotations

import numpy as np

from .. import caller_state
from ..backends import describe_failure
from ..cases import Case
from ..native import fp_control, set_fp_control
from ..oracle import Prepared
from ..records import Record
from .convention import convention_of
from .probes import (
    LEAK_CALLS,
    LEAK_CONFIRM_CALLS,
    LEAK_WARMUP,
    THREADS_BUSY,
    growth_per_call,
    thread_use,
)
from .watched import judge_watched

LEAK_CHECK = True  # probe check --no-leak-check turns it off


def repeat_verdict(rec: Record, backend, case: Case, prep: Prepared, out) -> None:
    """The verdict's last layer, the call made again: a kernel whose heap grows on every
    repeat (a leak) fails, and so does one whose answer changes when the same call is
    made once more into the same output, poisoned again (state a call leaves behind:
    a staging buffer zeroed only when allocated, a result kept by address). A repeat
    that passes but differs bit for bit sets rec.repeatable False (a note, not a
    failure: a reduction order that follows thread timing). Last, a kernel given one
    thread is called again while its threads are watched (thread_use)."""

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
    rec.leak_bytes_per_call = grew["heap"]
    each = f"on each of {LEAK_CALLS + LEAK_CONFIRM_CALLS} repeats of the same call"
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
    again = judge_watched(case, prep, out, convention_of(backend, case))
    if again.status != "pass":
        rec.update(status="fail", reason="the same call made again, into the same output "
                   "poisoned again, gives another answer: " + again.reason)
        return
    rec.repeatable = bool(np.array_equal(first, out.values(), equal_nan=True))
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
            "spinning)"), retry_on_fresh_inputs=False)  # (not the inputs')
