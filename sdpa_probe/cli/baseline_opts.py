"""--save-baseline NAME and --compare NAME of `probe bench` and `probe profile`: the
options, the checks before the run, and the comparison table after it
(saved_runs holds the store and the verdict)."""

from __future__ import annotations

import sys

import typer

from .. import saved_runs
from ..errors import ProbeError
from ..tables import Col, Sheet

SAVE_BASELINE = typer.Option(
    None, "--save-baseline", metavar="NAME",
    help="Keep this run as baseline NAME (in the data directory, "
         "$SDPA_PROBE_BASELINES to move it); an existing NAME is replaced only after "
         "asking, or with --force.")
COMPARE = typer.Option(
    None, "--compare", metavar="NAME",
    help="Hold this run against baseline NAME: per figure the ratio baseline / now "
         "(above 1: faster now) and a verdict, faster, slower or same, from both runs' "
         "spread.")

_STYLE = {"faster": "green", "slower": "red", "same": None}


def before_run(command: str, save_name: str | None, compare_name: str | None,
               force: bool) -> dict | None:
    """Before any work: the name to save under is free (or the user says to replace
    it, or --force), the baseline to compare with exists; that baseline."""
    if save_name is not None:
        when = saved_runs.saved_at(command, save_name)  # (also checks the name)
        if when is not None and not force:
            ask = sys.stdin.isatty() and sys.stderr.isatty()
            question = f"{command} baseline {save_name!r} exists (saved {when}): replace it?"
            if not ask:
                raise ProbeError(f"{command} baseline {save_name!r} exists (saved {when}); "
                                 "--force replaces it, or choose another name")
            if not typer.confirm(question, default=False, err=True):
                raise ProbeError(f"baseline {save_name!r} kept; nothing run")
    return saved_runs.load(command, compare_name) if compare_name is not None else None


def after_run(out, command: str, doc: dict, save_name: str | None,
              base: dict | None) -> None:
    """Save the run (without its comparison) and put the comparison in the document."""
    if save_name is not None:
        where = saved_runs.save(command, save_name, doc)
        out.note(f"saved as {command} baseline {save_name!r} ({where})")
    if base is None:
        return
    rows = (saved_runs.compare_bench if command == "bench"
            else saved_runs.compare_profile)(base["run"], doc)
    doc["compare"] = {"baseline": base["name"], "saved_at": base.get("saved_at"),
                      "rows": rows, "differs": saved_runs.mismatch(base["run"], doc)}
    for what in doc["compare"]["differs"]:
        out.warn(f"baseline {base['name']!r} was run with {what}: the ratios compare "
                 "unlike runs")
    if not rows:
        out.warn(f"baseline {base['name']!r} has none of this run's figures to compare")


def compare_sheet(doc: dict) -> Sheet | None:
    """The comparison table (None without --compare)."""
    cmp = doc.get("compare")
    if not cmp or not cmp["rows"]:
        return None
    unit = "µs" if cmp["rows"][0]["unit"] == "us" else "ms"
    bench = "shape" in cmp["rows"][0]
    ids = ([Col("shape", "id"), Col("party", "id")] if bench
           else [Col("attention", "id"), Col("context"), Col("op", "id")])
    t = Sheet(ids + [Col(f"baseline {unit}", drop=2), Col(f"now {unit}", drop=1),
                     Col("ratio"), Col("verdict", "id")],
              title=f"against baseline {cmp['baseline']!r} (saved {cmp['saved_at']}): ratio "
                    "= baseline / now; same = the medians' intervals (+-1.57 IQR/sqrt(n)) "
                    f"overlap or the change is under {saved_runs.MIN_CHANGE:.0%}")
    for r in cmp["rows"]:
        head = [r["shape"], r["party"]] if bench else [r["attention"], str(r["context"]),
                                                       r["op"]]
        style = _STYLE[r["verdict"]]
        word = f"[{style}]{r['verdict']}[/]" if style else r["verdict"]
        t.add_row(*head, _num(r["baseline"]), _num(r["now"]), f"{r['ratio']:.3f}x", word)
    return t


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else (f"{x:.2f}" if x >= 1 else f"{x:.3g}")
