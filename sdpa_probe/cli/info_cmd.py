"""`probe info`: the machine, and its measured roofline (cached per machine and build)."""

from __future__ import annotations

import typer
from rich.table import Table

from .. import host_load, machine, native
from . import command
from .output import Output, human_bytes


def _threads(n: int) -> str:
    return f"{n} thread{'s' if n != 1 else ''}"


def _machine_table(m: dict) -> Table:
    t = Table(title="machine", title_justify="left", show_header=False, box=None,
              padding=(0, 2, 0, 0))
    t.add_column(style="bold")
    t.add_column()
    cpu = f"{m['cpu_model']} ({m['arch']}{', virtualised' if m['hypervisor'] else ''})"
    t.add_row("cpu", cpu)
    t.add_row("cores", f"{m['logical_cores']} logical, {m['physical_cores'] or '?'} physical, "
                       f"{m['usable_cores']} usable; default threads {m['default_threads']}")
    isa = m["isa"]
    have = " ".join(f for f, on in isa.items() if on) or "-"
    lack = " ".join(f for f, on in isa.items() if not on)
    t.add_row("isa", have + (f"  [dim](no {lack})[/]" if lack else ""))
    c = m["caches"]
    def share(n: int | None) -> str:
        return "" if not n else (" per cpu" if n == 1 else f" shared by {n} cpus")

    l2_share, l3_share = share(c["l2_shared_cpus"]), share(c["l3_shared_cpus"])
    t.add_row("caches", f"L1d {human_bytes(c['l1d_bytes'])}, "
                        f"L2 {human_bytes(c['l2_bytes'])}{l2_share}, "
                        f"L3 {human_bytes(c['l3_bytes'])}{l3_share}")
    t.add_row("memory", human_bytes(m["memory_bytes"]))
    os_ = m["os"]
    t.add_row("os", f"{os_['system']} {os_['release']}"
                    + (f" ({os_['libc']})" if os_["libc"] else ""))
    cc = m["compiler"]
    t.add_row("compiler", cc["version"] or cc["cc"])
    t.add_row("flags", " ".join(cc["flags"])
              + ("  [yellow](portable fallback)[/]" if cc["portable_fallback"] else ""))
    t.add_row("python", f"{m['python']}, numpy {m['numpy'] or '-'}, torch {m['torch'] or '-'}")
    if m["thread_env"]:
        t.add_row("env", " ".join(f"{k}={v}" for k, v in m["thread_env"].items()))
    return t


def _roofline_table(r: dict, m: dict) -> Table:
    p, nt = r["plan"], r["threads_all"]
    fb = m["fma_bench"]
    rounds = f"{p['rounds']} x " if p.get("rounds", 1) > 1 else ""
    t = Table(title="roofline (best repetition)", title_justify="left")
    t.add_column("ceiling", style="bold")
    t.add_column("value", justify="right")
    t.add_column("how")
    dram = f"{human_bytes(p['dram_buffer_bytes'])} buffer, best of {rounds}{p['dram_reps']}"
    t.add_row("DRAM read, 1 thread", f"{r['read_bw_gbs_1t']:.1f} GB/s", dram)
    t.add_row(f"DRAM read, {_threads(nt)}", f"{r['read_bw_gbs_all']:.1f} GB/s", dram)
    t.add_row("L2 read, 1 thread", f"{r['l2_read_bw_gbs']:.1f} GB/s",
              f"{human_bytes(p['l2_buffer_bytes'])} buffer, best of {rounds}{p['l2_reps']}")
    fma = (f"{fb['chains']} chains x {fb['lanes']} lanes"
           f"{'' if fb['fused'] else ' (mul+add, not fused)'}, best of {rounds}{p['fma_reps']}")
    t.add_row("F32 FMA, 1 thread", f"{r['fma_gflops_1t']:.1f} GFLOP/s", fma)
    t.add_row(f"F32 FMA, {_threads(nt)}", f"{r['fma_gflops_all']:.1f} GFLOP/s", fma)
    cvt = (f"the kernels' {fb['lanes']}-wide conversion + FMA, L1-resident, best of "
           f"{rounds}{p['cvt_reps']}")
    for dt in machine.CONVERT_DTYPES:
        t.add_row(f"{dt} -> F32, {_threads(nt)}", f"{r[f'cvt_{dt}_gelems_all']:.2f} G/s",
                  f"{cvt} ({r[f'cvt_{dt}_gelems_1t']:.2f} G/s with 1 thread)")
    t.add_row("ridge point", f"{r['ridge_flops_per_byte_all']:.1f} flop/B",
              f"all threads ({r['ridge_flops_per_byte_1t']:.1f} flop/B with 1 thread)")
    when = "cached, measured" if r["cached"] else "measured"
    t.caption = (f"{when} {r['measured_at']} in {r['measure_seconds']:.1f} s; "
                 "probe info --refresh re-measures")
    t.caption_justify = "left"
    return t


@command("info")
def info_command(
    json_out: bool = typer.Option(False, "--json", help="Print machine and roofline as JSON."),
    refresh: bool = typer.Option(False, "--refresh",
                                 help="Re-measure the roofline instead of using the cache."),
) -> None:
    """Describe this machine and its measured roofline (memory bandwidth, peak FMA).

    The roofline is measured once per machine and native build (a second or two)
    and cached; later runs and `probe profile` / `probe bench` reuse it.
    """
    out = Output(json_out)
    native.native_lib()  # may compile it on first use (with its own progress line)
    with out.err.status("probe info: describing the machine") as status:
        desc = machine.describe()

        def progress(msg: str) -> None:
            status.update(f"probe info: measuring {msg}")

        status.update("probe info: looking up the roofline")
        roof = machine.roofline(refresh=refresh, progress=progress)
    _load_warnings(out, roof)
    if json_out:
        out.emit_json({"machine": desc, "roofline": roof})
        return
    out.print(_machine_table(desc))
    out.print()
    out.print(_roofline_table(roof, desc))


def _load_warnings(out: Output, roof: dict) -> None:
    """Why a roofline measured now was not kept, or is kept only until a quiet one."""
    if roof.get("busy_measurement"):
        out.warn(f"the machine is busy ({host_load.describe(roof['busy_measurement'])}): that "
                 f"measurement is not kept; the last quiet one ({roof['measured_at']}) is used")
    elif (roof.get("load") or {}).get("busy"):
        out.warn(f"the machine was busy while measuring ({host_load.describe(roof['load'])}): "
                 "the figures may be low, and are not cached as this machine's; a later run "
                 "measures again once the machine is quiet (probe info --refresh: now)")

