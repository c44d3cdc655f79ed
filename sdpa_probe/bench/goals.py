"""The project's own kernel-speed goals (docs/performance.md), evaluated on a bench
document: shown by `probe bench --goals` and recorded by benchmarks/run_bench.py."""

from __future__ import annotations

from .baselines import F32_REFERENCE


def _find(doc: dict, shape: str, kernel: str) -> dict | None:
    for r in doc["results"]:
        if r["shape"] == shape and r["kernel"] == kernel:
            return r
    return None


def check_targets(doc: dict) -> list[dict]:
    """The stated targets, evaluated on a bench document: one entry per target with
    the measured figure, the goal and whether it is met (None: not measured)."""
    out: list[dict] = []
    roof = doc.get("roofline") or {}
    bw = roof.get("read_bw_gbs_all" if doc.get("threads", 2) > 1 else "read_bw_gbs_1t")

    def add(name: str, value: float | None, goal: float, unit: str = "x") -> None:
        out.append({"target": name, "value": None if value is None else round(value, 3),
                    "goal": goal, "unit": unit,
                    "met": None if value is None else bool(value >= goal)})

    def ratio(shape: str, kernel: str, peer: str) -> float | None:
        r = _find(doc, shape, kernel)
        return None if r is None else r["ratio"].get(peer)

    def speedup(shape_a: str, kernel_a: str, shape_b: str, kernel_b: str) -> float | None:
        """How much faster kernel_b on shape_b is than flash F32 (kernel_a on shape_a):
        the ratio measured in the same rounds when the run has it, else across runs."""
        b = _find(doc, shape_b, kernel_b)
        if b is not None and F32_REFERENCE in b["ratio"]:
            return b["ratio"][F32_REFERENCE]
        a = _find(doc, shape_a, kernel_a)
        return None if a is None or b is None else a["median_us"] / b["median_us"]

    d8 = "decode-h32kv8d64-kv8192"
    add("flash f32 decode kv8192 vs torch", ratio(f"{d8}-f32", "flash", "torch"), 2.5)
    r = _find(doc, f"{d8}-f32", "flash")
    # against the read bandwidth measured in the same rounds when the run has it (a
    # noisy machine moves both alike), else the roofline's
    same = None if r is None else r.get("read_gb_s_same_run")
    add("flash f32 decode kv8192: K/V GB/s over the DRAM read bandwidth",
        None if r is None or not (same or bw) else r["kv_gb_s"] / (same or bw), 0.70, "fraction")
    for kv in (512, 2048):
        add(f"flash f32 decode kv{kv} vs torch",
            ratio(f"decode-h32kv8d64-kv{kv}-f32", "flash", "torch"), 1.0)
    add("flash f32 prefill 512 causal vs torch",
        ratio("prefill-h32kv8d64-q512-kv512-causal-f32", "flash", "torch"), 1.0)
    # the int8 and F16 targets name no head shape: both preset shapes are reported
    d16 = "decode-h16kv16d128-kv8192"
    for d, tag in ((d8, ""), (d16, " (16, 16, 128)")):
        add(f"quant_int8 decode kv8192 vs flash f32{tag}",
            speedup(f"{d}-f32", "flash", f"{d}-i8", "quant_int8"), 2.5)
    add("quant_int8 decode kv8192 vs executorch custom_quantized_sdpa",
        ratio(f"{d8}-i8", "quant_int8", "executorch"), 10.0)
    for d, tag in ((d8, ""), (d16, " (16, 16, 128)")):
        add(f"flash f16 decode kv8192 vs flash f32{tag}",
            speedup(f"{d}-f32", "flash", f"{d}-f16", "flash"), 1.7)
    return out


def measured_goals(doc: dict) -> list[dict]:
    """The goals this run measured (none for a user's kernel or other shapes)."""
    return [t for t in check_targets(doc) if t["met"] is not None]
