"""A check worker process: builds each case it is sent once, runs every backend on
it and sends a record per backend back."""

from __future__ import annotations

import os
import traceback

from .. import caller_state, sandbox
from ..backends import make
from ..cases import Case
from ..children import kill_tree
from ..diagnosis import DiagnosisBudget
from ..errors import CaseUnavailable
from ..judge import repeat
from ..judge.fresh_inputs import retry_on_fresh_inputs
from ..native import configure
from ..records import base_record
from ..targets.check import TargetBackend
from ..targets.spec import split_target
from .calls import prepare_case
from .relations import run_case


def worker_main(conn, setup: dict) -> None:
    # what the kernel prints (an abort's message, a library's logging) goes to a
    # log the parent reads when this process dies (appended to: emptied per job)
    if setup.get("log"):
        fd = os.open(setup["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    os.setpgrp()  # its own process group: the pool kills it and what a kernel forked at once

    import torch  # deferred: after the log is in place, so that torch's own words go there

    torch.set_num_threads(1)

    configure(**setup.get("build", {}))
    if setup.get("parent") and caller_state.die_with_parent(setup["parent"]) == 1:
        return  # (the run ended while this worker started)
    limits = setup.get("limits")
    if limits is not None:
        sandbox.confine(limits)
    repeat.LEAK_CHECK = setup.get("leak_check", True)
    try:
        _serve(conn, setup, limits)
    finally:  # (what kernels started and left, reaped by this process: not orphaned)
        kill_tree(os.getpid())


def _serve(conn, setup: dict, limits: sandbox.Limits | None) -> None:
    """Jobs from the pool until it sends None or goes: a record per backend, then done
    (and whether this process is worn out: too little CPU time left for a job)."""
    backends: dict = {}
    earlier: dict[str, Case] = {}  # the case each backend ran last in this process
    diagnosis_budget = DiagnosisBudget()  # (shared by the jobs this worker serves)
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
        if limits is not None:
            sandbox.fresh_log(setup.get("log", ""))
            sandbox.allow_cpu(limits)
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
                rec.update(status=status, reason=reason + sandbox.memory_note(reason, limits))
                conn.send(("rec", rec))
            conn.send(("done", limits is not None and sandbox.worn_out(limits)))
            continue
        for name in names:
            if limits is not None:
                sandbox.allow_cpu(limits)
            try:
                if split_target(name)[1]:  # (another CPU: the native worker runs the case)
                    if name not in backends:
                        backends[name] = TargetBackend(name, repeat.LEAK_CHECK)
                    conn.send(("rec", backends[name].check_case(
                        case, prep, setup.get("timeout", 60.0))))
                    continue
                if name not in backends:
                    backends[name] = make(name)
                rec = run_case(backends[name], case, prep, keep_output=True)
                diagnosis_budget.diagnose(rec, case, prep)
                rec.output = rec.reference = None  # (not sent: the parent has no use for them)
                about_inputs = rec.retry_on_fresh_inputs
                if rec.status == "fail" and not case.invalid and about_inputs:
                    retry_on_fresh_inputs(rec, backends[name], case, prep, earlier.get(name))
            except Exception as exc:
                rec = base_record(name, case)
                rec.reason = f"{type(exc).__name__}: {exc}"[:300]
                rec.reason += sandbox.memory_note(rec.reason, limits)
            earlier[name] = case
            conn.send(("rec", rec))
        conn.send(("done", limits is not None and sandbox.worn_out(limits)))
