"""A failed case run once more on fresh copies of its inputs: was it the inputs, or
what an earlier call left behind?"""

from __future__ import annotations

import dataclasses

from ..cases import Case
from ..check.calls import run_one
from ..inputs import materialise
from ..oracle import Prepared
from ..records import Record, repro_command


def retry_on_fresh_inputs(rec: Record, backend, case: Case, prep: Prepared,
                          earlier: Case | None) -> None:
    """A failed case run once more on fresh copies of its inputs (the same values in new
    buffers, at other addresses: the first ones are still held). If that passes, the
    failure came from something other than the inputs: what an earlier call left behind
    (a cache keyed by a buffer's address that a freed buffer's recycled address hits,
    scratch kept between calls) or a race. The record stays a failure, says so, and its
    repro replays the case this backend ran before it in the same process."""

    fresh = dataclasses.replace(prep, data=materialise(case))
    again = run_one(backend, case, fresh)
    rec.fresh_retry = again.status
    if again.status != "pass":
        return
    if case.callers > 1:  # (its callers race each other: the likelier cause)
        rec.reason = (f"wrong in one run of {case.callers} concurrent calls, right in "
                         "another on fresh copies of the same inputs: a race between the "
                         "callers (or state an earlier call left): " + rec.reason)
        return
    if earlier is None:
        rec.reason = ("wrong on the first call, right on fresh copies of the same inputs "
                         "(a race, or state the first call depended on): " + rec.reason)
        return
    rec.after_case = earlier.id
    rec.repro = repro_command(backend.name, case.id, after=earlier.id)
    rec.reason = (f"wrong after {earlier.id} ran in the same process, right on fresh "
                     "copies of the same inputs: the answer depends on an earlier call (state "
                     "kept between calls, e.g. keyed by a buffer's address, which a freed "
                     "buffer's recycled address hits) or on a race: " + rec.reason)
