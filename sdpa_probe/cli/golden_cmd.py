"""`probe golden regen | verify | diff`: versioned float64 references that tests
and `probe check --golden` use without recomputing the oracle (docs/golden.md)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .. import golden
from . import app, command, typer_app
from .output import Output, path_option

golden_app = typer_app(
    "golden", "Golden data: stored float64 references for tests and `probe check --golden`.")
app.add_typer(golden_app, name="golden")

DIR_HELP = "The golden directory (default: $SDPA_PROBE_GOLDEN or the checkout's golden/)."
DRIFT_HELP = ("A reference counts as changed when an element moves by more than this fraction "
              "of the case's tolerance (atol + rtol*|ref|), 0 to 1.")
STATUS_STYLE = {"same": "green", "within": "green", "new": "cyan", "changed": "bold red",
                "only-this": "yellow", "only-other": "yellow", "unreadable": "bold red"}


def _command(name: str):
    return command(name, typer_app=golden_app)


def _progress(out: Output, title: str) -> Progress:
    return Progress(TextColumn(f"[bold]{title}[/]"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[last]}"), TimeElapsedColumn(), console=out.err,
                    transient=True)


def _fmt(x, spec=".3g") -> str:
    return "-" if x is None else format(x, spec)


def _print_rows(out: Output, title: str, rows: list[dict]) -> None:
    """One line per case (status, id, how far it moved), then its reasons indented."""
    out.print(f"[bold]{title}[/]")
    for r in rows:
        st = r["status"]
        line = f"[{STATUS_STYLE.get(st, '')}]{st:>10}[/]  {r['case']}"
        if r.get("max_abs_delta") is not None and st in ("same", "within", "changed"):
            line += (f"  max |delta| {_fmt(r['max_abs_delta'])} "
                     f"({_fmt(r.get('tol_fraction'))} x tolerance)")
        if "torch_err_old" in r and r["torch_err_old"] != r["torch_err_new"]:
            line += f"  torch_err {_fmt(r['torch_err_old'])} -> {_fmt(r['torch_err_new'])}"
        out.print(line, highlight=False)
        for why in r.get("reasons", []):
            out.print(f"{'':12}{why}", markup=False, highlight=False)


def _print_regen(out: Output, plan: golden.RegenPlan, dry_run: bool) -> None:
    shown = [r for r in plan.rows if r["status"] in ("changed", "within")]
    if shown:
        _print_rows(out, "references that moved (delta = new - stored):", shown)
    counts = ", ".join(f"{n} {s}" for s, n in plan.counts.items())
    moved = plan.version_changes()
    if moved:
        out.print("versions: " + ", ".join(f"{k} {old} -> {new}"
                                           for k, (old, new) in moved.items()))
    if plan.removed:
        out.print(f"removed from the set: {', '.join(plan.removed)}")
    where = golden.show_path(plan.root)
    if plan.refused:
        for b in plan.set_blocking():
            out.print(f"[red]{b}[/]")
        out.print(f"[bold red]refusing to overwrite {where}[/]: "
                  f"{len(plan.blocking)} change(s) beyond tolerance ({counts}); review them, "
                  f"then rerun with --accept to write")
    elif dry_run:
        out.print(f"dry run: {len(plan.entries)} cases ({counts}); nothing written")
    else:
        out.print(f"golden data in {where}: {len(plan.entries)} cases ({counts}), "
                  f"{plan.nbytes / 2**20:.2f} MiB" + (" [yellow](changes accepted)[/]"
                                                      if plan.accepted else ""))


@_command("regen")
def regen_command(
    cases: list[str] = typer.Option(None, "--cases", metavar="CASE_ID",
                                    help="Only these case ids, or ids "
                                    "containing this (repeatable, comma separated; any case of "
                                    "the full matrix). The other stored cases are kept."),
    suite_name: str = typer.Option(golden.DEFAULT_SUITE, "--suite", help="Without --cases: the "
                                   "golden set is exactly this suite (smoke | default | full)."),
    directory: str = typer.Option(None, "--dir", help=DIR_HELP),
    accept: bool = typer.Option(False, "--accept", help="Write even though references changed "
                                "beyond tolerance, or stored cases would be removed."),
    drift: float = typer.Option(golden.DRIFT_FRACTION, "--drift", min=0.0, max=1.0,
                                help=DRIFT_HELP),
    dry_run: bool = typer.Option(False, "--dry-run", help="Compute and compare; write nothing."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Regenerate the golden references (deterministically: same inputs, same bytes).

    Refuses to overwrite a reference that moved beyond tolerance unless --accept.
    Exit code 0: written (or nothing to change); 1: changes found and not accepted
    (nothing written); 2: usage error."""
    out = Output(json_out)
    prog = _progress(out, "golden regen")
    tasks = []

    def step(case, total: int) -> None:
        if case is None:  # the cases are selected (a usage error comes without a bar)
            prog.start()
            tasks.append(prog.add_task("regen", total=total, last=""))
        else:
            prog.update(tasks[0], advance=1, last=case.id)

    directory = path_option(directory, "--dir")
    try:
        plan = golden.regenerate(cases, suite_name, root=directory, accept=accept, drift=drift,
                                 dry_run=dry_run, progress=step)
    finally:
        if tasks:
            prog.stop()
    if json_out:
        out.emit_json(plan.as_dict())
    else:
        _print_regen(out, plan, dry_run)
    raise typer.Exit(1 if plan.refused else 0)


