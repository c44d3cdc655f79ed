"""`probe profile`: a transformer decode step from the native building blocks, timed op by op."""

from __future__ import annotations

import os
import sys

import typer

from ..errors import ProbeError
from ..profile import chart as chart_mod
from ..profile import models, report, runner
from . import command
from .output import Output, check_writable


@command("profile")
def profile_command(
    model: str = typer.Option(None, "--model", "-m",
                              help=f"Shape preset: {', '.join(models.PRESETS)}."),
    custom: bool = typer.Option(False, "--custom",
                                help="Shape entirely from --layers --hidden --heads --kv-heads "
                                     "--head-dim --ffn (--vocab optional)."),
    layers: int = typer.Option(None, "--layers", help="Decoder layers (overrides the preset)."),
    hidden: int = typer.Option(None, "--hidden", help="Hidden size."),
    heads: int = typer.Option(None, "--heads", help="Query heads."),
    kv_heads: int = typer.Option(None, "--kv-heads", help="KV heads (divides --heads)."),
    head_dim: int = typer.Option(None, "--head-dim", help="Head dimension (even: RoPE)."),
    ffn: int = typer.Option(None, "--ffn", help="MLP intermediate size."),
    vocab: int = typer.Option(None, "--vocab", help="Vocabulary size (LM-head rows)."),
    weights: str = typer.Option("f16", "--weights", help="Weight dtype: f32 or f16."),
    cache: str = typer.Option("f16", "--cache", help="KV cache dtype: f32, f16 or i8 "
                              "(per token and head, with zero point)."),
    attention: str = typer.Option(None, "--attention", "-a",
                                  help="decomposed (torch-style export graph), fused (flash "
                                       "reading the cache; quant_int8 for an i8 cache), user "
                                       "(the --kernel file) or any registered kernel "
                                       "(kernel:NAME if it clashes); default fused (user with "
                                       "--kernel). GRAPH@CFLAGS runs it in a native build "
                                       "with those compiler flags."),
    ab: str = typer.Option(None, "--ab", help="A,B: interleaved A/B of two attention graphs, "
                           "e.g. decomposed,fused; either may be GRAPH@CFLAGS, a build with "
                           "other flags: --ab 'fused@-O3,fused@-O1'."),
    kernel: str = typer.Option(None, "--kernel",
                               help="PATH.c, PATH.cpp or PATH.so: a user sdpa_forward "
                                    "(native/include/sdpa_probe.h) as attention 'user'."),
    context: str = typer.Option("1000", "--context", "-c",
                                help="Cached tokens before the new one. A list or range "
                                     "sweeps: 100,1000,2000 or START:STOP:STEP with STOP "
                                     "included, e.g. 500:4000:500."),
    steps: int = typer.Option(20, "--steps", "-n", help="Timed steps per graph and context."),
    warmup: int = typer.Option(3, "--warmup", help="Untimed warm-up steps first."),
    threads: int = typer.Option(0, "--threads", "-t", help="Threads (0: all cores)."),
    cache_size: int = typer.Option(None, "--cache-size",
                                   help="KV cache capacity in positions (default: just enough)."),
    pp: int = typer.Option(0, "--pp", help="Also time N prompt tokens from position 0 "
                           "(token at a time), llama-bench style."),
    tg: int = typer.Option(0, "--tg", help="Also time N generated tokens after each context."),
    rope: str = typer.Option("half", "--rope", help="RoPE pairing: half or interleaved."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random weights and history."),
    roofline: bool = typer.Option(True, "--roofline/--no-roofline",
                                  help="Show %% of roofline (sdpa_probe.machine; measured "
                                       "once and cached)."),
    json_path: str = typer.Option(None, "--json", help="Write the result as JSON to PATH "
                                  "('-': stdout, no table)."),
    csv_path: str = typer.Option(None, "--csv", help="Write per-op rows as CSV to PATH."),
    trace_path: str = typer.Option(None, "--trace",
                                   help="Write a Chrome trace (chrome://tracing, Perfetto)."),
    live: bool = typer.Option(False, "--live",
                              help="Redraw the per-op table as steps come in."),
    chart: str = typer.Option(None, "--chart",
                              help="With a context sweep: also write the per-op time chart "
                                   "as SVG to PATH.svg."),
    chart_by: str = typer.Option("op", "--chart-by",
                                 help="Chart series: op (the top ops) or kind (op kinds)."),
    chart_top: int = typer.Option(6, "--chart-top", help="Series per chart panel."),
    interactive: bool = typer.Option(False, "--interactive", "-i",
                                     help="A prompt loop: change model, context, attention, "
                                          "cache, threads and rerun; each table shows the "
                                          "change against the previous run. Needs a "
                                          "terminal on stdin (see --script)."),
    script: bool = typer.Option(False, "--script",
                                help="With --interactive: read the commands from stdin even "
                                     "when it is not a terminal (a file, a pipe, a test)."),
) -> None:
    """Profile one transformer decode step op by op: decomposed vs fused attention."""
    to_stdout = json_path == "-" or csv_path == "-" or trace_path == "-"
    if kernel is not None and not kernel.strip():
        raise ProbeError("--kernel is empty: give a .c, .cpp or .so file implementing sdpa_forward")
    if sum(p == "-" for p in (json_path, csv_path, trace_path)) > 1:
        raise ProbeError("only one of --json, --csv, --trace can write to stdout")
    if interactive:
        clash = [name for name, given in (("--ab", ab is not None), ("--live", live),
                                          ("--csv", csv_path is not None),
                                          ("--trace", trace_path is not None),
                                          ("--chart", chart is not None),
                                          ("--json -", json_path == "-")) if given]
        if clash:
            raise ProbeError(f"--interactive runs one graph at a time and draws on the "
                             f"terminal: drop {', '.join(clash)}")
        if not script and not sys.stdin.isatty():
            raise ProbeError("--interactive needs a terminal on stdin (add --script to read "
                             "the commands from a file or pipe)")
    elif script:
        raise ProbeError("--script only goes with --interactive")
    if chart_by not in ("op", "kind"):
        raise ProbeError("--chart-by must be op or kind")
    if chart_top < 1:
        raise ProbeError("--chart-top must be >= 1")
    if chart is not None and not chart.lower().endswith(".svg"):
        raise ProbeError(f"--chart writes SVG: give a .svg path, got {chart!r}")
    for option, path in (("--json", json_path), ("--csv", csv_path), ("--trace", trace_path),
                         ("--chart", chart)):
        check_writable(path, option, inputs=[kernel])
    out = Output(json_mode=to_stdout)
    if not out.out.is_terminal and "COLUMNS" not in os.environ:
        out.out.width = 160  # piped or captured: the per-op table needs the room
    if model is not None and custom:
        raise ProbeError("--model and --custom exclude each other")
    shape = models.resolve(model, custom, {
        "layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads,
        "head_dim": head_dim, "ffn": ffn}, vocab)
    if ab is not None and attention is not None:
        raise ProbeError("--ab A,B picks both attention graphs; drop --attention")
    if ab is not None:
        labels = tuple(x.strip() for x in ab.split(",") if x.strip())
        if len(labels) != 2:
            raise ProbeError("--ab wants two attention graphs, e.g. --ab decomposed,fused "
                             "or --ab 'fused@-O3,fused@-O1'")
    else:
        labels = (attention or ("user" if kernel else "fused"),)
    settings = runner.Settings(
        shape=shape, weights=weights, cache=cache, attention=labels, ab=ab is not None,
        contexts=runner.parse_contexts(context), steps=steps, warmup=warmup, threads=threads,
        seed=seed, capacity=cache_size, pp=pp, tg=tg, rope_style=rope, roofline=roofline,
        kernel_path=kernel)
    runner.validate(settings)
    out.warn_if_portable()
    if kernel is not None and not any(runner.split_build(x)[0] == runner.USER
                                      for x in labels):
        raise ProbeError("--kernel is attention 'user': use --attention user or --ab "
                         "fused,user")
    if chart is not None and len(settings.contexts) < 2:
        raise ProbeError("--chart draws a context sweep: give two or more contexts, e.g. "
                         "--context 500:4000:500")
    if interactive:
        from ..profile import interactive as explore

        tty = sys.stdin.isatty()

        def read(prompt: str) -> str:
            line = out.out.input(prompt)
            if not tty:  # --script: show the command as a terminal would have
                out.print(line, markup=False, highlight=False)
            return line

        explore.explore(settings, out, read, json_path)
        return
    if live and not to_stdout:
        from rich.console import Group
        from rich.live import Live

        with Live(console=out.out, transient=True, refresh_per_second=4) as view:
            def show(head: dict, summaries: list[dict]) -> None:
                view.update(Group(*(report.op_table(head, sm) for sm in summaries)))

            doc, runs = runner.profile(settings, progress=out.note, live=show)
    else:
        doc, runs = runner.profile(settings, progress=out.note)
    for label, what in doc["caller_changed"].items():
        out.warn(f"attention {label} left its caller changed ({'; '.join(what)}): put back "
                 "after each of its steps, so that the other graph ran as it should (probe "
                 "check fails such a kernel)")
    if json_path:
        out.write_json(json_path, doc)
    if csv_path:
        report.write_text(csv_path, report.csv_text(doc))
    if trace_path:
        report.write_trace(trace_path, runs, doc)
    if chart:
        svg = chart_mod.svg_chart(doc, chart_by, chart_top, chart_mod.header_lines(doc))
        report.write_text(chart, svg)
    report.render(doc, out, chart_by, chart_top)
    if chart:
        out.note(f"chart written to {chart}")
