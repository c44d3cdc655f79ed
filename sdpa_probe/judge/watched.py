"""The judge of one output (verdict.judge), with output left unwritten watched a
little longer for a late write."""

from __future__ import annotations

import time

from ..cases import Case
from ..oracle import Prepared
from .verdict import judge

LATE_WRITE_WAIT = 0.02  # seconds unwritten native output is watched for a late write


def judge_watched(case: Case, prep: Prepared, out, **kw):
    """verdict.judge, where output left unwritten is watched LATE_WRITE_WAIT more: it may
    be a thread of the kernel that writes later than the verdict looked, which given the
    time shows itself (verdict layer 0)."""

    v = judge(case, prep.ref, out, prep.torch_err, **kw)
    if v.status == "fail" and out.at_return is not None and "never written" in v.reason:
        time.sleep(LATE_WRITE_WAIT)
        if out.written_after_return()[0]:
            v = judge(case, prep.ref, out, prep.torch_err, **kw)
    return v
