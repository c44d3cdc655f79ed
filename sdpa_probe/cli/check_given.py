"""`probe check`'s options beyond the suites: `--case` (an id or a spec, repeatable) and
`--corpus DIR` (the cases fuzzing kept) instead of a suite, `--coverage` (which factor
pairs the selected cases meet), `--stress` (threaded and concurrent cases again under
varied scheduling, after the run)."""

from __future__ import annotations

from pathlib import Path

from ..backends.registry import is_kernel_file
from ..cases import Case, all_cases, find_case
from ..cases.spec import is_spec, parse_spec, spec_of
from ..check.run import CheckRequest, CheckResult, wanted
from ..errors import ProbeError
from ..fuzz import corpus as corpus_files
from ..fuzz.coverage import coverage, render
from ..fuzz.live_pool import LivePool
from ..fuzz.stress import StressJob, stress_preload, threaded
from ..report import summary
from .output import Output


def given_cases(case_args: list[str] | None, corpus: Path | None,
                req: CheckRequest) -> list[Case] | None:
    """The cases --case and --corpus name (None if neither is given), -k, --skip and
    --dtype applied; the request's suite becomes 'cases' or 'corpus' (no cache-sizing
    records come with them)."""
    if not case_args and corpus is None:
        return None
    cases: list[Case] = []
    fixed = all_cases() if any(not is_spec(a) for a in case_args or ()) else {}
    for arg in case_args or ():
        if is_spec(arg):
            try:
                cases.append(parse_spec(arg))
            except (ValueError, TypeError) as exc:
                raise ProbeError(f"--case {arg!r}: {exc}") from None
            continue
        found = find_case(arg.strip(), fixed)
        if found is None:
            raise ProbeError(f"--case {arg!r}: no case has this id (probe check --list "
                             "--suite full; a generated case is given by its spec, key=value,...)")
        cases.append(found)
    if corpus is not None:
        cases += corpus_files.load(corpus)
    req.suite_name = "corpus" if corpus is not None and not case_args else "cases"
    if req.dtypes:
        cases = [c for c in cases if c.dtype in req.dtypes]
    cases = [c for c in cases if wanted(c.id, req.k, req.skip)]
    ids = [c.id for c in cases]
    if len(set(ids)) != len(ids):
        raise ProbeError("two of the given cases have one id: give each once")
    if not cases:
        raise ProbeError("no case matches the filters")
    return cases


def spec_repros(res: CheckResult, given: list[Case] | None) -> None:
    """The records of given cases that no suite has: their repro names the case by its
    spec (an id finds only a suite's case)."""
    if not given:
        return
    fixed = all_cases()
    specs = {c.id: spec_of(c) for c in given if find_case(c.id, fixed) != c}
    for rec in res.records:
        if rec.case in specs and is_kernel_file(rec.backend):
            rec.repro = f"probe check --kernel {rec.backend} --case '{specs[rec.case]}'"
        elif rec.case in specs:
            rec.repro = f"probe check --backend {rec.backend} --case '{specs[rec.case]}'"
    res.document["records"] = [r.as_dict() for r in res.records]


def show_coverage(out: Output, cases: list[Case], json_path: str | None) -> None:
    """--coverage: the selected cases' factor pairs, met and never met."""
    groups = coverage(cases)
    if json_path:
        out.write_json(json_path, {"cases": len(cases), "coverage": groups})
    if not out.json_mode:
        out.print(f"coverage of {len(cases)} cases:")
        for line in render(groups):
            out.print("  " + line, markup=False)


def stress_after(out: Output, req: CheckRequest, res: CheckResult, rounds: int) -> None:
    """--stress: each threaded or concurrent case that passed, `rounds` more times per
    backend under varied scheduling (fuzz/stress.py); a round that fails replaces the
    case's record, and the document says how many rounds ran."""
    passed = {(r.backend, r.case) for r in res.records if r.status == "pass"}
    todo = [c for c in res.cases if threaded(c)]
    job_total = {"rounds": 0, "cases": 0, "differed": 0, "rounds_per_case": rounds}
    with LivePool(req.timeout, req.worker_setup(), stress_preload()) as pool:
        for name in req.names:
            job = StressJob(pool, [name], rounds)
            for c in todo:
                if (name, c.id) not in passed:
                    continue
                for rec in job(c):
                    if rec.status != "pass":
                        _replace(res, rec)
            for k in ("rounds", "cases", "differed"):
                job_total[k] += job.summary()[k]
    res.document["stress"] = job_total
    res.document["records"] = [r.as_dict() for r in res.records]
    res.document["summary"] = summary(res.records)
    out.note(f"stress: {job_total['rounds']} rounds over {job_total['cases']} threaded or "
             f"concurrent (backend, case) pairs; {job_total['differed']} differed from the "
             "plain run")


def _replace(res: CheckResult, rec) -> None:
    for i, old in enumerate(res.records):
        if old.backend == rec.backend and old.case == rec.case:
            res.records[i] = rec
            return
    res.records.append(rec)
