"""One trial call of a user kernel, in a child process, before a caller runs it in
its own (bench, profile): a kernel that crashes or exits is found without taking
the caller with it."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

from . import native
from .build import load
from .children import child_env, died_in_call

# what the trial child writes last: a kernel that calls exit() ends it without this
TRIAL_DONE = b"sdpa_probe trial call returned"


def trial_child() -> None:
    """The child of trial_call: (BuildResult, shape fields, threads) pickled on stdin."""
    # the child's own imports: bench's run loop imports this module
    from .bench.inputs import make_inputs
    from .bench.shapes import Shape  # (the same)

    result, shape, threads = pickle.load(sys.stdin.buffer)
    try:
        mod = load(result)
        sh = Shape(**shape)
        s = make_inputs(sh, 1)[0]
        call = native.prepare(mod.ffi, s.q, s.k, s.v, s.out, is_causal=sh.causal,
                              start_pos=sh.start_pos, n_threads=threads)
        mod.lib.sdpa_forward(call.args)
    except Exception:  # not the trial's business: the caller's own first call reports it
        pass
    sys.stdout.flush()
    os.write(1, b"\n" + TRIAL_DONE)


def trial_call(result, shape: dict, threads: int = 0, timeout: float = 120.0) -> str | None:
    """Call a built user kernel (result: its BuildResult) once on a bench.Shape's fields
    in a child process, before a caller runs it in its own: None if the child lived
    through the call, else how it died, e.g. 'SIGSEGV' or 'no return within 120 s'.
    (Its status is not judged here; an error of the trial itself counts as lived.)"""

    env = child_env()
    try:
        out = subprocess.run([sys.executable, "-c",
                              "from sdpa_probe.trial_call import trial_child; trial_child()"],
                             input=pickle.dumps((result, shape, threads)), capture_output=True,
                             timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return f"no return within {timeout:g} s"
    said = [ln.strip() for ln in out.stderr.decode(errors="replace").splitlines() if ln.strip()]
    tail = f"; it printed: {said[-1][:240]}" if said else ""
    if out.returncode < 0 or not out.stdout.endswith(TRIAL_DONE):  # (ended inside the call)
        return died_in_call(out.returncode) + tail
    return None
