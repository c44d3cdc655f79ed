"""Where a NaN came from and where it went: the input elements that hold one, the output
rows each should reach under the ABI's semantics, and the rows it did reach."""

from __future__ import annotations

import numpy as np

from ..cases import Case
from .counterfactual import Setting, reachable

MAX_SITES = 4   # input elements named one by one
MAX_GROUPS = 3  # (batch, heads, rows) groups a row set is told in


def spans(values) -> str:
    """Sorted ints as ranges: '0-3, 7, 9-10'."""
    xs = sorted(set(int(x) for x in values))
    out, start = [], None
    for a, b in zip(xs, xs[1:] + [None], strict=True):
        start = a if start is None else start
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = None
    return ", ".join(out)


def rows_in_words(rows: np.ndarray) -> str:
    """A bool [B, Lq, H] row set as 'b0 heads 0-3, query rows 0-3; ...'."""
    n = int(rows.sum())
    if n == 0:
        return "no rows"
    parts = []
    for b in np.flatnonzero(rows.any(axis=(1, 2)))[:MAX_GROUPS]:
        r = rows[b]
        qs, hs = np.flatnonzero(r.any(axis=1)), np.flatnonzero(r.any(axis=0))
        whole = r[np.ix_(qs, hs)].all()
        parts.append(f"b{b} query rows {spans(qs)} x heads {spans(hs)}"
                     + ("" if whole else " (not every pair)"))
    more = int(rows.any(axis=(1, 2)).sum()) - MAX_GROUPS
    return f"{n} row{'s' if n != 1 else ''}: " + "; ".join(parts) + (
        f"; {more} more batches" if more > 0 else "")


def _sites(name: str, x: np.ndarray, limit: int) -> list[tuple[str, tuple]]:
    """(tensor name, (b, pos, head, d)) of x's non-finite elements at positions < limit."""
    bad = ~np.isfinite(x[:, :limit])
    return [(name, tuple(int(i) for i in idx)) for idx in np.argwhere(bad)]


def _reach(site: tuple[str, tuple], truth: Setting, case: Case) -> np.ndarray:
    """bool [B, Lq, H]: the output rows the element reaches under the ABI's semantics."""
    name, (b, j, h, _d) = site
    rows = np.zeros((case.batch, case.q_len, case.n_heads), dtype=bool)
    if name == "Q":
        rows[b, j, h] = True
        return rows
    keys = reachable(truth, case.q_len, case.kv_len)[:, j]             # [Lq]
    heads = truth.kv_head == h                                          # [H]
    rows[b] = keys[:, None] & heads[None, :]
    return rows


def nan_trace(case: Case, truth: Setting, ref: np.ndarray, out: np.ndarray) -> list[str]:
    """Lines: each NaN / Inf input element (K and V up to the keys some row sees; stale
    slots past them are told apart), the rows it should reach and how many of them your
    output has non-finite, then the rows non-finite where the reference is finite."""
    reach = case.keys_in_reach
    sites = (_sites("Q", truth.q, case.q_len) + _sites("K", truth.k, reach)
             + _sites("V", truth.v, reach))
    out_bad = ~np.isfinite(out).all(axis=-1)
    ref_bad = ~np.isfinite(ref).all(axis=-1)
    tokens: dict[tuple, list[int]] = {}  # (an int8 token's NaN scale: all its elements)
    for name, (b, j, h, d) in sites:
        tokens.setdefault((name, b, j, h), []).append(d)
    lines = []
    for (name, b, j, h), ds in list(tokens.items())[:MAX_SITES]:
        rows = _reach((name, (b, j, h, ds[0])), truth, case)
        where = f"b={b} pos={j} {'head' if name == 'Q' else 'kv head'}={h} d={spans(ds)}"
        lines.append(f"{name}[{where}] holds {truth_value(truth, (name, (b, j, h, ds[0])))}: "
                     f"it should reach {rows_in_words(rows)}; your output is NaN/Inf in "
                     f"{int((rows & out_bad).sum())} of them")
    if len(tokens) > MAX_SITES:
        lines.append(f"... and {len(tokens) - MAX_SITES} more input tokens holding NaN/Inf")
    stale = case.causal and reach < case.kv_len and not np.isfinite(truth.k[:, reach:]).all()
    if stale:
        lines.append(f"K and V slots {reach}..{case.kv_len - 1} hold NaN on purpose: stale "
                     "cache slots past every row's causal edge, which no row may read")
    missing, extra = ref_bad & ~out_bad, out_bad & ~ref_bad
    if missing.any():
        lines.append(f"finite where the reference is NaN/Inf: {rows_in_words(missing)}")
    if extra.any():
        lines.append(f"NaN/Inf where the reference is finite: {rows_in_words(extra)}")
    return lines


def truth_value(truth: Setting, site: tuple[str, tuple]) -> str:
    name, idx = site
    x = {"Q": truth.q, "K": truth.k, "V": truth.v}[name][idx]
    return "NaN" if np.isnan(x) else ("+Inf" if x > 0 else "-Inf")
