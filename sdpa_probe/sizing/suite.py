"""`probe check --suite cache-sizing`: ring and sink caches sized by simulation (each
policy's verdict against the closed form's prediction, the closed form over a grid),
then ExecuTorch PR 15610's arithmetic (align_up, every kernel's per-thread scratch
under the guarded allocator, the per-block dequant buffers)."""

from __future__ import annotations

import time

from .. import native
from ..errors import SdpaUnsupported
from .align import align_up_exact, align_up_wrong_mask, check_align_up
from .cache_workload import CacheWorkload, closed_form_minimum
from .guard import guard_selftest
from .memory import KVShape
from .policies import POLICIES, Policy, policy_size
from .report import judge
from .scratch import (
    SHAPES,
    WASTE_LIMIT,
    ScratchShape,
    measure_scratch,
    per_block_dequant_sizing,
)
from .simulator import Simulator

SUITE_WORKLOADS = (CacheWorkload(16, 24), CacheWorkload(16, 24, sink=4),
                   CacheWorkload(16, 24, sink=4, context=40))
# (window, sink, chunk, context) whose simulated minimum must equal the closed form
SUITE_GRID = tuple((w, s, c, n) for w in (1, 3, 8) for s in (0, 2) for c in (1, 4, 9)
                   for n in ((None, 12) if c == 9 else (None,)))


def expected_verdict(size: int, wl: CacheWorkload) -> str:
    """What the closed form predicts for a cache of `size` slots."""
    cf = closed_form_minimum(wl.window, wl.sink, wl.chunk, wl.context)
    if size < cf:
        return "undersized"
    if wl.context is not None and size > wl.context:
        return "exceeds-full-context"
    return "exact" if size == cf else "oversized"


def _case(case: str, ok: bool, reason: str, err: float | None, t0: float) -> dict:
    return {"case": case, "status": "pass" if ok else "fail", "reason": reason,
            "max_abs_err": err, "seconds": time.perf_counter() - t0}


# ---- ring and sink caches -----------------------------------------------------------

def _sizes_to_judge(wl: CacheWorkload, sim: Simulator, m: int) -> dict[int, list[str]]:
    """Every policy's size, one slot under the minimum, and a cache that never evicts:
    size -> the names that pick it."""
    sizes: dict[int, list[str]] = {}
    for pol in POLICIES.values():
        sizes.setdefault(policy_size(pol, wl, sim), []).append(pol.name)
    sizes.setdefault(m - 1, []).append("minimum - 1")
    if wl.context is None:
        sizes.setdefault(wl.horizon, []).append("no eviction (a slot per simulated position)")
    else:
        sizes.setdefault(wl.context, []).append("full-context cache")
    return sizes


def _workload_cases(wl: CacheWorkload, kernel_name: str) -> list[dict]:
    cases = []
    t0 = time.perf_counter()
    sim = Simulator(wl, kernel_name)
    cf = closed_form_minimum(wl.window, wl.sink, wl.chunk, wl.context)
    m = sim.minimum()
    res = sim.run(m)
    cases.append(_case(
        f"{wl.id}-minimum", m == cf and res.exact,
        f"simulated minimum {m} slots, closed form min(N, S + W + C - 1) = {cf}",
        res.max_err, t0))
    sizes = _sizes_to_judge(wl, sim, m)
    shape = KVShape()
    for size in sorted(sizes):
        t0 = time.perf_counter()
        if size < 1:
            continue
        r = sim.run(size)
        got = judge(size, r, m, wl, shape, Policy("/".join(sizes[size]), None, "")).verdict
        want = expected_verdict(size, wl)
        ok = got == want and r.agree
        reason = f"{', '.join(sizes[size])}: {got}"
        if not r.exact:
            reason += (f" (wrong at position {r.position} under {r.schedule}; the slot map "
                       f"first misses a key at {r.missing_position})")
        if got != want:
            reason += f"; the closed form predicts {want}"
        if not r.agree:
            reason += "; outputs and slot map disagree"
        cases.append(_case(f"{wl.id}-size{size}", ok, reason, r.max_err, t0))
    return cases


def _grid_case(kernel_name: str) -> dict:
    t0 = time.perf_counter()
    bad, err = [], 0.0
    for w, s, c, n in SUITE_GRID:
        wl = CacheWorkload(w, c, sink=s, context=n)
        sim = Simulator(wl, kernel_name)
        m = sim.minimum()
        cf = closed_form_minimum(w, s, c, n)
        below = sim.run(m - 1) if m > 1 else None
        err = max(err, sim.run(m).max_err)
        if m != cf or (below is not None and (below.exact or not below.agree)):
            bad.append(f"{wl.id}: simulated {m}, closed form {cf}")
    reason = (f"{len(SUITE_GRID)} (window, sink, chunk, context) workloads: simulated minimum "
              "== min(N, S + W + C - 1), and one slot less is wrong" if not bad
              else "; ".join(bad))
    return _case("closed-form-grid", not bad, reason, err, t0)


