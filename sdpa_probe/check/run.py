"""`probe check` as one function: the cases a request selects, every backend run on
them in worker processes, the cache-sizing suite's records beside them, and the
records in order with the JSON document. The command line (cli/check_cmd.py) parses
options into a CheckRequest and renders the CheckResult."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from pathlib import Path

from .. import last_failed, native
from ..backends import BackendSpec, make
from ..backends.inventory import versions_in_child
from ..backends.registry import worker_groups
from ..cases import DTYPES, SUITES, Case, all_cases, find_case, random_cases, suite
from ..errors import ProbeError
from ..golden import GoldenProblems, GoldenStore, default_dir, store, verify
from ..id_filter import compile_filter
from ..records import FAILING, Record
from ..report import check_document
from ..sizing import run_suite as run_cache_sizing_suite
from .pool import WorkerPool, malloc_debug_library

RANDOM_SUITE = "random"  # cases.random_cases(--seed): a new slice of the space per seed
EXTRA_SUITES = ("cache-sizing",)
ALL_SUITES = (*SUITES, RANDOM_SUITE, *EXTRA_SUITES)


@dataclasses.dataclass
class CheckRequest:
    specs: list[BackendSpec]
    suite_name: str = "default"
    k: list[str] | None = None        # ids matching one of these -k expressions
    skip: list[str] | None = None     # ... and none of these
    dtypes: list[str] | None = None
    seed: int = 0
    jobs: int = 2
    timeout: float = 60.0
    golden: bool = False              # against golden data, not the oracle run live
    golden_dir: Path | None = None    # ... in this directory (default: default_dir())
    last_failed: bool = False
    isolate: bool = False
    leak_check: bool = True
    maxfail: int = 0                  # stop starting cases after this many failures (0: never)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    def worker_setup(self) -> dict:
        """What each worker process starts with (the repro's too)."""
        return {"build": dict(native._build_opts), "leak_check": self.leak_check}


@dataclasses.dataclass
class CheckResult:
    records: list[Record]
    cases: list[Case]
    seconds: float
    document: dict
    golden: GoldenStore | None
    notes: list[str]


def wanted(case_id: str, k: list[str] | None, skip: list[str] | None) -> bool:
    """-k: the id matches one of these expressions (id_filter: words, and, or, not, as
    pytest's -k); --skip: it contains none of those."""
    match = _filter(tuple(k or ()))
    return (match is None or match(case_id)) and not any(s in case_id for s in skip or ())


@functools.lru_cache(maxsize=16)
def _filter(k: tuple[str, ...]):
    return compile_filter(list(k))


def parse_dtypes(specs: list[str] | None) -> list[str] | None:
    if not specs:
        return None
    found = [d.strip() for spec in specs for d in spec.split(",") if d.strip()]
    if not found:
        raise ProbeError(f"--dtype is empty; known: {', '.join(DTYPES)}")
    bad = sorted(set(found) - set(DTYPES))
    if bad:
        raise ProbeError(f"unknown dtype {bad[0]!r}; known: {', '.join(DTYPES)}")
    return found


def select_cases(req: CheckRequest) -> list[Case]:
    """The request's cases (none for a suite that is not a case list)."""
    if req.suite_name not in ALL_SUITES:
        raise ProbeError(f"unknown suite {req.suite_name!r}; known: {', '.join(ALL_SUITES)}")
    if req.suite_name in EXTRA_SUITES:
        return []
    if req.suite_name == RANDOM_SUITE:  # (the seed picks the slice; each case has its own)
        cases = random_cases(req.seed)
    else:
        cases = suite(req.suite_name)
        if req.seed:
            cases = [dataclasses.replace(c, seed=c.seed + req.seed) for c in cases]
    if req.dtypes:
        cases = [c for c in cases if c.dtype in req.dtypes]
    cases = [c for c in cases if wanted(c.id, req.k, req.skip)]
    if not cases:
        raise ProbeError("no case matches the filters")
    return cases


def runs_cache_sizing(req: CheckRequest) -> bool:
    """The cache-sizing records come with the default suite (unless --dtype or --golden
    narrows it) and make the cache-sizing suite."""
    return req.suite_name in EXTRA_SUITES or (
        req.suite_name == "default" and not req.golden and not req.dtypes)


def last_failed_filter(req: CheckRequest, cases: list[Case],
                       notes: list[str]) -> tuple[list[Case], set[str] | None]:
    """--last-failed: the cases that failed last time for these backends, and the ids to
    keep (cache-sizing records' too); all of them, with a note, if none did."""
    known = last_failed.failed_for(req.names)
    sizing = {i for i in known if find_case(i, all_cases()) is None}
    if known & {c.id for c in cases} or (sizing and runs_cache_sizing(req)):
        return [c for c in cases if c.id in known], known
    notes.append(f"--last-failed: no failure recorded for {', '.join(req.names)} among the "
                 f"selected cases ({last_failed.path()}); checking them all")
    return cases, None


def cache_sizing_records(specs: list[BackendSpec]) -> list[Record]:
    """The cache-sizing suite (ring / sink KV caches) through one float native kernel:
    flash if it is being checked, else the first float native kernel asked for."""
    floats = [s.name for s in specs
              if s.kind == "native" and "f32" in native.get_kernel(s.name).info.dtypes]
    if not floats:
        return []
    name = "flash" if "flash" in floats else floats[0]
    records = []
    for r in run_cache_sizing_suite(name):
        records.append(Record(name, r["case"], "cache-sizing", status=r["status"],
                              reason=r.get("reason", ""), max_abs_err=r.get("max_abs_err"),
                              seconds=r.get("seconds"),
                              repro=f"probe check --suite cache-sizing --backend {name}"))
    return records


def open_golden(req: CheckRequest, cases: list[Case],
                progress: Callable[[str], None] | None = None) -> GoldenStore | None:
    """The golden set a --golden check judges against: every selected case stored, and
    what `probe golden verify` finds for them (files, records, semantics, the inputs,
    references and torch errors recomputed) nothing, else GoldenError before any worker
    starts."""
    if not req.golden:
        return None
    if req.suite_name in EXTRA_SUITES:
        raise ProbeError(f"the {req.suite_name} suite has no golden references; drop --golden")
    golden = store(req.golden_dir if req.golden_dir is not None else default_dir())
    golden.require(cases)  # every case stored and its file intact, else one line
    res = verify(golden.root, ids=[c.id for c in cases if c.needs_reference],
                 progress=progress)
    if not res.ok:
        raise GoldenProblems(res)
    return golden


def run_check(req: CheckRequest, cases: list[Case],
              on_record: Callable[[Record], None] = lambda rec: None,
              keep_ids: set[str] | None = None, notes: list[str] | None = None,
              on_golden_case: Callable[[str], None] | None = None) -> CheckResult:
    """Every backend of the request on `cases` (select_cases, last_failed_filter), then
    the cache-sizing records where the suite has them (those in keep_ids, if given);
    on_record sees each record as it comes, on_golden_case each case id as its golden
    data is verified (--golden)."""
    notes = notes if notes is not None else []
    if not req.specs:
        raise ProbeError("no backend to check")
    golden = open_golden(req, cases, on_golden_case)
    records: list[Record] = []

    def collect(rec: Record) -> None:
        records.append(rec)
        on_record(rec)

    def stop() -> bool:  # --maxfail: no new case once this many failed
        return bool(req.maxfail) and sum(r.status in FAILING for r in records) >= req.maxfail

    t0 = time.perf_counter()
    if cases:
        setup = req.worker_setup()
        if golden is not None:
            setup["golden"] = str(golden.root.resolve())
        for names in worker_groups(req.specs):  # (one pool each: registry.worker_groups)
            WorkerPool(jobs=req.jobs, timeout=req.timeout, setup=setup,
                       fresh_per_job=req.isolate).run([(c, names) for c in cases], collect,
                                                      stop)
    if stop():
        ran = {r.case for r in records}
        notes.append(f"stopped after {req.maxfail} failure(s) (--maxfail): "
                     f"{sum(c.id not in ran for c in cases)} case(s) not run")
    elif runs_cache_sizing(req):
        # -k, --skip (and --last-failed) filter these records by id too
        records += [r for r in cache_sizing_records(req.specs)
                    if wanted(r.case, req.k, req.skip)
                    and (keep_ids is None or r.case in keep_ids)]
    seconds = time.perf_counter() - t0
    try:
        last_failed.record(records, {c.id for c in cases} | {
            r.case for r in records if r.family == "cache-sizing"}, req.names)
    except OSError as exc:
        notes.append(f"could not keep this run's failures for --last-failed: {exc}")
    order = {c.id: i for i, c in enumerate(cases)}
    records.sort(key=lambda r: (req.names.index(r.backend) if r.backend in req.names
                                else 99, order.get(r.case, 1 << 30)))
    return CheckResult(records, cases, seconds, _document(req, records, seconds, golden),
                       golden, notes)


def backend_versions(specs: list[BackendSpec]) -> dict[str, str]:
    """What ran, by name: our kernels are this package's version, a kernel file is
    itself, torch is in the environment; a runtime is asked in a child process
    (backends.inventory: loading one can change the process that loads it)."""
    out = {s.name: make(s).version() for s in specs
           if s.kind != "registered" or s.name == "torch"}
    runtimes = [s.name for s in specs if s.kind == "registered" and s.name != "torch"]
    if runtimes:
        versions, trouble = versions_in_child(runtimes)
        out |= {n: versions.get(n) or f"(no version: {trouble})" for n in runtimes}
    return out


def _document(req: CheckRequest, records: list[Record], seconds: float,
              golden: GoldenStore | None) -> dict:
    run = {"isolate": req.isolate, "leak_check": req.leak_check,
           "heap_guard": malloc_debug_library() is not None}
    doc = check_document(records, suite=req.suite_name, seconds=seconds, backends=req.names,
                         seed=req.seed, run=run)
    doc["backend_versions"] = backend_versions(req.specs)
    if golden is not None:
        m = golden.manifest
        doc["reference"] = {"source": "golden", "dir": str(golden.root),
                            "versions": m["versions"], "generator": m["generator"]}
    return doc
