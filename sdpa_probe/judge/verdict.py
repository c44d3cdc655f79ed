"""Layered verdicts: output written after the call had returned first (a kernel's
thread still running: what the rest would judge is a moving target), then NaN/Inf
disagreement, then poison (unwritten output)
and guard (out-of-bounds write) violations, inputs written and a floating-point
environment left changed, then error against tolerance. (Two more layers, which
make more calls, live beside it: a passing call made again, the heap watched
for a leak and the answer judged once more (repeat.py); a failing one retried on
fresh copies of its inputs (fresh_inputs.py).)"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..cases import Case, judged_tolerance
from ..inputs import OutBuffer


@dataclasses.dataclass
class Verdict:
    status: str                 # pass | fail
    reason: str
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    nmse: float | None = None
    worst: tuple | None = None  # (batch, query row, head, dim)
    atol: float | None = None
    rtol: float | None = None
    torch_err: float | None = None
    convention: str | None = None  # judged under the backend's convention (convention.py)
    products: str | None = None  # the dtype its products round to (torch_err: torch's there)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["worst"] = list(self.worst) if self.worst is not None else None
        return d


def _where(idx) -> str:
    b, i, h, *d = idx
    return f"b={b} q={i} h={h}" + (f" d={d[0]}" if d else "")


def error_figures(out: np.ndarray, ref: np.ndarray) -> dict:
    """max abs / max rel error, NMSE and the worst element over finite entries."""
    err = np.abs(out - ref)
    err = np.where(np.isfinite(err), err, 0.0)
    worst = tuple(int(x) for x in np.unravel_index(int(np.argmax(err)), err.shape)) \
        if err.size else None
    denom = float(np.sum(ref * ref))
    nmse = float(np.sum(err * err)) / denom if denom > 0 else float(np.sum(err * err))
    rel = err / np.maximum(np.abs(ref), 1e-6)
    return {"max_abs_err": float(err.max()) if err.size else 0.0,
            "max_rel_err": float(rel.max()) if rel.size else 0.0, "nmse": nmse, "worst": worst}


def inputs_in_words(written: list[tuple[str, int]]) -> str:
    """InputGuard.written() as a reason says it: 'Q (3 elements), K (1 elements)'."""
    return ", ".join(f"{name} ({n} elements)" for name, n in written)


def judge(case: Case, ref: np.ndarray, out: OutBuffer, torch_err: float | None = None,
          inputs_written: list[tuple[str, int]] | None = None,
          fp_changed: str | None = None, caller_changed: list[str] | None = None,
          products: str | None = None) -> Verdict:
    out = out.snapshot()  # (every layer reads the same moment)
    vals = out.values()
    figs = error_figures(vals, ref)
    atol, rtol = judged_tolerance(case, torch_err, products)
    common = dict(atol=atol, rtol=rtol, torch_err=torch_err, products=products, **figs)

    # 0. the output changed after the call had returned (native calls: OutBuffer.at_return)
    n_late, at = out.written_after_return()
    if n_late:
        where = f"first at {_where(at)}" if at else "in the guard region around the output"
        return Verdict("fail", f"{n_late} output elements written after sdpa_forward had "
                       f"returned ({where}): a thread of the kernel still running when the "
                       "call returned (join or wait for every worker before returning)",
                       **common)

    # 1. NaN / Inf where the reference is finite, or the reverse
    out_bad = ~np.isfinite(vals)
    ref_bad = ~np.isfinite(ref)
    mismatch = out_bad != ref_bad
    if mismatch.any():
        rows = mismatch.any(axis=-1)                       # [B, Lq, H]
        first = tuple(int(x) for x in np.argwhere(rows)[0])
        n_rows = int(rows.sum())
        kind = "NaN" if np.isnan(vals[mismatch]).any() else "Inf"
        if ref_bad[mismatch].all():
            msg = f"finite output where the reference is NaN/Inf in {n_rows} rows"
        else:
            msg = f"{kind} in {n_rows} of {rows.size} output rows where the reference is finite"
            zero_rows = (ref == 0).all(axis=-1) & rows
            if zero_rows.any():
                msg += f" ({int(zero_rows.sum())} of them fully masked rows: reference is zeros)"
        return Verdict("fail", f"{msg}; first at {_where(first)}", **common)

    # 2. poison left in the output, guard bytes changed around it, inputs written
    n_poison, at = out.poison_count()
    if n_poison:
        return Verdict("fail", f"{n_poison} output elements never written (poison left), "
                               f"first at {_where(at)}", **common)
    n_guard, off = out.guard_violations()
    if n_guard:
        return Verdict("fail", f"out-of-bounds write: {n_guard} guard elements around the output "
                               f"changed (first at arena element {off})", **common)
    if inputs_written:  # (the output may still be right: the caller's tensors are not)
        what = inputs_in_words(inputs_written)
        cache = any(name[0] in "KV" for name, _ in inputs_written)
        return Verdict("fail", f"wrote into its inputs, which are read-only: {what} changed"
                       + ("; a KV cache written so is wrong for the next decode step"
                          if cache else ""), **common)
    if fp_changed:  # (the output may be right; the caller's arithmetic after the call is not)
        return Verdict("fail", "changed the calling thread's floating-point environment and "
                       f"did not restore it: {fp_changed}", **common)
    if caller_changed:  # (caller_state: the thread and process the kernel was called from)
        return Verdict("fail", "left its caller changed (a runtime calls it from its own "
                       "thread, every layer and token): " + "; ".join(caller_changed), **common)

    # 3. error against tolerance
    err = np.abs(vals - ref)
    err = np.where(np.isfinite(err), err, 0.0)
    excess = err - (atol + rtol * np.abs(np.where(np.isfinite(ref), ref, 0.0)))
    if (excess > 0).any():
        idx = tuple(int(x) for x in np.unravel_index(int(np.argmax(excess)), excess.shape))
        n_bad = int((excess > 0).sum())
        msg = (f"error above tolerance at {n_bad} elements: worst |err| {err[idx]:.3g} at "
               f"{_where(idx)} (out {vals[idx]:.6g}, ref {ref[idx]:.6g}; "
               f"tol {atol:.2g} + {rtol:.2g}*|ref|)")
        if torch_err is not None:
            own = f"own {products.upper()} error" if products else "own error"
            msg += f"; torch's {own} here: {torch_err:.3g}"
        return Verdict("fail", msg, **common)
    return Verdict("pass", "", **common)


def error_map(out: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Max |err| per (query row, head), over batch and dim; NaN marks non-finite output."""
    err = np.abs(out - ref)
    bad = ~np.isfinite(out)
    err = np.where(bad, np.nan, err)
    with np.errstate(invalid="ignore"):
        m = np.nanmax(np.where(np.isnan(err), -1.0, err), axis=(0, 3))
    m = np.where(bad.any(axis=(0, 3)), np.nan, m)
    return m
