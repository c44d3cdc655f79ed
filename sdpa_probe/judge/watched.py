"""The judge of one output (verdict.judge), with output left unwritten watched a
little longer for a late write."""

from __future__ import annotations

import time

from ..cases import Case
from ..oracle import Prepared
from .convention import Convention, rejudge
from .verdict import judge

# seconds unwritten native output is watched for a late write, looked at every
# LATE_WRITE_STEP: a kernel's detached thread is scheduled late on a loaded machine
LATE_WRITE_WAIT = 0.2
LATE_WRITE_STEP = 0.005


def judge_watched(case: Case, prep: Prepared, out, convention: Convention | None = None,
                  **kw):
    """verdict.judge, where output left unwritten is watched LATE_WRITE_WAIT more: it may
    be a thread of the kernel that writes later than the verdict looked, which given the
    time shows itself (verdict layer 0); a failure on tolerance alone judged again under
    the backend's convention, if it has one (convention.py)."""

    kw.setdefault("products", prep.products)
    v = judge(case, prep.ref, out, prep.torch_err, **kw)
    if v.status == "fail" and out.at_return is not None and "never written" in v.reason:
        deadline = time.monotonic() + LATE_WRITE_WAIT
        while time.monotonic() < deadline:
            time.sleep(LATE_WRITE_STEP)
            if out.written_after_return()[0]:
                v = judge(case, prep.ref, out, prep.torch_err, **kw)
                break
    if convention is not None:
        v = rejudge(case, prep.data, out, v, convention, prep.torch_err)
    return v
