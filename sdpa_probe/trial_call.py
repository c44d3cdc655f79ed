"""One trial call of a user kernel, in a child process, before a caller runs it in
its own (bench, profile): a kernel that crashes or exits is found without taking
the caller with it."""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import tempfile

from . import caller_processes, native, sandbox
from .build import load
from .children import TAIL_BYTES, child_env, died_in_call
from .libc import flush_stdio

LEFT_CHANGED = "left its process changed"  # trial_call's answer for a call that returned
# what the trial child writes last: a kernel that calls exit() ends it without this
TRIAL_DONE = b"sdpa_probe trial call returned"


def trial_child() -> None:
    """The child of trial_call: (BuildResult, shape fields, threads, sandbox.Limits, the
    caller's pid) pickled on stdin. Its verdict goes to a copy of fd 1 made before the
    call (a kernel may close fd 1): TRIAL_DONE, then what the call left changed of the
    process (fds 0-2), if anything; what the kernel started is killed."""
    # the child's own imports: bench's run loop imports this module
    from .bench.inputs import make_inputs
    from .bench.shapes import Shape  # (the same)

    result, shape, threads, limits, parent = pickle.load(sys.stdin.buffer)
    sandbox.confine(limits, parent)
    verdict_fd, before = os.dup(1), caller_processes.read()
    try:
        mod = load(result)
        sh = Shape(**shape)
        s = make_inputs(sh, 1)[0]
        call = native.prepare(mod.ffi, s.q, s.k, s.v, s.out, is_causal=sh.causal,
                              start_pos=sh.start_pos, n_threads=threads)
        mod.lib.sdpa_forward(call.args)
    except Exception:  # not the trial's business: the caller's own first call reports it
        pass
    after = caller_processes.read()
    changed = caller_processes.changes(before, after)
    caller_processes.restore(before, after)
    with contextlib.suppress(OSError):
        sys.stdout.flush()
    with contextlib.suppress(OSError, AttributeError):  # (a printf without a newline)
        flush_stdio()
    sandbox.output_unlimited()  # (a kernel that printed up to the cap: the verdict fits)
    os.write(verdict_fd, b"\n" + TRIAL_DONE + "; ".join(changed).encode())


def trial_call(result, shape: dict, threads: int = 0, timeout: float = 120.0) -> str | None:
    """Call a built user kernel (result: its BuildResult) once on a bench.Shape's fields
    in a child process, before a caller runs it in its own: None if the child lived
    through the call and left its process as it was, else what happened, e.g. 'SIGSEGV',
    'no return within 120 s', 'left 1 child process ...'. (Its status is not judged
    here; an error of the trial itself counts as lived.) The child runs in a session of
    its own, ended as a whole: a kernel that forks leaves nothing behind, and its
    processes cannot hold the answer back."""
    limits = sandbox.limits(1, timeout)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-c",
                                 "from sdpa_probe.trial_call import trial_child; trial_child()"],
                                stdin=subprocess.PIPE, stdout=out, stderr=err, env=child_env(),
                                start_new_session=True)
        try:
            proc.communicate(pickle.dumps((result, shape, threads, limits, os.getpid())),
                             timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"no return within {timeout:g} s"
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # (what the kernel started)
            proc.wait()
        stdout, stderr = _tail(out), _tail(err).decode(errors="replace")
    said = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    tail = f"; it printed: {said[-1][:240]}" if said else ""
    if proc.returncode < 0 or TRIAL_DONE not in stdout:  # (ended inside the call)
        return (died_in_call(proc.returncode) + sandbox.death_note(proc.returncode, limits)
                + tail + sandbox.memory_note(tail, limits))
    changed = stdout.rsplit(TRIAL_DONE, 1)[1].decode(errors="replace").strip()
    return f"{LEFT_CHANGED}: {changed}" if changed else None


def _tail(fh) -> bytes:
    """The end of what a trial child wrote to a file (at most the output cap)."""
    size = fh.seek(0, os.SEEK_END)
    fh.seek(max(0, size - TAIL_BYTES))
    return fh.read()
