"""`probe profile`: a transformer decode step from the native building blocks, timed op by op."""

from __future__ import annotations

import contextlib
import sys

import typer
from rich.console import Group
from rich.live import Live

from .. import sandbox, tables
from ..errors import ProbeError
from ..limits import check_count
from ..profile import models, report
from ..profile.interactive import explore, prompt_words
from ..profile.run import run_profile
from ..profile.settings import settings_from_options
from ..tables import render
from . import command
from .baseline_opts import COMPARE, SAVE_BASELINE, after_run, before_run, compare_sheet
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
from .line_editing import line_editing
from .output import Output, check_writable
from .pass_env import PASS_ENV

# the options, one per parameter of profile_command below
_MODEL = typer.Option(None, "--model", "-m", help=f"Shape preset: {', '.join(models.PRESETS)}.")
_CUSTOM = typer.Option(False, "--custom", help="Shape entirely from --layers --hidden --heads "
                       "--kv-heads --head-dim --ffn (--vocab optional).")
_LAYERS = typer.Option(None, "--layers", help="Decoder layers (overrides the preset).")
_HIDDEN = typer.Option(None, "--hidden", help="Hidden size.")
_HEADS = typer.Option(None, "--heads", help="Query heads.")
_KV_HEADS = typer.Option(None, "--kv-heads", help="KV heads (divides --heads).")
_HEAD_DIM = typer.Option(None, "--head-dim", help="Head dimension (even: RoPE).")
_FFN = typer.Option(None, "--ffn", help="MLP intermediate size.")
_VOCAB = typer.Option(None, "--vocab", help="Vocabulary size (LM-head rows).")
_WEIGHTS = typer.Option("f16", "--weights", help="Weight dtype: f32 or f16.")
_CACHE = typer.Option("f16", "--cache", help="KV cache dtype: f32, f16 or i8 "
                      "(per token and head, with zero point).")
_ATTENTION = typer.Option(None, "--attention", "-a",
                          help="decomposed (torch-style export graph), fused (flash "
                               "reading the cache; quant_int8 for an i8 cache), user "
                               "(the --kernel file) or any registered kernel "
                               "(kernel:NAME if it clashes); default fused (user with "
                               "--kernel). GRAPH@CFLAGS runs it in a native build "
                               "with those compiler flags.")
_AB = typer.Option(None, "--ab", help="A,B: interleaved A/B of two attention graphs, "
                   "e.g. decomposed,fused; either may be GRAPH@CFLAGS, a build with "
                   "other flags: --ab 'fused@-O3,fused@-O1'.")
_KERNEL = typer.Option(None, "--kernel", help="PATH.c, PATH.cpp or PATH.so: a user sdpa_forward "
                       "(native/include/sdpa_probe.h) as attention 'user'.")
_CONTEXT = typer.Option("1000", "--context", "-c",
                        help="Cached tokens before the new one. A list or range "
                             "sweeps: 100,1000,2000 or START:STOP:STEP with STOP "
                             "included, e.g. 500:4000:500.")
_STEPS = typer.Option(20, "--steps", "-n", help="Timed steps per graph and context.")
_WARMUP = typer.Option(3, "--warmup", help="Untimed warm-up steps first.")
_THREADS = typer.Option(0, "--threads", "-t", help="Threads (0: all cores).")
_CACHE_SIZE = typer.Option(None, "--cache-size",
                           help="KV cache capacity in positions (default: just enough).")
_PP = typer.Option(0, "--pp", help="Also time N prompt tokens from position 0 "
                   "(token at a time), llama-bench style.")
_TG = typer.Option(0, "--tg", help="Also time N generated tokens after each context.")
_ROPE = typer.Option("half", "--rope", help="RoPE pairing: half or interleaved.")
_SEED = typer.Option(0, "--seed", help="Seed of the random weights and history.")
_ROOFLINE = typer.Option(True, "--roofline/--no-roofline",
                         help="Show % of roofline (sdpa_probe.machine; measured "
                              "once and cached).")
_JSON = json_option("the result as JSON")
_CSV = typer.Option(None, "--csv", help="Write per-op rows as CSV to PATH.")
_TRACE = typer.Option(None, "--trace", help="Write a Chrome trace (chrome://tracing, Perfetto).")
_LIVE = typer.Option(False, "--live", help="Redraw the per-op table as steps come in.")
_CHART = typer.Option(None, "--chart", help="With a context sweep: also write the per-op time "
                      "chart as SVG to PATH.svg.")
_CHART_BY = typer.Option("op", "--chart-by",
                         help="Chart series: op (the top ops) or kind (op kinds).")
MAX_CHART_TOP = 100
_CHART_TOP = typer.Option(6, "--chart-top", help="Series per chart panel (1-100).")
_ALLOCS = typer.Option(True, "--allocs/--no-allocs",
                       help="Count a --kernel file's heap allocations per step (in a worker "
                            "with a counting malloc, as probe bench does).")
_INTERACTIVE = typer.Option(False, "--interactive", "-i",
                            help="A prompt loop: change model, context, attention, "
                                 "cache, threads and rerun; each table shows the "
                                 "change against the previous run. Needs a "
                                 "terminal on stdin (see --script).")
_SCRIPT = typer.Option(False, "--script",
                       help="With --interactive: read the commands from stdin even "
                            "when it is not a terminal (a file, a pipe, a test).")


