"""The figures a bench result reports beside its median: GB/s, GFLOP/s, % of the
DRAM read bandwidth and % of the roofline bound (`probe info`), the same against the
benchmarks timed in the same rounds, and the core limit of a decode (its time
against the same kernel with K / V in L2)."""

from __future__ import annotations

from .baselines import F32_REFERENCE
from .shapes import Shape

# A decode call within this factor of its L2-resident time is limited by the core
# (its arithmetic, conversions, overheads), not by where K and V come from.
CORE_LIMIT_SLACK = 1.15


def core_lengths(shape: Shape, l2_bytes: int | None) -> tuple[int, int] | None:
    """Two context lengths of a decode shape whose K / V fit in half the L2s, for
    the L2-resident time per key (the slope between them leaves the call's fixed
    costs out); None when the shape is not a longer decode or there is no L2 size."""
    if shape.kind != "decode" or not l2_bytes:
        return None
    per_key = shape.kv_bytes / shape.kv_len
    kv2 = int(l2_bytes / 2 // per_key) // 64 * 64
    # a quarter of that, or 64 keys for wide positions (16 KiB a key at (16, 16, 128)
    # F32: 64 and 128 keys), whose L2-resident lengths are short
    kv1 = max(64, kv2 // 4 // 64 * 64)
    if kv2 - kv1 < 64 or shape.kv_len <= kv2:
        return None
    return kv1, kv2


def core_party_name(kernel: str, kv_len: int) -> str:
    return f"{kernel}@kv{kv_len}"


def core_limit(median_us: float, kv_len: int, lengths: tuple[int, int],
               t1_us: float, t2_us: float) -> tuple[float, str]:
    """The L2-resident time extrapolated to kv_len from the two short runs, and
    whether the call is within CORE_LIMIT_SLACK of it ("core") or not ("memory")."""
    kv1, kv2 = lengths
    core_us = t1_us + (t2_us - t1_us) * (kv_len - kv1) / (kv2 - kv1)
    return core_us, ("core" if median_us <= CORE_LIMIT_SLACK * core_us else "memory")


def ratio_columns(doc: dict) -> list[str]:
    """The peers of a bench document, then F32_REFERENCE if any result has it."""
    cols = list(doc["peers"])
    if any(F32_REFERENCE in r["ratio"] for r in doc["results"]):
        cols.append(F32_REFERENCE)
    return cols

def roofline_figures(shape: Shape, stats: dict, roof: dict | None, threads: int) -> dict:
    t = stats["median_us"] * 1e-6
    gb_s = shape.bytes / t / 1e9
    out = {"gb_s": round(gb_s, 2), "kv_gb_s": round(shape.kv_bytes / t / 1e9, 2),
           "gflops": round(shape.flops / t / 1e9, 2), "dram_pct": None, "roofline_pct": None,
           "bound": None}
    if roof:
        n = "all" if threads > 1 else "1t"
        bw = roof.get("read_bw_gbs_all" if threads > 1 else "read_bw_gbs_1t")
        fl = roof.get("fma_gflops_all" if threads > 1 else "fma_gflops_1t")
        cvt = roof.get(f"cvt_{shape.dtype}_gelems_{n}") if shape.dtype != "f32" else None
        if bw and fl:
            # the slowest of: reading the bytes, the multiply-adds, converting K and V to F32
            bounds = {"memory": shape.bytes / (bw * 1e9), "compute": shape.flops / (fl * 1e9)}
            if cvt:
                bounds["conversion"] = shape.kv_elements / (cvt * 1e9)
            bound = max(bounds, key=bounds.get)
            out["dram_pct"] = round(100.0 * gb_s / bw, 1)
            out["roofline_pct"] = round(100.0 * bounds[bound] / t, 1)
            out["bound"] = bound
    return out



def same_run_read(shape: Shape, stats: dict, read_gb_s: float | None) -> dict:
    """The DRAM read bandwidth measured in the same rounds, and the kernel's share of it."""
    if not read_gb_s:
        return {"read_gb_s_same_run": None, "dram_pct_same_run": None}
    gb_s = shape.bytes / (stats["median_us"] * 1e-6) / 1e9
    return {"read_gb_s_same_run": round(read_gb_s, 2),
            "dram_pct_same_run": round(100.0 * gb_s / read_gb_s, 1)}


def same_run_fma(gflops: float, roof: dict | None, threads: int) -> dict:
    """The F32 FMA rate measured in the same rounds, and its share of probe info's."""
    peak = (roof or {}).get("fma_gflops_all" if threads > 1 else "fma_gflops_1t")
    return {"fma_gflops_same_run": round(gflops, 1),
            "fma_pct_same_run": round(100.0 * gflops / peak, 1) if peak else None}

