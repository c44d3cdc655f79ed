#!/usr/bin/env python3
"""The errors beside `probe bench`'s BF16 prefill times: each party's max abs error
against the float64 oracle on the bench shape's geometry, judged as `probe check`
judges a case (check.calls.run_one), with torch's own BF16 error on the same inputs.

    python benchmarks/bf16_prefill_errors.py                      # (32, 8, 64) q 512 causal
    python benchmarks/bf16_prefill_errors.py --heads 16 --kv-heads 16 --head-dim 128

A measurement, not a test; docs/performance.md quotes it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout
from sdpa_probe.backends import registry  # noqa: E402
from sdpa_probe.cases import Case  # noqa: E402
from sdpa_probe.check.calls import run_one  # noqa: E402
from sdpa_probe.oracle import for_products, prepare_case  # noqa: E402

# the parties of each dtype: ours at F32 and with BF16 products, torch, OpenVINO's CPU plugin
PARTIES = {"f32": ["flash", "flash_bf16", "torch", "openvino"],
           "bf16": ["flash", "flash_bf16", "torch", "openvino-bf16"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--len", type=int, default=512, help="q_len = kv_len, causal")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    print(f"{'dtype':6} {'party':14} {'status':12} {'max abs err':>12} {'torch BF16 err':>15}")
    for dtype, parties in PARTIES.items():
        case = Case("prefill", n_heads=args.heads, n_kv_heads=args.kv_heads, q_len=args.len,
                    kv_len=args.len, head_dim=args.head_dim, dtype=dtype, causal=True,
                    n_threads=args.threads)
        prep = prepare_case(case)
        torch_bf16 = for_products(prep, "bf16").torch_err
        for name in parties:
            rec = run_one(registry.make(name), case, prep)
            err = rec["max_abs_err"]
            print(f"{dtype:6} {name:14} {rec['status']:12} "
                  f"{'-' if err is None else format(err, '.3g'):>12} {torch_bf16:>15.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
