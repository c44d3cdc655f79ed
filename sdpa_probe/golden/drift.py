"""How a case's golden data moved between two versions of it (a regenerated reference
against the stored one, or one golden set against another), judged against the
case's kernel tolerance."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..cases import Case, judged_tolerance, tolerance
from .format import GoldenError, default_dir
from .manifest import CaseProblem, load_case, read_manifest
from .provenance import torch_err_comparable

# A regenerated reference "changed" when an element moved by more than this fraction
# of the case's kernel tolerance (atol + rtol * |ref|): far below what could flip a
# verdict, far above float64 rounding (~1e-16) between machines or torch builds.
DRIFT_FRACTION = 0.01
# torch's own error floors each case's atol (cases.judged_tolerance, as verdict.judge);
# a change of that effective atol by more than this fraction counts as a change.
TORCH_ERR_DRIFT = 0.10


def _g(x: float | None) -> str:
    return "none" if x is None else f"{x:.3g}"


def _at(idx) -> str:
    b, i, h, d = idx
    return f"b={b} q={i} h={h} d={d}"


def _nonfinite_reason(old_ref: np.ndarray, new_ref: np.ndarray, of: np.ndarray,
                      nf: np.ndarray, pattern: np.ndarray) -> tuple[int, str]:
    """(rows whose NaN/Inf pattern moved, the reason naming them and the first)."""
    rows = pattern.any(axis=-1)
    n = int(rows.sum())
    first = tuple(int(x) for x in np.argwhere(rows)[0])
    if (~nf[pattern]).all():
        zero = int(((old_ref == 0).all(axis=-1) & rows).sum())
        msg = f"NaN/Inf in {n} rows where the old reference is finite"
        if zero:
            msg += f" ({zero} of them zeros in the old: fully masked rows)"
    elif (~of[pattern]).all():
        zero = int(((new_ref == 0).all(axis=-1) & rows).sum())
        msg = f"finite in {n} rows where the old reference is NaN/Inf"
        if zero:
            msg += f" ({zero} of them zeros in the new: fully masked rows)"
    else:
        msg = f"NaN/Inf pattern differs in {n} rows"
    return n, f"{msg}; first at b={first[0]} q={first[1]} h={first[2]}"


def compare(case: Case, old_ref: np.ndarray, old_terr: float | None, old_inputs: str,
            new_ref: np.ndarray, new_terr: float | None, new_inputs: str,
            drift: float = DRIFT_FRACTION, torch_comparable: bool = True) -> dict:
    """How a case's golden data moved from old to new. status: same (no element moved),
    within (moved less than `drift` x tolerance), changed (more, or NaN/Inf pattern,
    shape, inputs or a verdict-relevant torch_err changed). torch_comparable=False (the
    two torch_err were measured under different torch CPU capabilities): a torch_err move
    is a note, not a change."""
    atol, rtol = tolerance(case)
    row = {"case": case.id, "status": "same", "max_abs_delta": 0.0, "tol_fraction": 0.0,
           "where": None, "nonfinite_rows": 0, "torch_err_old": old_terr,
           "torch_err_new": new_terr, "reasons": [], "notes": []}
    reasons = row["reasons"]
    if old_inputs != new_inputs:
        reasons.append("inputs differ (the seed now generates other inputs)")
    if old_ref.shape != new_ref.shape:
        reasons.append(f"shape {list(old_ref.shape)} -> {list(new_ref.shape)}")
        row["status"] = "changed"
        return row
    of, nf = np.isfinite(old_ref), np.isfinite(new_ref)
    pattern = of != nf
    if pattern.any():
        row["nonfinite_rows"], why = _nonfinite_reason(old_ref, new_ref, of, nf, pattern)
        reasons.append(why)
    both = of & nf
    delta = np.where(both, np.abs(new_ref - old_ref), 0.0)
    bound = atol + rtol * np.abs(np.where(of, old_ref, 0.0))
    frac = delta / bound
    if delta.size:
        idx = tuple(int(x) for x in np.unravel_index(int(np.argmax(frac)), frac.shape))
        row.update(max_abs_delta=float(delta.max()), tol_fraction=float(frac[idx]))
        if frac[idx] > 0:
            row["where"] = list(idx)
        if frac[idx] > drift:
            n_bad = int((frac > drift).sum())
            reasons.append(f"{n_bad} elements moved by more than {drift:g} x tolerance: worst "
                           f"|delta| {delta[idx]:.3g} = {frac[idx]:.3g} x tolerance at "
                           f"{_at(idx)} (old {old_ref[idx]:.9g}, new {new_ref[idx]:.9g})")
    a0, a1 = judged_tolerance(case, old_terr)[0], judged_tolerance(case, new_terr)[0]
    if abs(a1 - a0) > TORCH_ERR_DRIFT * a0:
        msg = (f"torch_err {_g(old_terr)} -> {_g(new_terr)} moves this case's atol "
               f"{a0:.3g} -> {a1:.3g}")
        if torch_comparable:
            reasons.append(msg)
        else:
            row["notes"].append(msg + " (torch_err measured under another torch CPU capability)")
    if reasons:
        row["status"] = "changed"
    elif (delta > 0).any() or old_terr != new_terr:
        row["status"] = "within"
    return row


def count_statuses(rows: list[dict]) -> dict[str, int]:
    counts: dict = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return counts


def _diff_case(cid: str, sides: list[tuple[Path, dict, dict]], drift: float,
               comparable: bool) -> dict:
    """One case on both sides ((root, manifest, entry) each)."""
    loaded = []
    for root, man, ent in sides:
        try:
            loaded.append(load_case(root, man, ent))
        except CaseProblem as exc:
            return {"case": cid, "status": "unreadable", "reasons": [exc.problem.message]}
    (ra, ta), (rb, tb) = loaded
    ent_a, ent_b = sides[0][2], sides[1][2]
    return compare(Case(**ent_a["params"]), ra, ta, ent_a["inputs_sha256"], rb, tb,
                   ent_b["inputs_sha256"], drift, comparable)


def diff_sets(a: Path | None, b: Path, drift: float = DRIFT_FRACTION) -> dict:
    """Case by case, how set b differs from set a (a = this, None: default_dir(); b =
    other)."""
    a = default_dir() if a is None else Path(a)
    man_a, pa = read_manifest(a)
    man_b, pb = read_manifest(b)
    if man_a is None:
        raise GoldenError(pa[0].message)
    if man_b is None:
        raise GoldenError(pb[0].message)
    ea = {e["id"]: e for e in man_a["cases"]}
    eb = {e["id"]: e for e in man_b["cases"]}
    comparable = torch_err_comparable(man_a, man_b)
    rows = []
    for cid in sorted(set(ea) | set(eb)):
        if cid not in eb:
            rows.append({"case": cid, "status": "only-this", "reasons": []})
        elif cid not in ea:
            rows.append({"case": cid, "status": "only-other", "reasons": []})
        else:
            rows.append(_diff_case(cid, [(a, man_a, ea[cid]), (b, man_b, eb[cid])], drift,
                                   comparable))
    header = {}
    for key in ("versions", "semantics", "generator"):
        va, vb = man_a.get(key, {}), man_b.get(key, {})
        header[key] = {k: {"this": va.get(k), "other": vb.get(k)}
                       for k in sorted(set(va) | set(vb)) if va.get(k) != vb.get(k)}
    differs = any(r["status"] not in ("same", "within") for r in rows) or bool(header["semantics"])
    return {"schema": "sdpa_probe.golden-diff/1", "this": str(a), "other": str(b),
            "drift_fraction": drift, "differs": differs, "counts": count_statuses(rows),
            **header, "rows": rows}
