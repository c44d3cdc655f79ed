"""`probe sizing`: how large must a ring (or attention-sink) KV cache be under chunked
prefill? Each sizing policy is judged by simulating the cache through a real kernel."""

from __future__ import annotations

import typer

from .. import TOOL, sizing, tables
from ..tables import Col, Sheet
from . import command
from .formats import (
    FORCE,
    FORMAT,
    OUTPUT,
    JsonPathCommand,
    check_format,
    deliver,
    json_option,
    stdout_is_data,
)
from .output import Output
from .progress import Activity

SIZING_SCHEMA = "sdpa_probe.sizing/1"
_STYLE = {"undersized": "red", "exact": "green", "oversized": "yellow",
          "exceeds-full-context": "magenta"}


def _mib(nbytes: float) -> str:
    return f"{sizing.mib(nbytes):.2f}"


def _policy_sheet(rep: sizing.SizingReport) -> Sheet:
    table = Sheet([Col("policy", "id", style="bold"), Col("slots"), Col("MiB"),
                   Col("verdict", "text")],
                  title=f"KV-cache sizing: {rep.workload.describe()}; exact minimum "
                        f"{rep.minimum} slots")
    for p in rep.policies:
        table.add_row(p.name, str(p.size), _mib(p.bytes), f"[{_STYLE[p.verdict]}]{p.detail}[/]")
    return table


def _print_report(out: Output, rep: sizing.SizingReport) -> None:
    wl, shape = rep.workload, rep.kv_shape
    bps = shape.bytes_per_slot
    out.print(f"[bold]KV-cache sizing[/]: {wl.describe()}")
    out.print(f"simulated through kernel [bold]{rep.kernel}[/]: {rep.schedules} chunk schedules "
              f"over {rep.horizon} positions, {rep.calls} kernel calls, {rep.seconds:.1f} s")
    if rep.sampled:
        out.print(f"[dim]chunk lengths and offsets sampled ({sizing.SAMPLED} of each; "
                  "--all-lengths runs every one)[/]")
    agree = ("agrees" if rep.minimum == rep.closed_form
             else f"[red]DISAGREES: the rule gives {rep.closed_form}[/]")
    plural = "" if rep.minimum == 1 else "s"
    out.print(f"exact minimum: [bold]{rep.minimum}[/] slot{plural} (closed form "
              f"min(N, S + W + C - 1) = {rep.closed_form}: {agree})")
    full = ""
    if wl.context is not None:
        full = f"; a full-context cache ({wl.context} slots) = {_mib(wl.context * bps)} MiB"
    out.print(f"KV shape: {shape.describe()} = {bps / 1024:.1f} KiB per slot; the minimum = "
              f"{_mib(rep.minimum * bps)} MiB{full}")
    out.table(_policy_sheet(rep))
    for p in rep.policies:
        if p.verdict == "undersized":
            out.print(f"  {p.name}: position {p.position} is wrong under {p.schedule} "
                      f"({p.schedule_description})")
    out.print("rules:")
    for p in rep.policies:
        out.print(f"  {p.name}: {p.source}")


@command("sizing", cls=JsonPathCommand)
def sizing_command(
    window: int = typer.Option(..., "--window", "-w", help="Sliding window W: a query at "
                               "position p sees keys (p - W, p]."),
    chunk: int = typer.Option(..., "--chunk", help="Largest prefill chunk C (tokens "
                              "written into the cache before they attend)."),
    sink: int = typer.Option(0, "--sink", help="Attention sinks S: positions [0, S) "
                             "pinned and always visible."),
    context: int | None = typer.Option(None, "--context", "-c", help="Max context N (a "
                                       "full-context cache has N slots). Default: unbounded."),
    policy: list[str] | None = typer.Option(None, "--policy", "-p", metavar="NAME",
                                            help="A sizing policy "
                                            "to judge (repeatable). Default: all of them."),
    kernel: str = typer.Option("flash", "--kernel", help="Built-in kernel the simulated "
                               "cache runs through."),
    layers: int = typer.Option(16, "--layers", help="Model layers (memory figures)."),
    kv_heads: int = typer.Option(8, "--kv-heads", help="KV heads per layer (memory figures)."),
    head_dim: int = typer.Option(64, "--head-dim", help="Head dimension (memory figures)."),
    dtype: str = typer.Option("f16", "--dtype", help="Cache storage: f32, f16, bf16, i8."),
    seed: int = typer.Option(0, "--seed", help="Seed of the simulated q/k/v."),
    all_lengths: bool = typer.Option(False, "--all-lengths", help="Every chunk length and "
                                     "offset even when the chunk is over "
                                     f"{sizing.EXHAUSTIVE_UP_TO} (slower)."),
    fmt: str = FORMAT, output: str = OUTPUT, force: bool = FORCE,
    json_path: str = json_option("the report as JSON"),
) -> None:
    """Judge KV-cache sizing policies for sliding-window (+sink) attention by simulation.

    Every policy's cache is run through chunked prefill and decode schedules (a chunk right
    after the window fills, chunks of every length up to C, decode after prefill) with a real
    kernel, against a float64 full-history reference. The verdict is undersized (first wrong
    query and its error), exact, oversized (wasted slots and MiB) or larger than a
    full-context cache. The exact minimum is min(N, S + W + C - 1).
    """
    check_format(fmt, output, json_path, force=force)
    out = Output(stdout_is_data(fmt, output, json_path), fmt, output, force)
    progress = Activity("probe sizing")
    try:
        rep = sizing.size_caches(window, chunk, sink, context, policy, kernel=kernel,
                                 layers=layers, kv_heads=kv_heads, head_dim=head_dim,
                                 dtype=dtype, seed=seed, exhaustive=all_lengths,
                                 progress=progress)
    finally:
        progress.close()
    doc = {"schema": SIZING_SCHEMA, "tool": dict(TOOL)} | rep.as_dict()
    if json_path:
        out.write_json(json_path, doc)
    if not out.json_mode:
        _print_report(out, rep)
    deliver(out, fmt, output, "sizing", doc, [p.as_dict() for p in rep.policies],
            lambda: f"# probe sizing\n\n{tables.markdown(_policy_sheet(rep))}")