# ---- alignment and scratch ------------------------------------------------------------

def _align_cases() -> list[dict]:
    t0 = time.perf_counter()
    ar = check_align_up()
    reason = (f"{ar.checked} (x, a) pairs equal exact arithmetic; bad a, negative x and "
              "overflow give -1" if ar.ok else
              f"mismatches {ar.mismatches[:3]}, reject failures {ar.reject_failures[:3]}")
    cases = [_case("align-up-native-grid", ar.ok, reason, None, t0)]

    t0 = time.perf_counter()
    all_wrong = all(s["wrong"] > 0 for s in ar.wrong_mask)
    a32 = next(s for s in ar.wrong_mask if s["align"] == 32)
    ex = a32["example"]
    plus_one = all(align_up_wrong_mask(x, a) == align_up_exact(x, a) + (x % 2 == 0)
                   for a in (2, 4, 32, 4096) for x in range(0, 600))
    all_wrong = all_wrong and plus_one
    reason = (f"(x + a - 1) & -(a - 1) is wrong for every alignment 1..4096 (a=32: "
              f"{a32['wrong']} of {a32['checked']} x, e.g. x={ex['x']} -> {ex['wrong_mask']}, "
              f"want {ex['exact']}): the exact result + 1 for every even x when a >= 2 "
              "(never below x, never aligned), 0 for a = 1")
    cases.append(_case("align-up-wrong-mask-expression", all_wrong, reason, None, t0))
    return cases


def _kernel_scratch_case(name: str, sh: ScratchShape) -> dict:
    t0 = time.perf_counter()
    try:
        rep = measure_scratch(name, sh)
    except SdpaUnsupported:  # (a kernel this build or CPU cannot run: flash_bf16 without AMX)
        return {"case": f"scratch-{name}-{sh.name}", "status": "unsupported",
                "reason": native.refused_reason(native.get_kernel(name)),
                "max_abs_err": None, "seconds": time.perf_counter() - t0}
    sc = next((b for b in rep.blocks if b.kind == "per-thread scratch"), None)
    if rep.ok:
        reason = (f"asks {rep.asked} B/thread, writes up to {sc.high_water} B "
                  f"({100 * sc.waste:.0f}% unused), no overrun" if sc else
                  "no per-thread scratch, no overrun")
        dq = next((b for b in rep.blocks if b.kind == "dequant block"), None)
        if dq:
            reason += (f"; {dq.count} per-block dequant buffers of {dq.bytes} B, "
                       f"written to {dq.high_water} B")
        ot = next((b for b in rep.blocks if b.kind == "other"), None)
        if ot and ot.waste > WASTE_LIMIT:
            reason += (f"; note: its largest other allocation ({ot.bytes} B, e.g. a "
                       f"worst-case mask plan) is written only to {ot.high_water} B")
    else:
        reason = "; ".join(rep.problems)
    return _case(f"scratch-{name}-{sh.name}", rep.ok, reason, rep.max_abs_err, t0)


def scratch_cases(kernels: list[str] | None = None) -> list[dict]:
    """align_up, the guard's self-test, every kernel's scratch on a few shapes, and the
    per-block dequant buffers' sizing."""
    cases = _align_cases()
    t0 = time.perf_counter()
    st = guard_selftest()
    bad = [w for w, _, ok in st if not ok]
    cases.append(_case("scratch-guard-selftest", not bad,
                       "guard sees in-bounds writes, 1-byte overrun and underrun, partial "
                       "writes" if not bad else f"guard missed: {', '.join(bad)}", None, t0))
    for name in kernels or list(native.builtin_kernels()):
        for sh in SHAPES:
            cases.append(_kernel_scratch_case(name, sh))

    t0 = time.perf_counter()
    pb = per_block_dequant_sizing()
    ok = (pb["per_block_waste"] > WASTE_LIMIT and pb["fixed_waste"] == 0.0
          and pb["overrun"] == 0 and pb["dequant_blocks"] > 0)
    reason = (f"a dequantised key block writes {pb['touched']} B; ExecuTorch PR 15610 asks "
              f"{pb['per_block_bytes']} B (qSplitSize x kvSplitSize x headSize: "
              f"{100 * pb['per_block_waste']:.1f}% waste, flagged), the review's "
              f"kvSplitSize x headSize = {pb['fixed_bytes']} B is exact")
    cases.append(_case("per-block-dequant-buffer-sizing", ok, reason, pb["max_abs_err"], t0))
    return cases


def run_suite(kernel_name: str = "flash") -> list[dict]:
    """`probe check --suite cache-sizing`: ring and sink caches sized by simulation through
    `kernel_name`, the closed form over a grid, then ExecuTorch PR 15610's arithmetic
    (align_up, every kernel's per-thread scratch under the guarded allocator)."""
    cases: list[dict] = []
    for wl in SUITE_WORKLOADS:
        cases += _workload_cases(wl, kernel_name)
    cases.append(_grid_case(kernel_name))
    cases += scratch_cases()
    return cases
