"""`probe fuzz`'s loop: hypothesis draws cases (space.py), each runs in a check worker
(live_pool.py) on every backend and is judged as check judges it; a failing case is
shrunk by hypothesis to the smallest that fails the same way (kinds.py), confirmed
once more and kept in a corpus.

The draws come in rounds of ROUND_EXAMPLES, each round its own hypothesis run seeded
from --seed and the round, until --max-examples cases or the --time budget; the budget
ends generation, never a shrink in progress (a shrink has SHRINK_SECONDS of its own)."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed

from ..cases import Case
from ..errors import ProbeError
from ..records import FAILING, Record
from . import corpus
from .kinds import exception_for, kind_of
from .space import cases

ROUND_EXAMPLES = 25
SHRINK_SECONDS = 300.0
CONFIRM_RUNS = 3


class HarnessStopped(BaseException):
    """The harness itself failed (no worker could start): not a finding to shrink.
    (A BaseException: hypothesis passes it through instead of shrinking it.)"""


@dataclasses.dataclass
class Finding:
    kind: str
    case: Case
    backend: str
    status: str
    reason: str
    after_examples: int            # cases run when it was first seen
    confirmed: int = 0             # of CONFIRM_RUNS reruns of the shrunk case, failing so
    corpus_file: str | None = None


@dataclasses.dataclass
class FuzzResult:
    examples: int
    seconds: float
    findings: list[Finding]
    cases: list[Case]              # every case run (coverage.py reads their factors)
    stopped: str                   # what ended it: found, time, max-examples


def size_key(case: Case) -> tuple:
    """Smaller is simpler: the dimensions' sum, then threads and callers, then the spec's
    length (fewer fields away from the defaults)."""
    dims = (case.batch + case.n_heads + case.n_kv_heads + case.q_len + case.kv_len
            + case.head_dim)
    return (dims, case.n_threads + case.callers, len(case.id))


class Fuzzer:
    """run_job(case) -> its records (one a backend); on_example(n, case, records)."""

    def __init__(self, run_job: Callable[[Case], list[Record]], seconds: float | None,
                 max_examples: int | None, seed: int, relations: bool = True,
                 on_example: Callable[[int, Case, list[Record]], None] | None = None):
        self.run_job = run_job
        self.seconds, self.max_examples = seconds, max_examples
        self.seed, self.relations = seed, relations
        self.on_example = on_example or (lambda n, c, recs: None)
        self.examples = 0
        self.cases: list[Case] = []
        self.smallest: dict[str, Finding] = {}
        self.t0 = time.monotonic()
        self.failing = False   # a failure seen in this round: shrinking, not generating

    def _out_of_budget(self) -> bool:
        if self.max_examples is not None and self.examples >= self.max_examples:
            return True
        return self.seconds is not None and time.monotonic() - self.t0 > self.seconds

    def _test(self, case: Case) -> None:
        if not self.failing and self._out_of_budget():
            return  # (the round's remaining draws pass unrun: the budget is spent)
        if self.failing and time.monotonic() - self.t0 > self._shrink_until:
            return
        try:
            records = self.run_job(case)
        except Exception as exc:  # (the pool's own failure, not the kernel's)
            raise HarnessStopped(f"{type(exc).__name__}: {exc}") from exc
        self.examples += 1
        self.cases.append(case)
        self.on_example(self.examples, case, records)
        bad = [r for r in records if r.status in FAILING]
        if not bad:
            return
        self.failing = True
        rec = bad[0]
        kind = kind_of(rec)
        old = self.smallest.get(kind)
        if old is None or size_key(case) <= size_key(old.case):
            self.smallest[kind] = Finding(kind, case, rec.backend, rec.status, rec.reason,
                                          old.after_examples if old else self.examples)
        raise exception_for(kind)(f"{kind}: {rec.reason}")

    def _round(self, r: int) -> None:
        self.failing = False
        self._shrink_until = float("inf")
        strategy = cases(with_relations=self.relations)

        @hypothesis_seed(random.Random(f"sdpa_probe-fuzz-{self.seed}-{r}").getrandbits(64))
        @settings(max_examples=ROUND_EXAMPLES, deadline=None, database=None,
                  phases=(Phase.generate, Phase.shrink), report_multiple_bugs=True,
                  suppress_health_check=list(HealthCheck), print_blob=False,
                  verbosity=Verbosity.quiet, derandomize=False)
        @given(strategy)
        def test(case: Case) -> None:
            if self.failing and self._shrink_until == float("inf"):
                self._shrink_until = time.monotonic() - self.t0 + SHRINK_SECONDS
            self._test(case)

        try:
            test()
        except BaseException as exc:  # noqa: BLE001 (what was found is in self.smallest)
            if isinstance(exc, HarnessStopped):
                raise ProbeError(f"fuzzing stopped: {exc}") from None
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise

    def _reproduces(self, f: Finding) -> bool:
        recs = [x for x in self.run_job(f.case) if x.backend == f.backend]
        return any(x.status in FAILING and kind_of(x) == f.kind for x in recs)

    def run(self) -> FuzzResult:
        """Rounds until a finding that fails again when rerun once (one that does not,
        a race or state an earlier case left, is kept and drawing goes on) or the budget."""
        r = 0
        stopped = ""
        checked: set[str] = set()
        while not stopped:
            self._round(r)
            r += 1
            new = [f for k, f in self.smallest.items() if k not in checked]
            checked |= {f.kind for f in new}
            if any(self._reproduces(f) for f in new):
                stopped = "found"
            elif self._out_of_budget():
                stopped = ("found" if self.smallest else "max-examples"
                           if self.max_examples is not None
                           and self.examples >= self.max_examples else "time")
        return FuzzResult(self.examples, time.monotonic() - self.t0,
                          sorted(self.smallest.values(), key=lambda f: size_key(f.case)),
                          self.cases, stopped)


def confirm(findings: list[Finding], run_job: Callable[[Case], list[Record]],
            corpus_dir: Path | None) -> None:
    """Each finding's shrunk case run CONFIRM_RUNS more times (a race may not fail every
    time: the count says how often it did), then kept in the corpus."""
    for f in findings:
        for _ in range(CONFIRM_RUNS):
            recs = [r for r in run_job(f.case) if r.backend == f.backend]
            f.confirmed += any(r.status in FAILING and kind_of(r) == f.kind for r in recs)
        if corpus_dir is not None:
            f.corpus_file = str(corpus.save(corpus_dir, f.case, f.backend, f.kind, f.reason))
