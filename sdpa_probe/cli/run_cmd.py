"""`probe run`: one kernel, one shape of your choosing, checked and timed."""

from __future__ import annotations

import typer
from rich.table import Table

from .. import native, sandbox
from ..cases import DTYPES, Case
from ..errors import ProbeError
from ..limits import check_seed, check_threads
from . import command
from .output import Output
from .pass_env import PASS_ENV


def shape_case(batch: int, heads: int, kv_heads: int, q_len: int, kv_len: int, head_dim: int,
               dtype: str, causal: bool, start_pos: int, threads: int, seed: int,
               q_dtype: str = "") -> Case:
    """A Case from command-line sizes, with one-line errors for impossible ones."""
    check_seed(seed)
    for name, val, lo in (("--batch", batch, 1), ("--heads", heads, 1), ("--kv-heads", kv_heads, 1),
                          ("--q-len", q_len, 1), ("--kv-len", kv_len, 0),
                          ("--head-dim", head_dim, 1), ("--start-pos", start_pos, 0),
                          ("--threads", threads, 0)):
        if val < lo:
            raise ProbeError(f"{name} must be >= {lo}, got {val}")
    check_threads(threads)
    if start_pos > kv_len:  # (query i sees keys j <= start_pos + i: beyond, it sees them all)
        raise ProbeError(f"--start-pos must be at most --kv-len ({kv_len}), got {start_pos}")
    if heads % kv_heads:
        raise ProbeError(f"--heads {heads} is not a multiple of --kv-heads {kv_heads}")
    if dtype not in DTYPES:
        raise ProbeError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
    if q_dtype and (q_dtype != "f32" or dtype == "f32"):
        raise ProbeError(f"--q-dtype {q_dtype!r}: f32 (an F32 query and output) over a f16, "
                         "bf16 or i8 cache")
    elems = batch * (q_len * heads * 2 + kv_len * kv_heads * 2) * head_dim
    if elems * 8 * 3 > 8 << 30:  # float64 oracle copies
        raise ProbeError(f"shape too large to check here: ~{elems * 24 / 2**30:.1f} GiB needed")
    return Case("run", batch=batch, n_heads=heads, n_kv_heads=kv_heads, q_len=q_len,
                kv_len=kv_len, head_dim=head_dim, dtype=dtype, causal=causal,
                start_pos=start_pos, n_threads=threads, seed=seed, q_dtype=q_dtype)


@command("run")
def run_command(
    kernel: str = typer.Argument("flash", help="A kernel from `probe kernels`."),
    user_kernel: str = typer.Option(None, "--kernel", help="Run your .c/.cpp/.so kernel instead."),
    batch: int = typer.Option(1, "--batch"),
    heads: int = typer.Option(32, "--heads"),
    kv_heads: int = typer.Option(8, "--kv-heads"),
    q_len: int = typer.Option(1, "--q-len"),
    kv_len: int = typer.Option(2048, "--kv-len"),
    head_dim: int = typer.Option(64, "--head-dim"),
    dtype: str = typer.Option("f32", "--dtype", help="f32, f16, bf16 or i8."),
    q_dtype: str = typer.Option("", "--q-dtype",
                                help="f32: an F32 query and output over the --dtype cache "
                                     "(default: Q in --dtype too)."),
    causal: bool = typer.Option(False, "--causal/--no-causal"),
    start_pos: int = typer.Option(0, "--start-pos"),
    threads: int = typer.Option(0, "--threads", help="0: one per CPU."),
    repeat: int = typer.Option(20, "--repeat", min=1, max=100_000,
                               help="Timed calls after a warm-up."),
    seed: int = typer.Option(0, "--seed"),
    json_out: bool = typer.Option(False, "--json"),
    pass_env: list[str] = PASS_ENV,
) -> None:
    """Run one kernel on one shape: check it against the oracle (in a worker process,
    so a crash is reported) and time it."""
    from ..backends import parse  # deferred: torch (seconds); probe --help imports none
    from ..check.single import check_and_time  # deferred, as parse

    out = Output(json_out)
    sandbox.pass_env(pass_env)
    if user_kernel is not None:
        native.load_user_kernel(user_kernel)  # (build errors surface here, once)
        spec = parse(str(user_kernel))
    else:
        spec = parse(kernel, what="kernel")
        if spec.kind != "native":
            raise ProbeError(f"{kernel}: probe run takes one of our kernels (probe kernels), "
                             "or your kernel file with --kernel FILE")
    case = shape_case(batch, heads, kv_heads, q_len, kv_len, head_dim, dtype, causal,
                      start_pos, threads, seed, q_dtype)
    rec = result = check_and_time(spec, case, repeat)
    if json_out:
        out.emit_json(result)
    else:
        t = Table(show_header=False, box=None, title=f"{spec.name} on {case.id}",
                  title_justify="left")
        t.add_row("status", rec["status"] + (f" - {rec['reason']}" if rec["reason"] else ""))
        if rec["max_abs_err"] is not None:
            t.add_row("max abs err", f"{rec['max_abs_err']:.3e} (tol {rec['atol']:.1e})")
        if "median_us" in result:
            rate = f"{result['gb_s']:.1f} GB/s, {result['gflop_s']:.1f} GFLOP/s"
            t.add_row("median time", f"{result['median_us']:.1f} us over {repeat} calls ({rate})")
        out.print(t)
    raise typer.Exit(0 if rec["status"] in ("pass", "unsupported") else 1)
