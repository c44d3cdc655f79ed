"""Stress rounds: a threaded or concurrent case run again and again under varied
scheduling, so that a thread the kernel starts really runs its share. The worker has
the scheduling shaker preloaded (native/preload/sched_shake.c: a yield or a short
sleep around every thread start, in turn), and its calling thread is pinned to one
CPU on every other round (threads interleave on one core) and free on the others.
A round that fails is the case's record, saying which round and how it ran."""

from __future__ import annotations

import dataclasses
import os
import sys

from ..build import PRELOAD_DIR, build_preload
from ..cases import Case
from ..errors import BuildError, ProbeError
from ..records import FAILING, Record
from .live_pool import LivePool

DEFAULT_ROUNDS = 20


def stress_preload() -> str:
    """The shaker library's path; ProbeError where it cannot be had (not Linux, no
    compiler, the user's own LD_PRELOAD in the way)."""
    if not sys.platform.startswith("linux"):
        raise ProbeError("--stress shakes threads through an LD_PRELOAD library: Linux only")
    if os.environ.get("LD_PRELOAD"):
        raise ProbeError(f"--stress: LD_PRELOAD is set ({os.environ['LD_PRELOAD']}); the "
                         "scheduling shaker would have to come first")
    try:
        return str(build_preload(PRELOAD_DIR / "sched_shake.c"))
    except BuildError as exc:
        raise ProbeError(f"--stress: the scheduling shaker does not build: {exc}") from None


def threaded(case: Case) -> bool:
    """Whether scheduling can change the case's answer: threads of the kernel's own or
    callers of ours at once."""
    return case.n_threads != 1 or case.callers > 1 or case.relation == "concurrent"


@dataclasses.dataclass
class StressJob:
    """A job per case on the pool, then (rounds > 0, a threaded case that passed)
    `rounds` more under varied scheduling; callable as the fuzzer's run_job."""
    pool: LivePool
    names: list[str]
    rounds: int = 0
    cases: int = 0          # cases stressed
    rounds_run: int = 0
    differed: int = 0       # rounds whose status was not the first run's

    def __call__(self, case: Case) -> list[Record]:
        self.pool.pin(None)
        first = self.pool.job(case, self.names)
        if not self.rounds or not threaded(case) or any(r.status in FAILING for r in first):
            return first
        self.cases += 1
        one_cpu = {min(os.sched_getaffinity(0))}
        try:
            for r in range(self.rounds):
                pinned = r % 2 == 0
                self.pool.pin(one_cpu if pinned else None)
                recs = self.pool.job(case, self.names)
                self.rounds_run += 1
                bad = [x for x in recs if x.status in FAILING]
                if [x.status for x in recs] != [x.status for x in first]:
                    self.differed += 1
                if bad:
                    how = "its calling thread on one CPU" if pinned else "on every CPU"
                    for x in bad:
                        x.reason = (f"under stress (round {r + 1} of {self.rounds}, {how}; "
                                    f"the first run passed): {x.reason}")
                    return recs
        finally:
            self.pool.pin(None)
        return first

    def summary(self) -> dict:
        return {"rounds": self.rounds_run, "cases": self.cases, "differed": self.differed,
                "rounds_per_case": self.rounds}