@_command("verify")
def verify_command(
    directory: str = typer.Option(None, "--dir", help=DIR_HELP),
    inputs: bool = typer.Option(True, "--inputs/--no-inputs",
                                help="Also regenerate each case's inputs from its seed and "
                                     "check them against their recorded sha256."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Check the manifest's schema and every file's size and sha256 (and the inputs).

    Exit code 0: intact; 1: a file is missing, truncated or corrupted, or the inputs or
    semantics drifted."""
    out = Output(json_out)
    # (a usage error before the progress bar: no directory, or one that holds no set)
    directory = golden.golden_root(path_option(directory, "--dir"), holding=True)
    with _progress(out, "golden verify") as prog:
        task = prog.add_task("verify", total=None, last="")
        res = golden.verify(directory, check_inputs=inputs,
                            progress=lambda cid: prog.update(task, advance=1, last=cid))
    if json_out:
        out.emit_json(res.as_dict())
    else:
        where = golden.show_path(res.root)
        for note in res.notes:
            out.note(f"note: {note}")
        if res.problems:
            for p in res.problems:
                out.print(f"[red]{p.kind:>10}[/]  {p.message}", markup=True, highlight=False)
            out.print(f"[bold red]{len(res.problems)} problem(s)[/] in {where}; "
                      f"regenerate with probe golden regen (see docs/golden.md)")
        else:
            v = (res.manifest or {}).get("versions", {})
            out.print(f"[green]ok[/]: {where} holds {res.n_cases} intact cases "
                      f"(torch {v.get('torch')}, numpy {v.get('numpy')})"
                      + ("" if inputs else "; inputs not checked"))
    raise typer.Exit(0 if res.ok else 1)


@_command("diff")
def diff_command(
    other: str = typer.Argument(..., help="The other golden directory (e.g. regenerated "
                                          "under a new torch with regen --dir)."),
    directory: str = typer.Option(None, "--dir", help=DIR_HELP),
    drift: float = typer.Option(golden.DRIFT_FRACTION, "--drift", min=0.0, max=1.0,
                                help=DRIFT_HELP),
    show_all: bool = typer.Option(False, "--all", help="List every case, not only those "
                                                       "that differ."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Compare two golden sets case by case (delta = OTHER - this).

    Exit code 0: the same within tolerance; 1: they differ (a case changed, is missing
    on one side or unreadable, or the semantics differ)."""
    out = Output(json_out)
    other = golden.golden_root(path_option(other, "OTHER_DIR"), holding=True)
    directory = golden.golden_root(path_option(directory, "--dir"), holding=True)
    doc = golden.diff_sets(directory, other, drift)
    if json_out:
        out.emit_json(doc)
        raise typer.Exit(1 if doc["differs"] else 0)
    for key in ("versions", "semantics", "generator"):
        for k, v in doc[key].items():
            style = "red" if key == "semantics" else "dim"
            out.print(f"[{style}]{key}.{k}: {v['this']} (this) -> {v['other']} (other)[/]")
    rows = doc["rows"] if show_all else [r for r in doc["rows"]
                                         if r["status"] not in ("same", "within")
                                         or r.get("tol_fraction", 0) > 0]
    if rows:
        this, that = golden.show_path(Path(doc["this"])), golden.show_path(other)
        _print_rows(out, f"golden diff: {this} (this) vs {that} (other), "
                         f"delta = other - this:", rows)
    counts = ", ".join(f"{n} {s}" for s, n in sorted(doc["counts"].items()))
    verdict = "[bold red]differ[/]" if doc["differs"] else "[green]agree within tolerance[/]"
    out.print(f"{len(doc['rows'])} cases: {counts}; the sets {verdict} "
              f"(drift threshold {drift:g} x tolerance)")
    raise typer.Exit(1 if doc["differs"] else 0)
