"""Charts of a context sweep: per-op (or per-kind) median time against context, one
series per op, one panel per attention graph on a shared time axis. Drawn as text for
the terminal (Rich) and written as a standalone SVG (no plotting library)."""

from __future__ import annotations

import math
import textwrap
from xml.sax.saxutils import escape, quoteattr

from rich.console import Group
from rich.text import Text

from .provenance import build_line, machine_line

# Okabe-Ito and Tableau-like colours, distinguishable on light and dark backgrounds
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#B8860B",
           "#7F7F7F", "#8C564B", "#17BECF", "#BCBD22", "#9467BD"]
MARKERS = "●■▲◆✚★○□△◇"
DEFAULT_TOP = 6


def series(doc: dict, by: str = "op", top: int = DEFAULT_TOP) -> dict[str, list[dict]]:
    """Per attention graph: the top series (by time at the largest context), each
    {"name", "kind", "points": [(context, ms), ...]}. by: "op" or "kind"."""
    out: dict[str, list[dict]] = {}
    sweep = doc.get("sweep") or []
    if not sweep:
        return out
    for label in doc["attention"]:
        rows: dict[str, dict] = {}
        for entry in sweep:
            sm = entry["runs"][label]
            items = sm["ops"] if by == "op" else sm["kinds"]
            for it in items:
                name = it["name"] if by == "op" else it["kind"]
                r = rows.setdefault(name, {"name": name, "kind": it.get("kind", name),
                                           "points": []})
                r["points"].append((entry["context"], float(it["median_ms"])))
        last = sweep[-1]["context"]

        def at_last(r: dict, last=last) -> float:
            return next((ms for c, ms in r["points"] if c == last), 0.0)

        out[label] = sorted(rows.values(), key=lambda r: -at_last(r))[:max(1, top)]
    return out


def colours(panels: dict[str, list[dict]]) -> dict[str, int]:
    """One palette index per series name, the same in every panel."""
    idx: dict[str, int] = {}
    for rows in panels.values():
        for r in rows:
            idx.setdefault(r["name"], len(idx))
    return idx


def nice_ticks(hi: float, n: int = 5) -> list[float]:
    """0 .. >= hi in about n steps of 1, 2, 2.5 or 5 x 10^k."""
    if not (hi > 0 and math.isfinite(hi)):
        return [0.0, 1.0]
    raw = hi / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    k = math.ceil(hi / step - 1e-9)
    return [i * step for i in range(k + 1)]


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 1:
        return f"{v:.4g}"
    return f"{v:.3g}"


def _bounds(panels: dict[str, list[dict]]) -> tuple[float, float, float]:
    xs = [c for rows in panels.values() for r in rows for c, _ in r["points"]]
    ys = [ms for rows in panels.values() for r in rows for _, ms in r["points"]]
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x1 = x0 + 1
    return x0, x1, nice_ticks(max(ys) if ys else 1.0)[-1]


def _slope(points: list[tuple[int, float]]) -> float:
    if len({c for c, _ in points}) < 2:
        return float("nan")
    n = len(points)
    mx = sum(c for c, _ in points) / n
    my = sum(m for _, m in points) / n
    sxx = sum((c - mx) ** 2 for c, _ in points)
    return 1000.0 * sum((c - mx) * (m - my) for c, m in points) / sxx


# ---- terminal ---------------------------------------------------------------------

