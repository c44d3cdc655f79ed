"""The numbers of a profile: per-op and per-kind medians with bytes, FLOPs and the
share of the step; the A/B verdict; growth per 1000 tokens of a context sweep."""

from __future__ import annotations

import os

import numpy as np

from .. import machine
from . import graph, stats
from .measure import Run
from .settings import Settings


def roofline_numbers(s: Settings) -> dict | None:
    if not s.roofline:
        return None
    try:
        r = machine.roofline()
    except Exception:  # noqa: BLE001 -- a missing roofline only drops a column
        return None
    one = s.threads == 1 or (s.threads == 0 and (os.cpu_count() or 1) == 1)
    bw = r.get("read_bw_gbs_1t" if one else "read_bw_gbs_all")
    fl = r.get("fma_gflops_1t" if one else "fma_gflops_all")
    if not bw or not fl:
        return None
    return {"read_bw_gbs": float(bw), "fma_gflops": float(fl),
            "threads": "1t" if one else "all", "cached": r.get("cached")}


def summarize(run: Run, s: Settings, record_ns: float, roof: dict | None) -> dict:
    rec = run.records()                            # [steps, n_ops, 4]
    wall = np.asarray(run.wall_ns, np.float64) / 1e6
    dur = rec[:, :, 1].astype(np.float64) / 1e6
    names: list[str] = []
    idx: dict[str, list[int]] = {}
    for i, op in enumerate(run.ops):
        if op.name not in idx:
            names.append(op.name)
            idx[op.name] = []
        idx[op.name].append(i)
    step_med = stats.median(wall)
    L = run.context + 1
    ops = []
    for name in names:
        ii = idx[name]
        t = dur[:, ii].sum(axis=1)
        kind = run.ops[ii[0]].kind
        b1, f1 = graph.op_cost(name, s.shape, L, s.weights, s.cache)
        nb, nf = b1 * len(ii), f1 * len(ii)
        med = stats.median(t)
        sec = med / 1e3
        gbs = nb / sec / 1e9 if sec > 0 else float("nan")
        gfs = nf / sec / 1e9 if sec > 0 else float("nan")
        roof_pct = None
        if roof and sec > 0:
            bound = max(nb / (roof["read_bw_gbs"] * 1e9), nf / (roof["fma_gflops"] * 1e9))
            roof_pct = 100.0 * bound / sec
        ops.append({
            "name": name, "kind": kind, "calls": len(ii),
            "median_ms": med, "iqr_ms": stats.iqr(t), "mean_ms": float(t.mean()),
            "share": med / step_med if step_med > 0 else float("nan"),
            "bytes": nb, "flops": nf, "gb_s": gbs, "gflop_s": gfs, "roofline_pct": roof_pct,
            "allocs_per_step": stats.median(rec[:, ii, 2].sum(axis=1)),
            "alloc_bytes_per_step": stats.median(rec[:, ii, 3].sum(axis=1)),
            "description": graph.DESCRIPTIONS.get(name, ""),
        })
    ops.sort(key=lambda o: -o["median_ms"])
    kinds: dict[str, np.ndarray] = {}
    for i, op in enumerate(run.ops):
        kinds[op.kind] = kinds.get(op.kind, 0) + dur[:, i]
    kind_rows = sorted(({"kind": k, "median_ms": stats.median(v), "iqr_ms": stats.iqr(v),
                         "share": stats.median(v) / step_med if step_med > 0 else float("nan"),
                         "ops": [o["name"] for o in ops if o["kind"] == k]}
                        for k, v in kinds.items()), key=lambda r: -r["median_ms"])
    op_sum = dur.sum(axis=1)
    unattr = wall - op_sum
    overhead_ms = len(run.ops) * record_ns / 1e6
    untimed = np.asarray(run.untimed_ns, np.float64) / 1e6
    return {
        "attention": run.attention.label, "kernel": run.attention.kernel,
        "context": run.context, "kv_len": L, "steps": len(run.wall_ns),
        "step_ms": {"median": step_med, "iqr": stats.iqr(wall), "mean": float(wall.mean()),
                    "min": float(wall.min())},
        "native_step_ms": stats.median(np.asarray(run.native_ns, np.float64) / 1e6),
        "tokens_per_s": 1000.0 / step_med if step_med > 0 else float("nan"),
        "op_sum_ms": stats.median(op_sum),
        "op_sum_share": stats.median(op_sum / wall),
        "unattributed_ms": stats.median(unattr),
        "unattributed_share": stats.median(unattr) / step_med if step_med > 0 else float("nan"),
        "overhead_ms": overhead_ms,
        "overhead_pct": 100.0 * overhead_ms / step_med if step_med > 0 else float("nan"),
        # an upper bound: all time outside the ops plus the calibrated bookkeeping
        "overhead_upper_ms": max(stats.median(unattr), 0.0) + overhead_ms,
        "overhead_upper_pct": (100.0 * (max(stats.median(unattr), 0.0) + overhead_ms) / step_med
                               if step_med > 0 else float("nan")),
        "untimed_step_ms": stats.median(untimed) if untimed.size else None,
        "untimed_steps": int(untimed.size),
        "n_ops_per_step": len(run.ops), "record_cost_ns": record_ns,
        "allocs_per_step": stats.median(rec[:, :, 2].sum(axis=1)),
        "alloc_bytes_per_step": stats.median(rec[:, :, 3].sum(axis=1)),
        "ops": ops, "kinds": kind_rows,
    }


def ab_summary(ra: Run, rb: Run) -> dict:
    ratio, lo, hi = stats.bootstrap_ratio_ci(ra.wall_ns, rb.wall_ns)
    v = stats.verdict(lo, hi)
    a, b = ra.attention.label, rb.attention.label
    if v == "faster":
        text = f"{b} is {ratio:.2f}x faster than {a}"
    elif v == "slower":
        text = f"{b} is {1 / ratio:.2f}x slower than {a}"
    else:
        text = f"no significant difference between {a} and {b}"
    return {"a": a, "b": b, "context": ra.context,
            "a_ms": stats.median(np.asarray(ra.wall_ns) / 1e6),
            "b_ms": stats.median(np.asarray(rb.wall_ns) / 1e6),
            "ratio": ratio, "ci": [lo, hi], "confidence": 0.95, "verdict": v,
            "summary": text}


def growth(summaries: list[dict]) -> list[dict]:
    """Per op: ms at each context and the least-squares growth per 1000 tokens."""
    ctx = [sm["context"] for sm in summaries]
    by_name: dict[str, dict] = {}
    for sm in summaries:
        for op in sm["ops"]:
            e = by_name.setdefault(op["name"], {"name": op["name"], "kind": op["kind"],
                                                "ms": {}})
            e["ms"][sm["context"]] = op["median_ms"]
    rows = []
    for e in by_name.values():
        xs = [c for c in ctx if c in e["ms"]]
        ys = [e["ms"][c] for c in xs]
        rows.append({"name": e["name"], "kind": e["kind"],
                     "ms_by_context": {str(c): e["ms"][c] for c in xs},
                     "per_1000_tokens_ms": stats.slope_per_1000(xs, ys)})
    step = {"name": "step", "kind": "total",
            "ms_by_context": {str(sm["context"]): sm["step_ms"]["median"] for sm in summaries},
            "per_1000_tokens_ms": stats.slope_per_1000(
                ctx, [sm["step_ms"]["median"] for sm in summaries])}
    rows.sort(key=lambda r: -(r["per_1000_tokens_ms"]
                              if np.isfinite(r["per_1000_tokens_ms"]) else -1e30))
    return [step] + rows

