"""`probe bench`: kernel timings against torch and ExecuTorch, interleaved, with ratios."""

from __future__ import annotations

import typer

from .. import sandbox, tables
from ..errors import ProbeError
from ..tables import Col, Sheet
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
from .output import Output, check_writable, human_bytes
from .pass_env import PASS_ENV


def _split(text: str | None) -> list[str]:
    return [p.strip() for p in (text or "").split(",") if p.strip()]


def _pct(x) -> str:
    return "-" if x is None else f"{x:.0f}%"


def _us(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def _noisy(text: str, stats: dict) -> str:
    """A figure whose rounds disagreed (bench.NOISY_IQR), in yellow."""
    return f"[yellow]{text}[/]" if stats.get("noisy") else text


# the bench table's drop order at a narrow width (tables.fit): these leave first;
# shape, kernel, the median and the ratios against each peer are never dropped
_DROP = {"DRAM run": 1, "limit (L2 µs)": 2, "IQR µs": 3, "GB/s": 4, "bound": 5,
         "roofline": 6, "peer µs": 7, "DRAM": 8}


def _table(doc: dict) -> Sheet:
    from .. import bench  # deferred: it imports torch (seconds); probe --help imports none
    peers = bench.ratio_columns(doc)
    mode = "cold (rotating inputs > last-level cache)" if doc["mode"] == "cold" else \
        "warm (inputs reused every call)"
    cols = [Col("shape", "id", style="bold"), Col("kernel", "id"), Col("median µs")]
    cols += [Col(h, "text" if h == "limit (L2 µs)" else ("id" if h == "bound" else "num"),
                 drop=_DROP[h])
             for h in ("IQR µs", "GB/s", "DRAM", "DRAM run", "roofline", "bound",
                       "limit (L2 µs)")]
    for p in peers:
        cols += [Col(f"{p} µs", drop=_DROP["peer µs"]), Col(f"vs {p}")]
    t = Sheet(cols, title=f"probe bench: {mode}, {doc['threads']} threads, median of "
                          f"{doc['rounds']} interleaved rounds")
    for r in doc["results"]:
        row = [r["shape"], r["kernel"], _us(r["median_us"]), _noisy(_us(r["iqr_us"]), r),
               f"{r['gb_s']:.1f}", _pct(r["dram_pct"]), _pct(r.get("dram_pct_same_run")),
               _pct(r["roofline_pct"]), r.get("bound") or "-",
               f"{r['limit']} ({_us(r['core_us'])})" if r.get("limit") else "-"]
        for p in peers:
            if p in r["ratio"]:
                ratio = r["ratio"][p]
                style = "green" if ratio >= 1.0 else "red"
                row += [_noisy(_us(r["peers"][p]["median_us"]), r["peers"][p]),
                        f"[{style}]{ratio:.2f}x[/]"]
            else:
                row += ["-", "[dim]n/a[/]"]
        t.add_row(*row)
    return t


def _allocs_cell(c: dict | None) -> str:
    if c is None:
        return "[dim]-[/]"
    if "error" in c:
        return "[red]failed[/]" if "died" in c["error"] else "[dim]n/a[/]"
    n, t = c["allocs"], c.get("threads") or 0
    text = f"{n:,.0f}" if n == int(n) else f"{n:,.2f}"
    text = text if not n else f"{text} ({human_bytes(c['bytes'])})"
    return text if t < 0.5 else f"{text}, [yellow]{t:g} threads[/]"


def _allocs_table(doc: dict) -> Sheet | None:
    """Heap allocations per call, the kernel's and each peer's, a row per result."""
    from .. import bench  # deferred: it imports torch (seconds); probe --help imports none
    rows = [r for r in doc["results"] if r.get("allocs") is not None
            or any(ps.get("allocs") is not None for ps in r["peers"].values())]
    if not rows:
        return None
    peers = [p for p in bench.ratio_columns(doc) if p != bench.F32_REFERENCE]
    t = Sheet([Col("shape", "id", style="bold"), Col("kernel", "id"),
               Col("kernel allocs", "text")] + [Col(f"{p} allocs", "text") for p in peers],
              title="heap allocations per call (malloc / new / aligned, every thread; "
                    "bytes asked for), and threads started per call")
    for r in rows:
        t.add_row(r["shape"], r["kernel"], _allocs_cell(r.get("allocs")),
                  *(_allocs_cell(r["peers"].get(p, {}).get("allocs")) for p in peers))
    return t


def _goals_table(doc: dict) -> Sheet:
    """The project's own kernel-speed targets this run measured: figure, goal, met
    (docs/performance.md)."""
    t = Sheet([Col("target", "text", style="bold"), Col("measured"), Col("goal"),
               Col("met", "id", justify="center")],
              title=f"kernel-speed targets measured in this run ({doc['mode']}; goals in "
                    "docs/performance.md)")
    for g in doc["targets"]:
        pct = g["unit"] == "fraction"
        t.add_row(g["target"], f"{g['value']:.0%}" if pct else f"{g['value']:.2f}x",
                  f"{g['goal']:.0%}" if pct else f"{g['goal']:g}x",
                  "yes" if g["met"] else "[red]no[/]")
    return t


def _legend(out: Output, doc: dict) -> None:
    """What the % columns are held against, and the core's FMA rate of the same rounds."""
    from .. import bench  # deferred: it imports torch (seconds); probe --help imports none
    roof = doc["roofline"]
    if roof:
        bw = roof["read_bw_gbs_all" if doc["threads"] > 1 else "read_bw_gbs_1t"]
        fl = roof["fma_gflops_all" if doc["threads"] > 1 else "fma_gflops_1t"]
        out.print(f"[dim]DRAM = GB/s over the measured DRAM read bandwidth ({bw} GB/s); "
                  "DRAM run = over the same read benchmark timed in the same rounds; "
                  f"roofline = time bound max(bytes / bandwidth, flops / {fl} GFLOP/s, "
                  "F16 / BF16 / int8 K and V elements / the measured conversion rate) "
                  "over the median (probe info). Bytes: q, k, v read once, out written "
                  f"once. Yellow: noisy (IQR over {bench.NOISY_IQR:.0%} of the median).[/]")
    fmas = [r["fma_gflops_same_run"] for r in doc["results"]]
    if fmas:
        pcts = [r["fma_pct_same_run"] for r in doc["results"]
                if r["fma_pct_same_run"] is not None]  # (None: no roofline)
        share = (f" ({min(pcts):.0f}-{max(pcts):.0f} % of probe info's peak)"
                 if pcts else "")
        out.print(f"[dim]F32 FMA timed in the same rounds: {min(fmas):.0f}-{max(fmas):.0f} "
                  f"GFLOP/s{share}: a core-bound time moves with it.[/]")


def _render(out: Output, doc: dict, json_path: str | None) -> None:
    """The notes, the JSON if asked, and the tables (not when stdout is a document),
    then the --format output."""
    for note in doc["notes"]:
        out.warn(note)
    if json_path:
        out.write_json(json_path, doc)
    if not out.json_mode:
        for sheet in _sheets(doc):
            out.table(sheet)
            if sheet.title.startswith("probe bench:"):
                _legend(out, doc)
    deliver(out, out.fmt, out.output, "bench", doc, lambda: _rows(doc),
            lambda: "# probe bench\n\n" + "\n".join(tables.markdown(s) for s in _sheets(doc)))


def _sheets(doc: dict) -> list[Sheet]:
    """The bench table, the allocations table, (with --goals) the targets' and (with
    --compare) the comparison with a saved run."""
    sheets = [_table(doc), _allocs_table(doc)]
    if doc.get("targets"):
        sheets.append(_goals_table(doc))
    sheets.append(compare_sheet(doc))
    return [s for s in sheets if s is not None]


def _rows(doc: dict) -> list[dict]:
    """A row per (shape, kernel) for csv / jsonl: its figures, each peer's flattened."""
    return [dict(r) for r in doc["results"]]


def _exit_status(doc: dict) -> None:
    """Exit 2 when a kernel asked for by name timed nothing, 1 when one crashed or
    failed its trial call."""
    # nothing measured for a kernel asked for by name (with no crash, each one declined)
    if doc["untimed"] and not doc["crashed"] and not doc["failed"]:
        typer.echo(f"error: {', '.join(doc['untimed'])} took none of the shapes asked for (it "
                   "returned SDPA_UNSUPPORTED for each; the notes say which): nothing timed",
                   err=True)
        raise typer.Exit(2)
    if doc["crashed"]:  # the figures that were taken stand; the run as a whole did not pass
        typer.echo(f"error: {len(doc['crashed'])} (shape, kernel) crashed in a trial call: "
                   f"{', '.join(doc['crashed'][:3])}{' ...' if len(doc['crashed']) > 3 else ''}; "
                   "probe check --kernel FILE tells why", err=True)
        raise typer.Exit(1)
    if doc["failed"]:  # (it returned, leaving its process changed: check fails it too)
        typer.echo(f"error: {len(doc['failed'])} (shape, kernel) failed a trial call: "
                   f"{', '.join(doc['failed'][:3])}{' ...' if len(doc['failed']) > 3 else ''}; "
                   "the notes say what each left changed", err=True)
        raise typer.Exit(1)


def _list_presets(out: Output) -> None:
    from .. import bench  # deferred: it imports torch (seconds); probe --help imports none
    for name, s in bench.PRESETS.items():
        groups = [g for g, f in bench.GROUPS.items() if g != "all" and f(s)]
        out.print(f"{name}  [dim]{' '.join(groups)}[/]")


@command("bench", cls=JsonPathCommand)
def bench_command(
    kernel: str = typer.Option(
        None, "--kernel",
        help="Kernels to time, comma-separated: registered names (probe kernels) or "
             ".c / .cpp / .so files implementing sdpa_forward (default: flash for float "
             "shapes, quant_int8 for int8 shapes)."),
    vs: str = typer.Option("torch", "--vs",
                           help="Peers measured in the same run, comma-separated: backends "
                                "from `probe backends` (torch, a runtime, one of our kernels) "
                                "or .c / .cpp / .so kernel files (old.c: an A/B of two "
                                "versions)."),
    shape: str = typer.Option(
        "all", "--shape", "-s",
        help="Comma-separated presets, groups (all, decode, prefill, targets, quick) or "
             "custom names such as decode-h32kv8d64-kv4096-f16 or "
             "prefill-h8kv2d64-q128-kv1024-causal-f32."),
    select: list[str] = typer.Option(
        None, "-k", metavar="EXPRESSION",
        help="Only shapes whose name matches, as pytest's -k: words with and, or, not and "
             "parentheses (-k 'kv8192 and not i8'; several -k: any of them)."),
    dtype: str = typer.Option(None, "--dtype", help="Keep only these dtypes (f32,f16,bf16,i8)."),
    threads: int = typer.Option(0, "--threads", "-t",
                                help="Threads for the native kernels and torch (0: all cores)."),
    cold: bool = typer.Option(False, "--cold",
                              help="Rotate through inputs larger than the last-level cache."),
    rounds: int = typer.Option(7, "--rounds", min=1, max=1000,
                               help="Interleaved rounds per shape."),
    min_time: float = typer.Option(0.05, "--min-time", min=0.0,
                                   help="Seconds each party runs per round (at least one call)."),
    json_path: str = json_option("the results as JSON"),
    fmt: str = FORMAT, output: str = OUTPUT, force: bool = FORCE,
    save_baseline: str = SAVE_BASELINE, compare: str = COMPARE,
    list_presets: bool = typer.Option(False, "--list", help="List the preset shapes and exit."),
    allocs: bool = typer.Option(True, "--allocs/--no-allocs",
                                help="Also count every party's heap allocations per call "
                                     "(in a worker process with a counting malloc)."),
    goals: bool = typer.Option(False, "--goals",
                               help="Also show the project's own kernel-speed goals this run "
                                    "measured (docs/performance.md): a last table, and "
                                    "\"targets\" in the JSON."),
    pass_env: list[str] = PASS_ENV,
) -> None:
    """Time native kernels (ours or yours) against torch / ExecuTorch SDPA and each
    other, side by side in one run.

    Warm caches by default (the report says which); --cold rotates through inputs
    larger than the last-level cache.

    Ratio = peer median / kernel median: above 1 the native kernel is faster.
    """
    from .. import bench  # deferred: it imports torch (seconds); probe --help imports none
    from ..backends import is_kernel_file  # deferred, as bench

    inputs = [s for s in _split(kernel) + _split(vs) if is_kernel_file(s)]
    check_format(fmt, output, json_path, force=force, inputs=inputs)
    out = Output(stdout_is_data(fmt, output, json_path), fmt, output, force)
    sandbox.pass_env(pass_env)
    for option, value in (("--kernel", kernel), ("--dtype", dtype)):
        if value is not None and not _split(value):  # (else read as not given)
            raise ProbeError(f"{option} is empty")
    if list_presets:
        _list_presets(out)
        return
    check_writable(json_path, "--json", inputs=inputs)
    base = before_run("bench", save_baseline, compare, force)
    out.warn_if_portable()
    doc = bench.run_bench(shape, kernels=_split(kernel), peers=_split(vs), dtypes=_split(dtype),
                          threads=threads, cold=cold, rounds=rounds, min_time=min_time,
                          progress=out.note, allocs=allocs, goals=goals, select=select or ())
    after_run(out, "bench", doc, save_baseline, base)
    _render(out, doc, json_path)
    _exit_status(doc)