def text_chart(doc: dict, by: str = "op", top: int = DEFAULT_TOP, width: int = 64,
               height: int = 14) -> Group:
    """Rich renderable: one character-grid panel per graph, markers at the measured
    contexts joined by dotted lines, a legend with the value at the largest context."""
    panels = series(doc, by, top)
    if not panels:
        return Group()
    cidx = colours(panels)
    x0, x1, ymax = _bounds(panels)
    width, height = max(width, 16), max(height, 6)
    parts = []
    for label, rows in panels.items():
        grid = [[(" ", None)] * width for _ in range(height)]

        def cell(c: float, ms: float) -> tuple[int, int]:
            col = round((c - x0) / (x1 - x0) * (width - 1))
            row = height - 1 - round(min(ms, ymax) / ymax * (height - 1))
            return row, col

        for r in reversed(rows):  # the biggest series drawn last, on top
            colour = PALETTE[cidx[r["name"]] % len(PALETTE)]
            pts = sorted(r["points"])
            for (ca, ya), (cb, yb) in zip(pts, pts[1:], strict=False):
                (ra, ka), (rb, kb) = cell(ca, ya), cell(cb, yb)
                steps = max(abs(kb - ka), abs(rb - ra), 1)
                for i in range(1, steps):
                    rr = round(ra + (rb - ra) * i / steps)
                    kk = round(ka + (kb - ka) * i / steps)
                    if grid[rr][kk][0] == " ":
                        grid[rr][kk] = ("·", colour)
            marker = MARKERS[cidx[r["name"]] % len(MARKERS)]
            for c, ms in pts:
                rr, kk = cell(c, ms)
                grid[rr][kk] = (marker, colour)
        title = (f"{label}: median ms per step of the top {len(rows)} "
                 f"{'ops' if by == 'op' else 'op kinds'} by context")
        lines = [Text(title, style="bold")]
        ylab = {0: _fmt(ymax), height // 2: _fmt(ymax / 2), height - 1: "0"}
        for i, gr in enumerate(grid):
            t = Text(f"{ylab.get(i, ''):>9} ┤" if i in ylab else " " * 10 + "│")
            for ch, colour in gr:
                t.append(ch, style=colour)
            lines.append(t)
        axis = Text(" " * 10 + "└" + "─" * width)
        lines.append(axis)
        ctxs = sorted({c for r in rows for c, _ in r["points"]})
        lab = [" "] * (width + 12)
        for c in ctxs:
            s = str(c)
            col = 11 + round((c - x0) / (x1 - x0) * (width - 1))
            start = min(max(col - len(s) // 2, 11), width + 11 - len(s))
            if all(ch == " " for ch in lab[max(start - 1, 0):start + len(s) + 1]):
                lab[start:start + len(s)] = list(s)
        lines.append(Text("".join(lab).rstrip() + "   context (tokens)"))
        for r in rows:
            colour = PALETTE[cidx[r["name"]] % len(PALETTE)]
            t = Text(" " * 10)
            t.append(f"{MARKERS[cidx[r['name']] % len(MARKERS)]} ", style=colour)
            last = max(r["points"])[1]
            t.append(f"{r['name']:<14} {last:9.3f} ms at {max(ctxs)}, "
                     f"{_slope(r['points']):+.3f} ms / 1k tokens")
            lines.append(t)
        lines.append(Text(""))
        parts.extend(lines)
    return Group(*parts)


# ---- SVG --------------------------------------------------------------------------

PANEL_W, PANEL_H = 900, 380
PLOT_L, PLOT_R, PLOT_T, PLOT_B = 76, 250, 44, 56  # margins inside a panel (legend right)


def svg_chart(doc: dict, by: str = "op", top: int = DEFAULT_TOP,
              header: list[str] | None = None) -> str:
    """A standalone SVG: header lines, then one panel per graph; each series is a
    <polyline class="series" data-op=...> with a <circle> per measured context."""
    panels = series(doc, by, top)
    if not panels:
        raise ValueError("no context sweep to chart")
    cidx = colours(panels)
    x0, x1, ymax = _bounds(panels)
    yt = nice_ticks(ymax)
    ctxs = sorted({c for rows in panels.values() for r in rows for c, _ in r["points"]})
    xt = ctxs if len(ctxs) <= 12 else [x0 + (x1 - x0) * i / 8 for i in range(9)]
    header = header or []
    top_h = 16 + 18 * len(header)
    H = top_h + PANEL_H * len(panels)
    pw, ph = PANEL_W - PLOT_L - PLOT_R, PANEL_H - PLOT_T - PLOT_B
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{PANEL_W}" height="{H}" '
         f'viewBox="0 0 {PANEL_W} {H}" font-family="DejaVu Sans, Helvetica, Arial, '
         f'sans-serif" font-size="12">',
         f"<title>{escape('probe profile: time per op against context')}</title>",
         f'<rect width="{PANEL_W}" height="{H}" fill="#ffffff"/>']
    for i, line in enumerate(header):
        o.append(f'<text class="header" x="12" y="{20 + 18 * i}" fill="#333" font-size="11">'
                 f"{escape(line)}</text>")
    for p, (label, rows) in enumerate(panels.items()):
        oy = top_h + p * PANEL_H
        L, T = PLOT_L, oy + PLOT_T

        def X(c: float, L=L) -> float:
            return L + (c - x0) / (x1 - x0) * pw

        def Y(ms: float, T=T) -> float:
            return T + ph - min(ms, ymax) / ymax * ph

        o.append(f'<g class="panel" data-attention={quoteattr(label)}>')
        what = "ops" if by == "op" else "op kinds"
        o.append(f'<text x="{L}" y="{oy + 26}" font-size="15" font-weight="bold">'
                 f"{escape(label)}: median ms per step of the top {len(rows)} {what}</text>")
        for v in yt:
            y = Y(v)
            o.append(f'<line x1="{L}" y1="{y:.1f}" x2="{L + pw}" y2="{y:.1f}" '
                     'stroke="#e4e4e4"/>')
            o.append(f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(v)}</text>')
        for c in xt:
            x = X(c)
            o.append(f'<line x1="{x:.1f}" y1="{T + ph}" x2="{x:.1f}" y2="{T + ph + 5}" '
                     'stroke="#444"/>')
            o.append(f'<text x="{x:.1f}" y="{T + ph + 19}" text-anchor="middle">'
                     f"{_fmt(c)}</text>")
        o.append(f'<path d="M{L},{T} V{T + ph} H{L + pw}" fill="none" stroke="#444"/>')
        o.append(f'<text x="{L + pw / 2:.1f}" y="{T + ph + 40}" text-anchor="middle">'
                 "context (cached tokens)</text>")
        o.append(f'<text transform="translate({L - 52},{T + ph / 2:.1f}) rotate(-90)" '
                 'text-anchor="middle">ms per step</text>')
        for j, r in enumerate(rows):
            colour = PALETTE[cidx[r["name"]] % len(PALETTE)]
            pts = sorted(r["points"])
            xy = " ".join(f"{X(c):.1f},{Y(ms):.1f}" for c, ms in pts)
            name = quoteattr(r["name"])
            o.append(f'<g class="series-group" data-op={name}>')
            o.append(f'<polyline class="series" data-op={name} points="{xy}" fill="none" '
                     f'stroke="{colour}" stroke-width="2"/>')
            for c, ms in pts:
                o.append(f'<circle cx="{X(c):.1f}" cy="{Y(ms):.1f}" r="3.5" fill="{colour}">'
                         f"<title>{escape(r['name'])} @ {c}: {ms:.3f} ms</title></circle>")
            o.append("</g>")
            ly = T + 8 + 20 * j
            lx = L + pw + 18
            o.append(f'<g class="legend-entry" data-op={name}>'
                     f'<line x1="{lx}" y1="{ly}" x2="{lx + 22}" y2="{ly}" stroke="{colour}" '
                     f'stroke-width="3"/><text x="{lx + 28}" y="{ly + 4}">{escape(r["name"])} '
                     f"({_slope(pts):+.2f} ms/1k)</text></g>")
        o.append("</g>")
    o.append("</svg>")
    return "\n".join(o) + "\n"


def header_lines(doc: dict) -> list[str]:
    """Setup, machine and builds for the SVG's top lines."""
    m = doc["model"]
    lines = [f"decode step: {m['name']} ({m['layers']} layers, hidden {m['hidden']}, "
             f"{m['heads']}/{m['kv_heads']} heads x {m['head_dim']}, ffn {m['ffn']}, vocab "
             f"{m['vocab']}) | weights {doc['weights']} | cache {doc['cache']} | "
             f"{doc['steps']} steps per point"]
    ml = machine_line(doc)
    if ml:
        lines.append(ml)
    by_build: dict[str, list[str]] = {}
    for label in doc["attention"]:
        bl = build_line(doc, label)
        if bl:
            by_build.setdefault(bl, []).append(label)
    for bl, labels in by_build.items():
        lines.append(f"{', '.join(labels)}: {bl}")
    out = []
    for line in lines:  # the SVG does not wrap text
        out.extend(textwrap.wrap(line, 130, subsequent_indent="    ", break_on_hyphens=False))
    return out
