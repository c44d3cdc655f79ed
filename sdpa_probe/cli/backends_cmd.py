"""`probe backends`: every backend the tool can run, whether it can run here (and why
not), and its version."""

from __future__ import annotations

import typer
from rich.table import Table

from . import command
from .output import Output

KIND = {"native": "ours", "registered": "runtime"}


@command("backends")
def backends_command(
    json_out: bool = typer.Option(False, "--json", help="Print the list as JSON."),
) -> None:
    """List every backend: available here or why not, and its version."""
    # deferred: the backends import torch (seconds); probe --help imports none
    from ..backends.inventory import describe, specs_known

    out = Output(json_out)
    rows = describe(specs_known())
    if json_out:
        out.emit_json({"backends": rows})
        return
    table = Table(title="backends (probe check -b NAME, probe bench --vs NAME)",
                  title_justify="left")
    table.add_column("backend", style="bold", no_wrap=True)
    table.add_column("kind")
    table.add_column("here")
    table.add_column("version, or why not", overflow="fold")
    for r in rows:
        kind = "torch" if r["name"] == "torch" else KIND[r["kind"]]
        if r["available"]:
            table.add_row(r["name"], kind, "[green]yes[/]",
                          r["version"] or f"[yellow]? {r.get('why_no_version', '')}[/]")
        else:
            table.add_row(r["name"], kind, "[dim]no[/]", f"[dim]{r['why']}[/]")
    out.print(table)
    n = sum(r["available"] for r in rows)
    out.print(f"{n} of {len(rows)} backends can run here (docs/runtimes.md: adding the "
              "runtimes)")
