#!/usr/bin/env python3
"""Record the kernel benchmark figures: `probe bench` over the presets against
torch and ExecuTorch, written as JSON (the `probe bench --json` document plus
the target checks) and as a Markdown table for docs/performance.md.

A benchmark, not a test: it measures, records and prints; it never fails on
speed. (The ratio guards live in tests/test_bench.py.)

    python benchmarks/run_bench.py                          # all presets, warm
    python benchmarks/run_bench.py --shape targets --cold   # the target shapes, cold
    python benchmarks/run_bench.py --out benchmarks/results --tag zen1

Writes <out>/<tag>-<mode>.json and <out>/<tag>-<mode>.md (tag: the host name by
default).
"""

from __future__ import annotations

import argparse
import datetime
import json
import socket
import sys
from pathlib import Path

from sdpa_probe import bench
from sdpa_probe.cli.output import dumps


def _us(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def _pct(x) -> str:
    return "-" if x is None else f"{x:.0f}%"


def markdown(doc: dict, targets: list[dict], command: str) -> str:
    m, roof, peers = doc["machine"], doc["roofline"] or {}, bench.ratio_columns(doc)
    caches = m.get("caches") or {}
    l3 = caches.get("l3_bytes")
    lines = [
        f"Measured {doc['measured_at']} with `{command}`",
        "",
        f"* machine: {m['cpu_model']}, {m.get('logical_cores')} logical cores"
        + (f", L3 {l3 >> 20} MiB" if l3 else "") + f"; ISA {' '.join(m.get('isa') or [])}",
        f"* compiler: {m['compiler']} `{' '.join(m['flags'])}`",
        f"* threads: {doc['threads']} (native kernels and torch.set_num_threads); "
        f"caches: **{doc['mode']}**; {doc['rounds']} interleaved rounds per shape, "
        "median and IQR per call",
        f"* versions: torch {doc['versions']['torch']}, executorch "
        f"{doc['versions']['executorch'] or 'not installed'}",
    ]
    if roof:
        busy = (roof.get("load") or {}).get("busy")
        lines.append(
            f"* roofline (`probe info`, {roof.get('measured_at')}"
            + (", measured while the machine was busy" if busy else "") + "): DRAM read "
            f"{roof.get('read_bw_gbs_all')} GB/s (all threads), {roof.get('read_bw_gbs_1t')} "
            f"GB/s (1 thread); F32 FMA {roof.get('fma_gflops_all')} GFLOP/s"
            + "".join(f"; {dt} -> F32 {roof[f'cvt_{dt}_gelems_all']} G elements/s"
                      for dt in ("f16", "i8") if roof.get(f"cvt_{dt}_gelems_all")))
    load = doc.get("load") or {}
    if load.get("other_cpu_fraction") is not None:
        lines.append(f"* load during the rounds: other processes {load['other_cpu_fraction']:.0%}"
                     f", hypervisor steal {load['steal_fraction']:.0%} of the CPUs; "
                     f"(noisy): IQR over {bench.NOISY_IQR:.0%} of the median")
    lines += ["", "| shape | kernel | median µs | IQR µs | GB/s | % DRAM | % DRAM same run | "
              "% roofline | bound | limit (L2 µs) | "
              + " | ".join(f"{p} µs | vs {p}" for p in peers) + " |",
              "|---|---|--:|--:|--:|--:|--:|--:|---|---|" + "--:|--:|" * len(peers)]
    for r in doc["results"]:
        row = [f"`{r['shape']}`", r["kernel"], _us(r["median_us"]),
               _us(r["iqr_us"]) + (" (noisy)" if r.get("noisy") else ""),
               f"{r['gb_s']:.1f}", _pct(r["dram_pct"]),
               _pct(r.get("dram_pct_same_run")) + (f" of {r['read_gb_s_same_run']:.1f}"
                                                   if r.get("read_gb_s_same_run") else ""),
               _pct(r["roofline_pct"]),
               r.get("bound") or "-",
               f"{r['limit']} ({_us(r['core_us'])})" if r.get("limit") else "-"]
        for p in peers:
            if p in r["ratio"]:
                noisy = " (noisy)" if r["peers"][p].get("noisy") else ""
                row += [_us(r["peers"][p]["median_us"]) + noisy, f"**{r['ratio'][p]:.2f}x**"]
            else:
                row += ["-", "-"]
        lines.append("| " + " | ".join(row) + " |")
    if targets:
        lines += ["", "| target | measured | goal | met |", "|---|--:|--:|:-:|"]
        for t in targets:
            val = "-" if t["value"] is None else (
                f"{100 * t['value']:.0f}%" if t["unit"] == "fraction" else f"{t['value']:.2f}x")
            goal = f"{100 * t['goal']:.0f}%" if t["unit"] == "fraction" else f"{t['goal']}x"
            met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
            lines.append(f"| {t['target']} | {val} | {goal} | {met} |")
    for n in doc["notes"]:
        lines.append(f"\nNote: {n}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="all", help="presets, groups or custom names")
    ap.add_argument("--vs", default="torch,executorch")
    ap.add_argument("--kernel", default=None)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--min-time", type=float, default=0.05)
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--tag", default=socket.gethostname().split(".")[0])
    args = ap.parse_args(argv)

    shapes = bench.select_shapes(args.shape)
    doc = bench.run(shapes, kernels=args.kernel.split(",") if args.kernel else None,
                    peers=[p for p in args.vs.split(",") if p], threads=args.threads,
                    cold=args.cold, rounds=args.rounds, min_time=args.min_time,
                    progress=lambda m: print(m, file=sys.stderr, flush=True))
    doc["targets"] = bench.measured_goals(doc)  # the speed goals this run measured
    doc["measured_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds")
    targets = bench.check_targets(doc)  # every goal, the ones not measured as such
    command = ("probe bench --vs " + args.vs + f" --shape {args.shape} --rounds {args.rounds}"
               + (" --cold" if args.cold else "") + " --goals --json PATH")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{args.tag}-{doc['mode']}"
    (out / f"{stem}.json").write_text(dumps(doc) + "\n")
    (out / f"{stem}.md").write_text(markdown(doc, targets, command))
    print(markdown(doc, targets, command))
    print(f"wrote {out / (stem + '.json')} and {out / (stem + '.md')}", file=sys.stderr)
    json.loads((out / f"{stem}.json").read_text())  # valid JSON
    return 0


if __name__ == "__main__":
    sys.exit(main())
