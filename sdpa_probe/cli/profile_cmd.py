"""`probe profile`: a transformer decode step from the native building blocks, timed op by op."""

from __future__ import annotations

import os

import typer

from ..errors import ProbeError
from ..profile import models, report, runner
from . import command
from .output import Output


def _int_list(text: str, what: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x.strip().replace("_", "")) for x in text.split(",") if x.strip())
    except ValueError:
        raise ProbeError(f"{what} wants comma-separated integers, got {text!r}") from None
    if not vals:
        raise ProbeError(f"{what} is empty")
    return vals


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
                                       "reading the cache; quant_int8 for an i8 cache) or any "
                                       "registered kernel (kernel:NAME if it clashes); "
                                       "default fused."),
    ab: str = typer.Option(None, "--ab", help="A,B: interleaved A/B of two attention graphs, "
                           "e.g. decomposed,fused."),
    context: str = typer.Option("1000", "--context", "-c",
                                help="Cached tokens before the new one; a list sweeps, "
                                     "e.g. 100,1000,2000."),
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
) -> None:
    """Profile one transformer decode step op by op: decomposed vs fused attention."""
    to_stdout = json_path == "-" or csv_path == "-" or trace_path == "-"
    if sum(p == "-" for p in (json_path, csv_path, trace_path)) > 1:
        raise ProbeError("only one of --json, --csv, --trace can write to stdout")
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
            raise ProbeError("--ab wants two attention graphs, e.g. --ab decomposed,fused")
    else:
        labels = (attention or "fused",)
    settings = runner.Settings(
        shape=shape, weights=weights, cache=cache, attention=labels, ab=ab is not None,
        contexts=_int_list(context, "--context"), steps=steps, warmup=warmup, threads=threads,
        seed=seed, capacity=cache_size, pp=pp, tg=tg, rope_style=rope, roofline=roofline)
    runner.validate(settings)
    if live and not to_stdout:
        from rich.console import Group
        from rich.live import Live

        with Live(console=out.out, transient=True, refresh_per_second=4) as view:
            def show(head: dict, summaries: list[dict]) -> None:
                view.update(Group(*(report.op_table(head, sm) for sm in summaries)))

            doc, runs = runner.profile(settings, progress=out.note, live=show)
    else:
        doc, runs = runner.profile(settings, progress=out.note)
    if json_path:
        out.write_json(json_path, doc)
    if csv_path:
        report.write_text(csv_path, report.csv_text(doc))
    if trace_path:
        report.write_trace(trace_path, runs)
    report.render(doc, out)
