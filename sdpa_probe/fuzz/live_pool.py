"""check's worker pool kept open across jobs: fuzzing and stress rounds send one case at
a time and read its records before choosing the next, so a worker (its backends built,
torch imported) serves many jobs. A crash or timeout is a record, as in check, and the
slot gets a fresh worker."""

from __future__ import annotations

import collections
import os

from .. import sandbox
from ..backends import parse
from ..cases import Case
from ..check.pool import WorkerPool
from ..records import Record


class LivePool(WorkerPool):
    """One worker (check's worker_main), jobs one at a time: job() returns the records."""

    def __init__(self, timeout: float, setup: dict, preload: str | None = None):
        super().__init__(jobs=1, timeout=timeout, setup=setup)
        if preload:  # (LD_PRELOAD as the pool sets it: the shim first, glibc's checker after)
            self.malloc_debug = ":".join(p for p in (preload, self.malloc_debug) if p)
        self.slots: list = []

    def __enter__(self) -> LivePool:
        self.limits = sandbox.limits(1, self.timeout, 2)
        self.slots = [self._spawn()]
        return self

    def __exit__(self, *exc) -> None:
        for s in self.slots:
            self._retire(s)
        self.logdir.cleanup()

    @property
    def worker_pid(self) -> int | None:
        return self.slots[0].proc.pid if self.slots else None

    def pin(self, cpus: set[int] | None) -> None:
        """The worker's main thread (and so the threads it starts after) on these CPUs;
        None: every usable CPU."""
        pid = self.worker_pid
        if pid is None:
            return
        try:
            os.sched_setaffinity(pid, cpus or os.sched_getaffinity(0))
        except OSError:
            pass  # (the worker just went: its job reports it)

    def job(self, case: Case, names: list[str]) -> list[Record]:
        """Every backend of `names` on `case`, in the worker; a record each."""
        queue = collections.deque([(case, [parse(n).name for n in names])])
        records: list[Record] = []
        self._drive(queue, records.append)
        return records
