"""How `probe check` shows its records on a terminal: the family x backend table, the
failures (a table on a wide console, a list on a narrow one, one entry per kind of
failure) and the case list of --list."""

from __future__ import annotations

import math
import re

from rich.console import Group
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from ..backends import parse
from ..cases import Case, tolerance
from ..records import FAILING, Record
from ..report import by_backend_family, summary
from ..tables import Col, Sheet, command_lines, fit, markdown
from .output import Output

STATUS_STYLE = {"pass": "green", "fail": "red", "crash": "bold red", "timeout": "magenta",
                "unsupported": "dim", "error": "yellow"}


def _fmt(x, spec=".2e") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return format(x, spec)


def _cell(c) -> str:
    run = sum(c.values()) - c.get("unsupported", 0)
    bad = sum(c.get(s, 0) for s in FAILING)
    if run == 0:
        return "[dim]-[/]"
    return f"[red]{run - bad}/{run} ✗[/]" if bad else f"[green]{run}/{run}[/]"


def summary_tables(records: list[Record], names: list[str], width: int = 80) -> list[Table]:
    """Case families down, backends across; a cell counts passes over supported cases.
    Backends that do not fit the console's width go on to a table of their own below,
    with the families again (a cell never wraps)."""
    backends = [n for n in names if any(r.backend == n for r in records)]
    cells = by_backend_family(records)
    families = list(dict.fromkeys(r.family for r in records))
    fam_w = max((len(f) for f in families), default=6) + 3
    chunks: list[list[str]] = [[]]
    used = fam_w + 1
    for b in backends:
        w = max(len(parse(b).label), 7) + 3  # ("10/12 ✗" and the cell's padding)
        if chunks[-1] and used + w > width:
            chunks.append([])
            used = fam_w + 1
        chunks[-1].append(b)
        used += w
    tables = []
    for chunk in chunks:
        t = Table()
        t.add_column("family", style="bold", no_wrap=True)
        for b in chunk:
            t.add_column(parse(b).label, justify="center", no_wrap=True)
        for fam in families:
            t.add_row(fam, *(_cell(cells[(b, fam)]) if (b, fam) in cells else ""
                             for b in chunk))
        tables.append(t)
    return tables


# Below this console width the failures print as a list: in a table their reasons
# wrap into a narrow column a word or two wide (a CI log is 80 columns)
WIDE_FAILURES = 140


# A reason with its figures (errors, positions, counts) masked: failures that read the
# same but for them are one bug seen on many cases
_FIGURES = re.compile(r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:e[-+]?\d+)?")
GROUP_AT = 3     # this many failures of one reason and backend print as one
GROUP_IDS = 8    # the other cases' ids shown under it


def group_failures(records: list[Record],
                   grouped: bool = True) -> list[tuple[Record, list[Record]]]:
    """The failing records as (the first of a kind, the others of that kind), in order:
    a kind is a backend, a status and a reason the same but for its figures; kinds with
    fewer than GROUP_AT members (or every kind, if not grouped) stay one record each."""
    failing = [r for r in records if r.status in FAILING]
    if not grouped:
        return [(r, []) for r in failing]
    kinds: dict[tuple, list[Record]] = {}
    for r in failing:
        key = (r.backend, r.status, _FIGURES.sub("#", r.reason or ""))
        kinds.setdefault(key, []).append(r)
    out: list[tuple[Record, list[Record]]] = []
    for members in kinds.values():
        if len(members) >= GROUP_AT:
            out.append((members[0], members[1:]))
        else:
            out += [(r, []) for r in members]
    order = {id(r): i for i, r in enumerate(failing)}
    return sorted(out, key=lambda g: order[id(g[0])])


def _more(others: list[Record]) -> str:
    ids = [r.case for r in others[:GROUP_IDS]]
    rest = len(others) - len(ids)
    return (f"and {len(others)} more failing the same way (figures aside): "
            + ", ".join(ids) + (f", ... ({rest} more; --each-failure or --json lists them)"
                                if rest else ""))


def failure_list(records: list[Record], width: int = 80, grouped: bool = True) -> Group:
    """Each failure as a status / case / backend line, its reason indented (free to wrap
    at the console's width; an error's figures are in it) and its repro command. A
    backend that does not fit on the case's line (a long path to your kernel) goes on a
    line of its own, indented, rather than wrapping to the margin. grouped: one entry
    per kind of failure (group_failures), the others' ids under it."""
    lines: list = [Text("failures", style="bold")]
    for r, others in group_failures(records, grouped):
        st = r.status
        head = Text.assemble((f"{st:<8}", STATUS_STYLE[st]), r.case)
        backend = Text(r.backend, style="bold")
        if 8 + len(r.case) + 2 + len(r.backend) <= width:
            lines.append(Text.assemble(head, "  ", backend))
        else:
            lines += [head, Padding(backend, (0, 0, 0, 8))]
        lines.append(Padding(Text(r.reason), (0, 0, 0, 8)))
        # (a path longer than the line folds: never cropped)
        lines += [Text(ln, style="dim", overflow="fold") for ln in command_lines(r.repro, width, 8)]
        if others:
            lines.append(Padding(Text(_more(others), style="yellow"), (0, 0, 0, 8)))
    return Group(*lines)


