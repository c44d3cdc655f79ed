"""A wrong output compared with every nearby semantics that applies to its case; a
match is claimed only where the counterfactual oracle matches within the case's
tolerance and the true oracle does not. Bounded: only failures are diagnosed, only
cases small enough, and only for DIAGNOSIS_SECONDS."""

from __future__ import annotations

import time

import numpy as np

from ..cases import Case
from .counterfactual import attend, matches, true_setting
from .hypotheses import HYPOTHESES, Context, Hypothesis
from .nan_trace import nan_trace

# multiply-adds of one counterfactual oracle above which a case is not diagnosed (some
# 30 of them run: a few seconds on one core at this size)
DIAGNOSIS_MAX_MACS = 2e8
DIAGNOSIS_SECONDS = 10.0
# seconds a check worker spends diagnosing one backend's failures, all told: a kernel
# that fails hundreds of cases is diagnosed on its first ones, and --repro on the rest
WORKER_DIAGNOSIS_SECONDS = 30.0


def undiagnosed(note: str) -> dict:
    """A diagnosis that could not be made, and why."""
    return {"matches": [], "tried": [], "nan_only": [], "nan": [], "note": note}


def _macs(case: Case) -> int:
    return 2 * case.batch * case.n_heads * case.q_len * case.kv_len * case.head_dim


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


def _evidence(out: np.ndarray, pred: np.ndarray, truth: np.ndarray, atol: float,
              rtol: float) -> bool:
    """Whether a matching hypothesis is told apart from the truth by more than NaN: an
    element finite in your output and the hypothesis's where the truth is not or differs
    beyond tolerance, or NaN in some rows and not others, unlike the truth. (An all-NaN
    output matches any semantics that reads a NaN in every row; the NaN trace is what
    explains it.)"""
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(out) & np.isfinite(pred)
        apart = ~np.isfinite(truth) | (np.abs(pred - truth) > atol + rtol * np.abs(truth))
    if (finite & apart).any():
        return True
    bad = ~np.isfinite(out)
    return bool(bad.any() and not bad.all() and (bad != ~np.isfinite(truth)).any())


def claim(h: Hypothesis, case: Case, err: float, same_as: list[str]) -> dict:
    says = (f"your output equals the reference computed with {h.computed_with(case)} "
            f"(max err {err:.1g}): {h.meaning(case)}")
    if same_as:
        says += f" (on this case the same as: {', '.join(same_as)})"
    return {"hypothesis": h.name, "max_abs_err": err, "says": says, "same_as": same_as}


def _matching(case: Case, ctx: Context, out: np.ndarray, atol: float,
              rtol: float) -> tuple[list[dict], list[str], list[dict], str]:
    """The claims, the hypotheses tried (those whose oracle differs from the true one
    here), those matched by their NaN alone (no finite output to tell them apart) and a
    note if time ran out."""
    truth = attend(ctx.truth)
    t0, note = time.monotonic(), ""
    tried: list[str] = []
    found: list[tuple[Hypothesis, np.ndarray, float, list[str]]] = []
    nan_only: list[dict] = []
    for h in HYPOTHESES:
        if not h.applies(case):
            continue
        if time.monotonic() - t0 > DIAGNOSIS_SECONDS:
            note = f"cut short after {DIAGNOSIS_SECONDS:g} s"
            break
        pred = h.predict(ctx)
        if _same(pred, truth):  # (no different semantics on this case's inputs)
            continue
        tried.append(h.name)
        ok, err = matches(out, pred, atol, rtol)
        if not ok:
            continue
        if not _evidence(out, pred, truth, atol, rtol):
            nan_only.append({"hypothesis": h.name, "meaning": h.meaning(case)})
            continue
        twin = next((f for f in found if _same(f[1], pred)), None)
        if twin is not None:
            twin[3].append(h.name)
        else:
            found.append((h, pred, err, []))
    return [claim(h, case, err, same) for h, _p, err, same in found], tried, nan_only, note


def diagnose(case: Case, data, ref: np.ndarray, out: np.ndarray, atol: float,
             rtol: float) -> dict | None:
    """The diagnosis of a failing output `out` (float64, as the verdict read it) of `case`
    on its inputs `data` (CaseData) against the reference `ref`: {"matches": claims,
    "tried": hypothesis names, "nan_only": those whose NaN alone matches, "nan": lines,
    "note": why it is partial or skipped}."""
    if not case.needs_reference:
        return None
    if _macs(case) > DIAGNOSIS_MAX_MACS:
        return undiagnosed(f"not diagnosed: the case is too large for the nearby-semantics "
                           f"oracles ({_macs(case):.2g} multiply-adds each)")
    ctx = Context(case, true_setting(case, data), data.mask)
    right, _ = matches(out, ref, atol, rtol)
    found, tried, nan_only, note = (([], [], [], "") if right
                                    else _matching(case, ctx, out, atol, rtol))
    nan = []
    if case.mask == "nan-inputs" or not (np.isfinite(out).all() and np.isfinite(ref).all()):
        nan = nan_trace(case, ctx.truth, ref, out)
    return {"matches": found, "tried": tried, "nan_only": nan_only, "nan": nan, "note": note}


def diagnose_record(rec, case: Case, prep) -> None:
    """A failing record's diagnosis, from the output its call kept (rec.output) and the
    case's prepared inputs; none where the output judged is not of these inputs (a reused
    buffer's second call, another concurrent caller's)."""
    out = rec.output
    if (rec.status != "fail" or out is None or rec.reference is not None or case.reuse
            or prep.ref is None or rec.atol is None):
        return
    try:
        rec.diagnosis = diagnose(case, prep.data, prep.ref, out.values(), rec.atol, rec.rtol)
    except Exception as exc:  # (a diagnosis never costs the verdict)
        rec.diagnosis = undiagnosed(f"not diagnosed: {type(exc).__name__}: {exc}"[:200])


class DiagnosisBudget:
    """diagnose_record within WORKER_DIAGNOSIS_SECONDS per backend; past it a failure
    says where to get its diagnosis."""

    def __init__(self, seconds: float = WORKER_DIAGNOSIS_SECONDS):
        self.seconds = seconds
        self.spent: dict[str, float] = {}

    def diagnose(self, rec, case: Case, prep) -> None:
        if rec.status != "fail" or rec.output is None:
            return
        if self.spent.get(rec.backend, 0.0) > self.seconds:
            rec.diagnosis = undiagnosed("not diagnosed: this run's diagnosis time for the "
                                        "backend is spent (--repro diagnoses the case)")
            return
        t0 = time.monotonic()
        diagnose_record(rec, case, prep)
        self.spent[rec.backend] = self.spent.get(rec.backend, 0.0) + time.monotonic() - t0
