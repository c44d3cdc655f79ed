"""`probe check --repro CASE_ID` as one function: the case (after the `after` cases)
in a worker on each backend, crash-safe, then again in this process for the output
the error map is drawn from. The command line renders the Repro."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ..backends import make
from ..backends.registry import is_kernel_file
from ..cases import Case, all_cases, judged_tolerance, tolerance
from ..cases import find_case as cases_find_case
from ..cases.spec import is_spec, parse_spec
from ..cases.suites import SUITES, suite
from ..errors import ProbeError
from ..judge import repeat
from ..judge.verdict import error_map
from ..oracle import Prepared, prepare_case
from ..records import FAILING, Record
from ..report import save_repro
from ..saved_case import check_save_dir, save_case
from .calls import run_one
from .pool import WorkerPool

REPRO_SCHEMA = "sdpa_probe.repro/1"


@dataclasses.dataclass
class Detail:
    """Where one backend's output is wrong: its record, values, reference and error map
    (max |error| per query row and head; NaN for NaN / Inf output)."""

    record: Record
    values: np.ndarray
    reference: np.ndarray
    error_map: np.ndarray

    def worst(self) -> dict | None:
        if self.record.worst is None:
            return None
        b, i, h, d = (int(x) for x in self.record.worst)
        return {"b": b, "q": i, "h": h, "d": d, "out": float(self.values[b, i, h, d]),
                "ref": float(self.reference[b, i, h, d])}


@dataclasses.dataclass
class Repro:
    case: Case
    ran_first: list[Record]        # the `after` cases' records (not this repro's verdicts)
    records: list[Record]          # the case's, one per backend, from the worker
    details: dict[str, Detail]     # backend -> its output, for those that made one
    atol: float                    # the case's tolerance before torch's floor
    rtol: float
    saved: list[Path]

    @property
    def exit_code(self) -> int:
        return 1 if any(r.status in FAILING for r in self.records) else 0

    def document(self) -> dict:
        """The JSON document (REPRO_SCHEMA)."""
        detail = {}
        for name, d in self.details.items():
            r = d.record
            detail[name] = {
                "max_abs_err": r.max_abs_err, "max_rel_err": r.max_rel_err, "nmse": r.nmse,
                "atol": r.atol, "rtol": self.rtol, "worst": d.worst(),
                "error_map": [[float(v) if np.isfinite(v) else None for v in row]
                              for row in d.error_map]}
        doc = {"schema": REPRO_SCHEMA, "case": self.case.id, "params": self.case.params(),
               "ran_first": [r.as_dict() for r in self.ran_first],
               "records": [r.as_dict() for r in self.records], "detail": detail}
        if self.saved:
            doc["saved"] = [str(p) for p in self.saved]
        return doc


def find_case(case_id: str) -> Case:
    """The case an id names in any fixed suite: the smoke suite's cases are not all in
    the full one, and a failure's repro command names the case of the suite it ran; or
    a case written out in full (a spec, as probe fuzz prints it)."""
    if is_spec(case_id):
        try:
            return parse_spec(case_id)
        except (ValueError, TypeError) as exc:
            raise ProbeError(f"case spec {case_id!r}: {exc}") from None
    cases = {c.id: c for name in SUITES for c in suite(name)} | all_cases()
    found = cases_find_case(case_id, cases)
    if found is not None:
        return found
    close = [c for c in cases if case_id in c][:5]
    hint = f"; did you mean {', '.join(close)}" if close else ""
    raise ProbeError(f"unknown case id {case_id!r}{hint} (list them: probe check --list "
                     f"--suite full)")


def reproduce(case_id: str, names: list[str], *, timeout: float, seed: int = 0,
              setup: dict | None = None, after: list[str] = (), save: Path | None = None,
              force: bool = False) -> Repro:
    """The case's records from a worker (started with `setup`, as check's are), each
    backend's output from this process, and with `save` its inputs, reference and a
    torch-only script written there, and the case for a standalone C driver (saved_case).
    The `after` cases run first, on the same backends in the same process each time."""
    setup = setup or {}
    case, first = find_case(case_id), [find_case(c) for c in after]
    if seed:
        case = dataclasses.replace(case, seed=case.seed + seed)
        first = [dataclasses.replace(c, seed=c.seed + seed) for c in first]
    _check_save(case, save, force)
    records: list[Record] = []
    # crash-safe first: a kernel that takes its process down only costs the worker
    WorkerPool(jobs=1, timeout=timeout, setup=setup).run(
        [(c, names) for c in first] + [(case, names)], records.append)
    n_first = len(records) - len(names)  # (one record per backend and case, in order)
    prep = prepare_case(case)
    saved, repeat.LEAK_CHECK = repeat.LEAK_CHECK, setup.get("leak_check", True)
    try:
        details = {r.backend: _detail(r.backend, case, first, prep)
                   for r in records[n_first:] if _has_output(r, case)}
    finally:
        repeat.LEAK_CHECK = saved
    paths = _save(save, case, prep, names, records[n_first:]) if save else []
    return Repro(case, records[:n_first], records[n_first:], details, *tolerance(case), paths)


def _check_save(case: Case, save: Path | None, force: bool) -> None:
    if save is not None and case.invalid:
        raise ProbeError(f"--save: {case.id} is an invalid call, judged on its status, with "
                         "no reference to save")
    if save is not None:
        check_save_dir(save, force)


def _save(save: Path, case: Case, prep: Prepared, names: list[str],
          records: list[Record]) -> list[Path]:
    """The torch-only script and the C driver's files, the driver built against the
    first kernel file among the backends (none: the Makefile asks for KERNEL=)."""
    paths = save_repro(save, case, prep.data, prep.ref, ",".join(names))
    kernel = next((n for n in names if is_kernel_file(n)), None)
    rec = next((r for r in records if r.backend == kernel and r.atol is not None), None)
    atol, rtol = ((rec.atol, rec.rtol) if rec is not None
                  else judged_tolerance(case, prep.torch_err))
    return paths + save_case(save, case, prep.data, prep.ref, atol, rtol, kernel,
                             rec.as_dict() if rec is not None else None)


def _has_output(rec: Record, case: Case) -> bool:
    # (an invalid call has no output to map: its status is the verdict)
    return rec.status not in ("crash", "timeout", "unsupported", "error") and not case.invalid


def _detail(name: str, case: Case, first: list[Case], prep: Prepared) -> Detail:
    backend = make(name)
    for c in first:  # (the same history in this process, before the call shown)
        run_one(backend, c, prepare_case(c))
    full = run_one(backend, case, prep, keep_output=True)
    values = full.output.values()
    ref = full.reference if full.reference is not None else prep.ref
    return Detail(full, values, ref, error_map(values, ref))
