"""`probe check --repro CASE_ID` on the terminal: each backend's verdict, the worst
element and an error map over (query row x head), and the JSON document; the work is
check.repro.reproduce's."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from rich.table import Table
from rich.text import Text

from .. import tables
from ..check.repro import Repro, reproduce
from ..tables import Col, Sheet
from .formats import deliver
from .output import Output

# error relative to the case's tolerance, darkest = beyond it
SHADES = [(0.01, " "), (0.1, "·"), (0.5, "░"), (1.0, "▒"), (10.0, "▓"), (math.inf, "█")]


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
    """Reproduce and show; 1 if a backend failed the case. With json_path, the same as
    one JSON document (check.repro.REPRO_SCHEMA)."""
    rep = reproduce(case_id, names, timeout=timeout, seed=seed, setup=setup, after=after,
                    save=save, force=force)
    show_repro(out, rep)
    doc = rep.document()
    if json_path:
        out.write_json(json_path, doc)
    deliver(out, out.fmt, out.output, "repro", doc, lambda: doc["records"],
            lambda: "# probe check --repro\n\n" + tables.markdown(_verdicts(rep)))
    return rep.exit_code


def _verdicts(rep: Repro) -> Sheet:
    t = Sheet([Col("backend", "id"), Col("case", "id"), Col("status", "id"),
               Col("max abs err"), Col("reason", "text")])
    for r in rep.records:
        err = r.get("max_abs_err")
        t.add_row(r.backend, rep.case.id, r.status, "-" if err is None else f"{err:.3e}",
                  r.reason or "")
    return t


def show_repro(out: Output, rep: Repro) -> None:
    for r in rep.ran_first:
        out.print(f"ran first: {r.backend} on {r.case}: {r.status}")
    for r in rep.records:
        out.print(f"[bold]{r.backend}[/] on [bold]{rep.case.id}[/]: {r.status}"
                  + (f" - {r.reason}" if r.reason else ""))
        d = rep.details.get(r.backend)
        if d is None:
            continue
        full, vals, ref = d.record, d.values, d.reference
        t = Table(show_header=False, box=None)
        t.add_row("max abs err", f"{full.max_abs_err:.3e}")
        t.add_row("max rel err", f"{full.max_rel_err:.3e}")
        t.add_row("nmse", f"{full.nmse:.3e}")
        t.add_row("tolerance", f"{full.atol:.2e} + {rep.rtol:.1e} * |ref|")
        if full.worst is not None:
            b, i, h, k = full.worst
            t.add_row("worst element", f"b={b} q={i} h={h} d={k}: out {vals[b, i, h, k]:.6g}, "
                                       f"ref {ref[b, i, h, k]:.6g}")
        out.print(t)
        out.print(render_map(d.error_map, full.atol or rep.atol))
    if rep.saved:
        out.print("saved: " + ", ".join(str(p) for p in rep.saved))
