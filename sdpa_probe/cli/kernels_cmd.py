"""`probe kernels`: the registered native kernels, their dtypes and features."""

from __future__ import annotations

import typer
from rich.table import Table

from .. import native
from . import command
from .output import Output


@command("kernels")
def kernels_command(
    json_out: bool = typer.Option(False, "--json", help="Print the kernel list as JSON."),
) -> None:
    """List every registered kernel with its storage dtypes and features."""
    out = Output(json_out)
    kernels = native.builtin_kernels()
    if json_out:
        out.emit_json({"kernels": [k.info.as_dict() for k in kernels.values()]})
        return
    table = Table(title="native SDPA kernels", title_justify="left")
    table.add_column("kernel", style="bold")
    table.add_column("dtypes")
    table.add_column("features")
    table.add_column("what it is")
    for k in kernels.values():
        table.add_row(k.name, " ".join(k.info.dtypes), " ".join(k.info.features),
                      k.info.description)
    out.print(table)