def failure_table(records: list[Record], grouped: bool = True) -> Sheet:
    t = Sheet([Col("backend", "id", style="bold"), Col("case", "id"), Col("status", "id"),
               Col("max abs err"), Col("nmse"), Col("reason / reproduce", "text", least=40)],
              title="failures")
    for r, others in group_failures(records, grouped):
        st = r.status
        more = f"\n[yellow]{_more(others)}[/]" if others else ""
        t.add_row(r.backend, r.case, f"[{STATUS_STYLE[st]}]{st}[/]",
                  _fmt(r.max_abs_err), _fmt(r.nmse),
                  f"{escape(r['reason'] or '')}\n[dim]{escape(r['repro'])}[/]{more}")
    return t


def _failure_table_fits(sheet: Sheet, records: list[Record], width: int) -> bool:
    """Whether the failure table fits width with every repro command on one line of
    its reason column (else the list form shows them)."""
    if width < WIDE_FAILURES:
        return False
    f = fit(sheet, width)
    longest = max((len(r.repro) for r in records if r.status in FAILING), default=0)
    return not f.stacked and not f.dropped and f.widths[len(sheet.cols) - 1] >= longest


def list_cases(out: Output, cases: list[Case], json_path: str | None) -> list[dict]:
    """The selected cases, one a line: id, tolerance, FLOPs and bytes (--json: all of a
    case's parameters too)."""
    # (an invalid call is judged on its status: no tolerance)
    rows = [dict(id=c.id, family=c.family, atol=atol, rtol=rtol, flops=c.flops,
                 bytes=c.bytes, params=c.params())
            for c, (atol, rtol) in ((c, tolerance(c) if c.needs_reference else (None, None))
                                    for c in cases)]
    if json_path:
        out.write_json(json_path, {"cases": rows})
    if json_path != "-":  # plain lines, never folded: the ids are for copying into -k
        for line in _case_lines(rows, out.width):
            out.print(line, soft_wrap=True, markup=False, highlight=False)
    return rows


def _case_lines(rows: list[dict], width: int) -> list[str]:
    """The id column and as many figure columns as fit width (bytes leave first, then
    FLOPs, rtol, atol); an id is never cut."""
    cols = [("atol", [("-" if r["atol"] is None else f"{r['atol']:.2g}") for r in rows]),
            ("rtol", [("-" if r["rtol"] is None else f"{r['rtol']:.2g}") for r in rows]),
            ("FLOPs", [f"{r['flops']:,}" for r in rows]),
            ("bytes", [f"{r['bytes']:,}" for r in rows])]
    w = max((len(r["id"]) for r in rows), default=2)
    sizes = [max(len(h), *(len(c) for c in cells)) for h, cells in cols]
    while cols and w + sum(2 + s for s in sizes) > width:
        cols, sizes = cols[:-1], sizes[:-1]
    lines = ["  ".join([f"{'id':<{w}}"] + [f"{h:>{s}}" for (h, _), s in zip(cols, sizes,
                                                                          strict=True)])]
    for i, r in enumerate(rows):
        lines.append("  ".join([f"{r['id']:<{w}}"] + [f"{c[i]:>{s}}" for (_, c), s in
                                                      zip(cols, sizes, strict=True)]))
    return [*lines, f"{len(rows)} cases"]


def cases_markdown(rows: list[dict]) -> str:
    """--list --format md: the case list as a Markdown table."""
    t = Sheet([Col("id", "id"), Col("atol"), Col("rtol"), Col("FLOPs"), Col("bytes")])
    for r in rows:
        tol = ("-", "-") if r["atol"] is None else (f"{r['atol']:.2g}", f"{r['rtol']:.2g}")
        t.add_row(r["id"], *tol, f"{r['flops']:,}", f"{r['bytes']:,}")
    return "# probe check --list\n\n" + markdown(t)


def unrepeatable_notes(records: list[Record]) -> list[str]:
    """Per backend, the passing cases whose repeated call gave another answer bit for
    bit (both within tolerance): not a failure, but a result that follows thread
    timing (a reduction or merge order) is one a user cannot reproduce exactly."""
    by: dict[str, list[str]] = {}
    for r in records:
        if r.get("repeatable") is False:
            by.setdefault(r.backend, []).append(r.case)
    return [f"{b}: {len(ids)} passing case(s) gave another answer, bit for bit, when the "
            f"same call was repeated (both within tolerance; e.g. {ids[0]}): a result that "
            "follows thread timing, such as a reduction or merge order"
            for b, ids in by.items()]




def show_result(out: Output, res, names: list[str], each_failure: bool) -> None:
    """The summary table, the failures, the counts line and the notes."""
    records = res.records
    # (the title on a line of its own: a narrow table would fold it)
    out.print("probe check: case family x backend (passed / run; - unsupported)",
              style="bold")
    for table in summary_tables(records, names, out.width):
        out.print(table)
    if any(r.status in FAILING for r in records):
        sheet = failure_table(records, not each_failure)
        if _failure_table_fits(sheet, records, out.width):
            out.table(sheet)
        else:
            out.print(failure_list(records, out.width, not each_failure))
    s = summary(records)
    parts = [f"[{STATUS_STYLE[k]}]{s[k]} {k}[/]" for k in STATUS_STYLE if s[k]]
    extra = sum(r.family == "cache-sizing" for r in records)
    what = f"{len(res.cases)} cases x {len(names)} backends" + (
        f" + {extra} cache-sizing" if extra else "")
    out.print(f"{s['total']} checks ({what}) in {res.seconds:.1f} s: " + ", ".join(parts))
    for note in unrepeatable_notes(records):
        out.warn(note)
    if res.golden is not None:
        skipped = ("; the cache-sizing suite, which has no golden data, was not run"
                   if res.document["suite"] == "default" else "")
        out.print(f"[dim]references: golden data in {res.golden.root} (made with torch "
                  f"{res.golden.manifest['versions'].get('torch')}){skipped}[/]")
