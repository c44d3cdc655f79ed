"""`probe check --repro CASE_ID`: rerun one case, show the worst element and an
error map over (query row x head), optionally save a standalone reproduction."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
from rich.table import Table
from rich.text import Text

from ..backends import make
from ..cases import Case, all_cases, tolerance
from ..cases import find_case as cases_find_case
from ..check.calls import run_one
from ..check.pool import WorkerPool
from ..errors import ProbeError
from ..judge import repeat
from ..judge.verdict import error_map
from ..oracle import prepare_case
from ..records import FAILING, Record
from ..report import save_repro
from .output import Output

REPRO_SCHEMA = "sdpa_probe.repro/1"

# error relative to the case's tolerance, darkest = beyond it
SHADES = [(0.01, " "), (0.1, "·"), (0.5, "░"), (1.0, "▒"), (10.0, "▓"), (math.inf, "█")]


def find_case(case_id: str, seed: int = 0) -> Case:
    cases = all_cases()
    found = cases_find_case(case_id, cases)
    if found is not None:
        return found
    close = [c for c in cases if case_id in c][:5]
    hint = f"; did you mean {', '.join(close)}" if close else ""
    raise ProbeError(f"unknown case id {case_id!r}{hint} (list them: probe check --list "
                     f"--suite full)")


def render_map(emap: np.ndarray, atol: float, max_rows: int = 48) -> Text:
    """One character per (query row, head): shade by error / tolerance, N for NaN/Inf."""
    rows = emap.shape[0]
    step = max(1, math.ceil(rows / max_rows))
    text = Text()
    text.append("rows = query rows" + (f" (every {step}th)" if step > 1 else "") +
                ", columns = heads; shade = error / tolerance: ")
    for hi, ch in SHADES:
        text.append(f"[{ch}]<{hi:g} " if math.isfinite(hi) else f"[{ch}]>=10 ")
    text.append(" [N]=NaN/Inf\n")
    for i in range(0, rows, step):
        text.append(f"q{i:>5} |")
        for v in emap[i]:
            if not np.isfinite(v):
                text.append("N", style="bold red")
                continue
            r = v / atol if atol > 0 else math.inf
            ch = next(c for hi, c in SHADES if r < hi)
            text.append(ch, style="red" if r >= 1 else None)
        text.append("|\n")
    return text


def run_repro(out: Output, case_id: str, names: list[str], save: Path | None, force: bool,
              timeout: float, seed: int, setup: dict | None = None,
              after: list[str] = (), json_path: str | None = None) -> int:
    """The case in a worker (started with `setup`, as check's are), then in this process
    for its error map; 1 if a backend failed it. The `after` cases run first, on the same
    backends in the same process each time (their verdicts are not this repro's). With
    json_path, the same as one JSON document (REPRO_SCHEMA)."""
    setup = setup or {}
    saved, repeat.LEAK_CHECK = repeat.LEAK_CHECK, setup.get("leak_check", True)
    doc: dict = {"schema": REPRO_SCHEMA}
    try:
        code = _run_repro(out, case_id, names, save, force, timeout, seed, setup, after, doc)
    finally:
        repeat.LEAK_CHECK = saved
    if json_path:
        out.write_json(json_path, doc)
    return code


def _run_repro(out: Output, case_id: str, names: list[str], save: Path | None, force: bool,
               timeout: float, seed: int, setup: dict, after: list[str], doc: dict) -> int:
    case, first = find_case(case_id), [find_case(c) for c in after]
    if seed:
        case = dataclasses.replace(case, seed=case.seed + seed)
        first = [dataclasses.replace(c, seed=c.seed + seed) for c in first]
    if save is not None and case.invalid:
        raise ProbeError(f"--save: {case.id} is an invalid call, judged on its status, with "
                         "no reference to save")
    if save is not None and save.exists() and any(save.glob(f"{case.id}.*")) and not force:
        raise ProbeError(f"{save} already holds files for {case.id}; use --force to overwrite")
    records: list[Record] = []
    # crash-safe first: a kernel that takes its process down only costs the worker
    WorkerPool(jobs=1, timeout=timeout, setup=setup).run(
        [(c, names) for c in first] + [(case, names)], records.append)
    n_first = len(records) - len(names)  # (one record per backend and case, in order)
    for rec in records[:n_first]:
        out.print(f"ran first: {rec['backend']} on {rec['case']}: {rec['status']}")
    doc.update(case=case.id, params=case.params(),
               ran_first=[r.as_dict() for r in records[:n_first]], records=[], detail={})
    records = records[n_first:]
    prep = prepare_case(case)
    atol, rtol = tolerance(case)
    code = 0
    for rec in records:
        doc["records"].append(rec.as_dict())
        st = rec.status
        out.print(f"[bold]{rec['backend']}[/] on [bold]{case.id}[/]: {st}"
                  + (f" - {rec['reason']}" if rec.reason else ""))
        if st in FAILING:
            code = 1
        if st in ("crash", "timeout", "unsupported", "error") or case.invalid:
            continue  # (an invalid call has no output to map: its status is the verdict)
        backend = make(rec.backend)
        for c in first:  # (the same history in this process, before the call shown)
            run_one(backend, c, prepare_case(c))
        full = run_one(backend, case, prep, keep_output=True)
        vals = full.output.values()
        ref = full.reference if full.reference is not None else prep.ref
        t = Table(show_header=False, box=None)
        t.add_row("max abs err", f"{full['max_abs_err']:.3e}")
        t.add_row("max rel err", f"{full['max_rel_err']:.3e}")
        t.add_row("nmse", f"{full['nmse']:.3e}")
        t.add_row("tolerance", f"{full['atol']:.2e} + {rtol:.1e} * |ref|")
        if full.worst is not None:
            b, i, h, d = full.worst
            t.add_row("worst element", f"b={b} q={i} h={h} d={d}: out {vals[b, i, h, d]:.6g}, "
                                       f"ref {ref[b, i, h, d]:.6g}")
        out.print(t)
        emap = error_map(vals, ref)
        out.print(render_map(emap, full.atol or atol))
        worst = None
        if full.worst is not None:
            b, i, h, d = (int(x) for x in full.worst)
            worst = {"b": b, "q": i, "h": h, "d": d, "out": float(vals[b, i, h, d]),
                     "ref": float(ref[b, i, h, d])}
        # (the map: max |error| per query row and head; null for NaN / Inf output)
        doc["detail"][rec.backend] = {
            "max_abs_err": full.max_abs_err, "max_rel_err": full.max_rel_err,
            "nmse": full.nmse, "atol": full.atol, "rtol": rtol, "worst": worst,
            "error_map": [[float(v) if np.isfinite(v) else None for v in row] for row in emap]}
    if save is not None:
        paths = save_repro(save, case, prep.data, prep.ref, ",".join(names))
        out.print("saved: " + ", ".join(str(p) for p in paths))
        doc["saved"] = [str(p) for p in paths]
    return code
