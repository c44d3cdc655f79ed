#!/usr/bin/env python3
"""Where a decode block's cycles go: the AVX-512 block path timed alone.

Builds benchmarks/block_cycles.c against native/src four times (the whole block,
then without the scores, the softmax or P.V: flash_x512_block.h's FX_OMIT_*),
runs the builds in interleaved rounds on one thread and prints cycles per
(key, kv head) and each phase's share (whole block minus the build without it).
With few distinct blocks (--blocks) K and V stay in L1 / L2, so the figures are
the core's; raise --blocks past the L2 to see what streaming from the L3 adds.
A measurement, not a test; docs/performance.md quotes it.

    python benchmarks/block_cycles.py                              # int8 Q / K / V, (32, 8, 64)
    python benchmarks/block_cycles.py --dtype f16,iq --blocks 16 --pf-l2
    python benchmarks/block_cycles.py --dtype f32 --rows 1 --kv-heads 16 --head-dim 128 --json -

Needs a C compiler ($CC, else cc) that targets AVX-512 with -march=native.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # sdpa_probe from this checkout, installed or not
from sdpa_probe.build import BASE_FLAGS, NATIVE_ARCH  # noqa: E402

SRC, INCLUDE = ROOT / "native" / "src", ROOT / "native" / "include"
DRIVER = Path(__file__).resolve().parent / "block_cycles.c"
FLAGS = [*BASE_FLAGS, *NATIVE_ARCH]  # the native library's own flags
DTYPE_FILE = {"f32": "f32", "f16": "f16", "bf16": "bf16", "i8": "i8", "iq": "iq"}
VARIANTS = {"block": None, "no scores": "FX_OMIT_SCORES", "no softmax": "FX_OMIT_SOFTMAX",
            "no P.V": "FX_OMIT_PV"}


class UsageError(Exception):
    pass


def _compile(cc: str, src: Path, obj: Path, defines: list[str]) -> None:
    cmd = [cc, *FLAGS, "-c", f"-I{INCLUDE}", f"-I{SRC}", *(f"-D{d}" for d in defines),
           "-o", str(obj), str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise UsageError(f"{src.name} did not compile: {r.stderr.strip().splitlines()[-1:]}")


def build(cc: str, dtype: str, work: Path, jobs: int) -> dict[str, Path]:
    """One executable per variant; the block copies of the other dtypes built once."""
    sources = sorted(SRC.glob("flash_x512*.c"))
    sources = [s for s in sources if s.stem != "flash_x512_panel"]
    own = SRC / f"flash_x512_{DTYPE_FILE[dtype]}.c"
    shared = [s for s in sources if s != own] + [DRIVER]
    tags = {name: name.replace(" ", "_").replace(".", "") for name in VARIANTS}
    tasks = [(s, work / f"{s.stem}.o", []) for s in shared]
    for name, define in VARIANTS.items():
        tasks.append((own, work / f"{own.stem}.{tags[name]}.o", [define] if define else []))
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda t: _compile(cc, *t), tasks))
    exes = {}
    for name, tag in tags.items():
        exe = work / f"block_cycles.{dtype}.{tag}"
        objs = [str(work / f"{s.stem}.o") for s in shared] + [str(work / f"{own.stem}.{tag}.o")]
        r = subprocess.run([cc, *objs, "-lm", "-o", str(exe)], capture_output=True, text=True)
        if r.returncode != 0:
            raise UsageError(f"link failed: {r.stderr.strip()}")
        exes[name] = exe
    return exes


def run(exe: Path, a: argparse.Namespace, dtype: str) -> dict:
    cmd = [str(exe), dtype, str(a.rows), str(a.kv_heads), str(a.head_dim), str(a.blocks),
           str(int(a.pf_l2)), str(int(not a.no_prefetch)), str(a.seconds)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise UsageError(r.stderr.strip() or f"{exe.name} exited {r.returncode}")
    return json.loads(r.stdout)


def measure(a: argparse.Namespace, dtype: str, work: Path) -> dict:
    exes = build(a.cc, dtype, work, a.jobs)
    samples: dict[str, list[float]] = {k: [] for k in exes}
    clock = []
    for i in range(a.repeat):  # interleaved, the order rotating
        names = list(exes)
        names = names[i % len(names):] + names[:i % len(names)]
        for name in names:
            r = run(exes[name], a, dtype)
            samples[name].append(r["cycles_per_key_head"])
            clock.append(r["clock_ghz"])
    med = {k: statistics.median(v) for k, v in samples.items()}
    whole = med["block"]
    phases = {"scores": whole - med["no scores"], "softmax": whole - med["no softmax"],
              "P.V": whole - med["no P.V"]}
    phases["rest"] = whole - sum(phases.values())
    return {"dtype": dtype, "rows_per_head": a.rows, "kv_heads": a.kv_heads,
            "head_dim": a.head_dim, "blocks": a.blocks, "pf_l2": a.pf_l2,
            "prefetch": not a.no_prefetch, "repeat": a.repeat,
            "clock_ghz": round(statistics.median(clock), 3),
            "cycles_per_key_head": {k: round(v, 2) for k, v in med.items()},
            "spread": {k: round(max(v) - min(v), 2) for k, v in samples.items()},
            "phases": {k: round(v, 2) for k, v in phases.items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="iq",
                   help="comma-separated: f32, f16, bf16, i8 (float Q), iq (int8 Q)")
    p.add_argument("--rows", type=int, default=4, help="query rows per kv head (1, 2, 4, 8, 16)")
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--blocks", type=int, default=16, help="distinct 32-key blocks cycled through")
    p.add_argument("--pf-l2", action="store_true", help="cross prefetches to L2 (prefetcht1)")
    p.add_argument("--no-prefetch", action="store_true", help="no cross prefetches")
    p.add_argument("--seconds", type=float, default=0.3, help="timed seconds per run")
    p.add_argument("--repeat", type=int, default=3, help="interleaved runs per build (median)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiles")
    p.add_argument("--cc", default=os.environ.get("CC", "cc"))
    p.add_argument("--json", metavar="PATH", help="write the results here ('-': stdout)")
    a = p.parse_args(argv)
    try:
        dtypes = [d.strip() for d in a.dtype.split(",") if d.strip()]
        bad = [d for d in dtypes if d not in DTYPE_FILE]
        if bad or not dtypes:
            raise UsageError(f"unknown dtype {bad or a.dtype!r}: "
                             f"choose from {', '.join(DTYPE_FILE)}")
        if (a.rows not in (1, 2, 4, 8, 16) or a.kv_heads < 1 or a.head_dim < 16
                or a.head_dim % 16 or a.head_dim > 256 or a.blocks < 1 or a.repeat < 1
                or a.seconds <= 0 or a.jobs < 1):
            raise UsageError("rows 1/2/4/8/16, head_dim a multiple of 16 up to 256, "
                             "counts positive")
        if shutil.which(a.cc) is None:
            raise UsageError(f"no C compiler {a.cc!r} (set $CC or --cc)")
        results = []
        with tempfile.TemporaryDirectory(prefix="block_cycles_") as tmp:
            for dt in dtypes:
                work = Path(tmp) / dt
                work.mkdir()
                print(f"building and timing {dt} ...", file=sys.stderr)
                results.append(measure(a, dt, work))
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args = argv if argv is not None else sys.argv[1:]
    doc = {"command": " ".join(["python benchmarks/block_cycles.py", *args]), "results": results}
    if a.json:
        text = json.dumps(doc, indent=2) + "\n"
        if a.json == "-":
            sys.stdout.write(text)
            return 0
        Path(a.json).write_text(text)
    for r in results:
        c, ph = r["cycles_per_key_head"], r["phases"]
        print(f"{r['dtype']}: R={r['rows_per_head']} kv_heads={r['kv_heads']} "
              f"head_dim={r['head_dim']} blocks={r['blocks']} pf_l2={int(r['pf_l2'])} "
              f"prefetch={int(r['prefetch'])} @ {r['clock_ghz']} GHz, "
              f"cycles per (key, kv head), median of {r['repeat']}:")
        print(f"  block {c['block']:.1f} = scores {ph['scores']:.1f} + softmax "
              f"{ph['softmax']:.1f} + P.V {ph['P.V']:.1f} + rest {ph['rest']:.1f}   "
              f"(without: scores {c['no scores']:.1f}, softmax {c['no softmax']:.1f}, "
              f"P.V {c['no P.V']:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