def _check_options(kernel, json_path, csv_path, trace_path, chart, chart_by, chart_top,
                   interactive, script, ab, live) -> None:
    """The options that exclude or need each other, before any work."""
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
    check_count(chart_top, "--chart-top", 1, MAX_CHART_TOP, "series per panel")
    if chart is not None and not chart.lower().endswith(".svg"):
        raise ProbeError(f"--chart writes SVG: give a .svg path, got {chart!r}")
    for option, path in (("--json", json_path), ("--csv", csv_path), ("--trace", trace_path),
                         ("--chart", chart)):
        check_writable(path, option, inputs=[kernel])


def _explore(settings, out: Output, json_path: str | None) -> None:
    """--interactive: the prompt loop reads from the terminal (or, with --script, stdin)."""
    tty = sys.stdin.isatty()

    def read(prompt: str) -> str:
        if tty:  # (readline draws the prompt itself, so that editing keeps it)
            return input(prompt)
        line = out.out.input(prompt)  # --script: show the command as a terminal would have
        out.print(line, markup=False, highlight=False)
        return line

    with line_editing(prompt_words()) if tty else contextlib.nullcontext():
        explore(settings, out, read, json_path)


def _run_live(settings, out: Output) -> tuple[dict, list]:
    """--live: the per-op tables redrawn as the steps come in, then cleared."""
    with Live(console=out.out, transient=True, refresh_per_second=4) as view:
        def show(head: dict, summaries: list[dict]) -> None:
            view.update(Group(*(render(report.op_table(head, sm), out.width)
                               for sm in summaries)))

        return run_profile(settings, progress=out.note, live=show)


def _warn_caller_changed(doc: dict, out: Output) -> None:
    for label, what in doc["caller_changed"].items():
        out.warn(f"attention {label} left its caller changed ({'; '.join(what)}): put back "
                 "after each of its steps, so that the other graph ran as it should (probe "
                 "check fails such a kernel)")


@command("profile", cls=JsonPathCommand)
def profile_command(
    model: str = _MODEL, custom: bool = _CUSTOM, layers: int = _LAYERS, hidden: int = _HIDDEN,
    heads: int = _HEADS, kv_heads: int = _KV_HEADS, head_dim: int = _HEAD_DIM, ffn: int = _FFN,
    vocab: int = _VOCAB, weights: str = _WEIGHTS, cache: str = _CACHE,
    attention: str = _ATTENTION, ab: str = _AB, kernel: str = _KERNEL, context: str = _CONTEXT,
    steps: int = _STEPS, warmup: int = _WARMUP, threads: int = _THREADS,
    cache_size: int = _CACHE_SIZE, pp: int = _PP, tg: int = _TG, rope: str = _ROPE,
    seed: int = _SEED, roofline: bool = _ROOFLINE, json_path: str = _JSON, csv_path: str = _CSV,
    trace_path: str = _TRACE, live: bool = _LIVE, chart: str = _CHART,
    chart_by: str = _CHART_BY, chart_top: int = _CHART_TOP, interactive: bool = _INTERACTIVE,
    script: bool = _SCRIPT, allocs: bool = _ALLOCS, fmt: str = FORMAT, output: str = OUTPUT,
    force: bool = FORCE, save_baseline: str = SAVE_BASELINE, compare: str = COMPARE,
    pass_env: list[str] = PASS_ENV,
) -> None:
    """Profile one transformer decode step op by op: decomposed vs fused attention."""
    sandbox.pass_env(pass_env)
    _check_options(kernel, json_path, csv_path, trace_path, chart, chart_by, chart_top,
                   interactive, script, ab, live)
    check_format(fmt, output, json_path, force=force, inputs=[kernel],
                 other_stdout=("csv" if csv_path == "-" else None,
                               "trace" if trace_path == "-" else None))
    if interactive and (fmt != "table" or output is not None or save_baseline or compare):
        raise ProbeError("--interactive draws on the terminal: drop --format, --output, "
                         "--save-baseline and --compare (its session is saved with the save "
                         "command)")
    base = before_run("profile", save_baseline, compare, force)
    to_stdout = "-" in (csv_path, trace_path) or stdout_is_data(fmt, output, json_path)
    out = Output(to_stdout, fmt, output, force)
    settings = settings_from_options(
        model=model, custom=custom, vocab=vocab, attention=attention, ab=ab, kernel=kernel,
        context=context, chart=chart is not None,
        dims={"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads,
              "head_dim": head_dim, "ffn": ffn},
        weights=weights, cache=cache, steps=steps, warmup=warmup, threads=threads, seed=seed,
        capacity=cache_size, pp=pp, tg=tg, rope_style=rope, roofline=roofline,
        user_allocs=allocs)
    out.warn_if_portable()
    if interactive:
        _explore(settings, out, json_path)
        return
    if live and not to_stdout:
        doc, runs = _run_live(settings, out)
    else:
        doc, runs = run_profile(settings, progress=out.note)
    _warn_caller_changed(doc, out)
    after_run(out, "profile", doc, save_baseline, base)
    report.write_files(doc, runs, json_path=json_path, csv_path=csv_path, trace_path=trace_path,
                       chart_path=chart, chart_by=chart_by, chart_top=chart_top)
    report.render(doc, out, chart_by, chart_top)  # (its tables only when stdout is free)
    cmp = compare_sheet(doc)
    if cmp is not None:
        out.table(cmp)
    deliver(out, fmt, output, "profile", doc, lambda: report.csv_rows(doc),
            lambda: report.markdown(doc) + ("\n" + tables.markdown(cmp) if cmp else ""),
            csv_override=report.csv_text(doc))
    if chart:
        out.note(f"chart written to {chart}")
