"""Seed 000's arithmetic: power-of-two alignment and per-thread scratch sizing.

* align_up: the native `sdpa_probe_align_up(x, a)` against exact integer arithmetic
  over a grid of x and power-of-two a, and the expression seed 000 shipped,
  `(x + a - 1) & -(a - 1)`, shown wrong: -(a - 1) is odd, so the mask keeps bit 0
  and the result is the right one plus 1 for every even x (a >= 2), and 0 for
  a = 1. Never below x for a >= 2 (no overrun), but not a multiple of a.
* scratch: every kernel runs with the per-thread scratch it asks for
  (`sdpa_probe_kernel_scratch_bytes`) under the runtime's guarded allocator, which
  fills each block, puts canaries on both sides and, on free, records how far the
  block was written. A write past either end is an overrun; a block whose
  high-water mark stays far below its size is waste (seed 000's review found
  `qSplitSize * kvSplitSize * headSize` floats allocated where a dequantised
  key block needs `kvSplitSize * headSize`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import numpy as np

from . import native

INT64_MAX = (1 << 63) - 1
WASTE_LIMIT = 0.5  # flag a block when more than half of it is never written


# ---- align_up ------------------------------------------------------------------

def align_up_exact(x: int, a: int) -> int:
    """The smallest multiple of a that is >= x."""
    return -(-x // a) * a


def _i64(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >> 63 else v


def align_up_seed000(x: int, a: int) -> int:
    """The expression in seed 000: (x + a - 1) & -(a - 1), in int64."""
    return _i64(_i64(x + a - 1) & _i64(-(a - 1)))


def align_grid() -> tuple[list[int], list[int]]:
    xs = list(range(0, 1025))
    for k in range(10, 63):
        xs += [(1 << k) - 1, 1 << k, (1 << k) + 1]
    xs += [INT64_MAX - (1 << 20), INT64_MAX - 1, INT64_MAX]
    aligns = [1 << k for k in range(0, 21)] + [1 << 40, 1 << 62]
    return sorted(set(xs)), aligns


@dataclasses.dataclass
class AlignReport:
    checked: int
    mismatches: list[tuple[int, int, int, int]]   # (x, a, native, expected)
    rejects_ok: bool                               # -1 for bad a, negative x, overflow
    reject_failures: list[tuple[int, int, int]]
    seed000: list[dict]                            # per alignment: how often the old one is wrong

    @property
    def ok(self) -> bool:
        return not self.mismatches and self.rejects_ok


def check_align_up() -> AlignReport:
    _, lib, _ = native.native_lib()
    xs, aligns = align_grid()
    mismatches, checked = [], 0
    for a in aligns:
        for x in xs:
            want = align_up_exact(x, a) if x <= INT64_MAX - (a - 1) else -1
            got = int(lib.sdpa_probe_align_up(x, a))
            checked += 1
            if got != want:
                mismatches.append((x, a, got, want))
    bad = [(5, 0), (5, -4), (5, 3), (5, 6), (5, 24), (5, 48), (5, 96), (-1, 8),
           (-(1 << 40), 64), (INT64_MAX, 2), (INT64_MAX - 6, 8)]
    reject_failures = [(x, a, int(lib.sdpa_probe_align_up(x, a))) for x, a in bad
                       if int(lib.sdpa_probe_align_up(x, a)) != -1]
    seed = []
    small = [x for x in xs if x <= 1 << 40]
    for a in aligns[:13]:
        wrong = [x for x in small if align_up_seed000(x, a) != align_up_exact(x, a)]
        below = [x for x in wrong if align_up_seed000(x, a) < x]
        ex = wrong[0] if wrong else None
        seed.append({"align": a, "checked": len(small), "wrong": len(wrong),
                     "smaller_than_x": len(below),
                     "example": None if ex is None else
                     {"x": ex, "seed000": align_up_seed000(ex, a),
                      "exact": align_up_exact(ex, a)}})
    return AlignReport(checked, mismatches, not reject_failures, reject_failures, seed)


# ---- the guarded allocator ---------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class AllocRecord:
    seq: int
    bytes: int
    high_water: int   # 1 + offset of the last byte written
    touched: int      # bytes written
    overrun: int      # tail canary bytes changed
    underrun: int     # head canary bytes changed

    @property
    def damaged(self) -> bool:
        return self.overrun > 0 or self.underrun > 0

    @property
    def waste(self) -> float:
        """Share of the block past its high-water mark."""
        return 1.0 - self.high_water / self.bytes if self.bytes else 0.0


def _records(ffi, lib) -> list[AllocRecord]:
    n = int(lib.sdpa_probe_alloc_guard_records(ffi.NULL, 0))
    if n == 0:
        return []
    buf = ffi.new("sdpa_probe_alloc_record[]", n)
    lib.sdpa_probe_alloc_guard_records(buf, n)
    return [AllocRecord(int(r.seq), int(r.bytes), int(r.high_water), int(r.touched),
                        int(r.overrun), int(r.underrun)) for r in buf]


@contextlib.contextmanager
def guarded():
    """Guard every native allocation in the block; yields a list filled with the records
    (in free order) when the block ends."""
    ffi, lib, _ = native.native_lib()
    found: list[AllocRecord] = []
    lib.sdpa_probe_alloc_guard(1)
    try:
        yield found
    finally:
        lib.sdpa_probe_alloc_guard(0)
        found.extend(_records(ffi, lib))


def guard_selftest() -> list[tuple[str, AllocRecord, bool]]:
    """The guard on blocks written in bounds, one byte past the end, one byte before the
    start, and not at all: (what, record, detected as expected)."""
    _, lib, _ = native.native_lib()
    plan = [("in bounds", 100, 0, 100), ("1 byte past the end", 100, 0, 101),
            ("1 byte before the start", 100, -1, 50), ("half written", 256, 0, 128),
            ("untouched", 64, 0, 0)]
    with guarded() as recs:
        for _, n, lo, hi in plan:
            if lib.sdpa_probe_alloc_guard_test(n, lo, hi) != 0:
                raise RuntimeError("sdpa_probe_alloc_guard_test refused a valid request")
    out = []
    for (what, n, lo, hi), r in zip(plan, recs, strict=True):
        ok = (r.bytes == n and r.overrun == max(0, hi - n) and r.underrun == max(0, -lo)
              and r.high_water == min(hi, n) and r.touched == min(hi, n) - max(lo, 0))
        out.append((what, r, ok))
    return out


# ---- kernel scratch ----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ScratchShape:
    name: str
    q_len: int
    kv_len: int
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 64
    kv_dtype: str = "f32"   # f32, f16 (flash kernels); int8 kernels always get int8 K/V
    causal: bool = False
    mask: bool = False
    start_pos: int = 0
    n_threads: int = 1


SHAPES = [
    ScratchShape("prefill-causal-f32", 96, 96, causal=True),
    ScratchShape("prefill-mask-f16", 48, 200, kv_dtype="f16", mask=True),
    ScratchShape("decode-f16", 1, 300, kv_dtype="f16", causal=True, start_pos=299),
    ScratchShape("decode-short-f32", 1, 40, head_dim=16, causal=True, start_pos=39),
    ScratchShape("chunk-gqa4-f16", 20, 260, n_heads=8, n_kv_heads=2, kv_dtype="f16",
                 causal=True, start_pos=240),
]


@dataclasses.dataclass
class BlockVerdict:
    kind: str            # "per-thread scratch", "dequant block", "other"
    count: int
    bytes: int           # largest block of this kind
    high_water: int      # largest high-water mark among them
    waste: float         # 1 - high_water / bytes (of the largest)
    overrun: int         # canary bytes changed, summed
    underrun: int

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class ScratchReport:
    kernel: str
    shape: ScratchShape
    asked: int                 # per-thread scratch the kernel reports
    allocated: int | None      # the scratch block it allocated (None: not found)
    blocks: list[BlockVerdict]
    max_abs_err: float
    problems: list[str]
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["ok"] = self.ok
        return d


def _inputs(kernel: native.Kernel, sh: ScratchShape, rng: np.random.Generator):
    q = rng.standard_normal((1, sh.q_len, sh.n_heads, sh.head_dim)).astype(np.float32)
    k = rng.standard_normal((1, sh.kv_len, sh.n_kv_heads, sh.head_dim)).astype(np.float32)
    v = rng.standard_normal((1, sh.kv_len, sh.n_kv_heads, sh.head_dim)).astype(np.float32)
    int8 = "per-token-i8" in kernel.info.features and "full-scores" not in kernel.info.features
    if int8:
        def quant(x):
            amax = np.abs(x).max(axis=-1)
            scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
            data = np.clip(np.rint(x / scale[..., None]), -127, 127).astype(np.int8)
            return (native.QuantTensor(data, scale, None),
                    data.astype(np.float64) * scale[..., None].astype(np.float64))
        (kk, kr), (vv, vr) = quant(k), quant(v)
    elif sh.kv_dtype == "f16":
        kk, vv = k.astype(np.float16), v.astype(np.float16)
        kr, vr = kk.astype(np.float64), vv.astype(np.float64)
    else:
        kk, vv, kr, vr = k, v, k.astype(np.float64), v.astype(np.float64)
    mask = None
    if sh.mask:  # a sliding-window style mask with a hidden band
        i = np.arange(sh.q_len)[:, None] + (sh.kv_len - sh.q_len)
        j = np.arange(sh.kv_len)[None, :]
        mask = np.where((j <= i) & (i - j < 64), 0.0, -np.inf).astype(np.float32)
    return q, kk, vv, kr, vr, mask


def measure_scratch(kernel_name: str, sh: ScratchShape, seed: int = 0) -> ScratchReport:
    """Run one kernel on one shape under the guard; judge its per-thread scratch."""
    import torch

    from .reference import sdpa_reference

    t0 = time.perf_counter()
    kern = native.get_kernel(kernel_name)
    rng = np.random.default_rng(seed)
    q, kk, vv, kr, vr, mask = _inputs(kern, sh, rng)
    out = np.zeros_like(q)
    kw = dict(mask=mask, is_causal=sh.causal, start_pos=sh.start_pos, n_threads=sh.n_threads)
    call = native.prepare(kern.ffi, q, kk, vv, out, **kw)
    asked = kern.scratch_bytes(call.args)
    with guarded() as recs:
        native.raise_for_status(kern.forward_args(call.args), kern.name)
    ref = sdpa_reference(torch.from_numpy(q), torch.from_numpy(kr), torch.from_numpy(vr),
                         mask=None if mask is None else torch.from_numpy(mask),
                         is_causal=sh.causal, start_pos=sh.start_pos)[0].numpy()
    err = float(np.abs(out[0] - ref).max())

    nt = sh.n_threads
    problems: list[str] = []
    scratch = [r for r in recs if asked > 0 and r.bytes == asked * nt]
    rest = [r for r in recs if r not in scratch]
    alloc_per_block = "alloc-per-block" in kern.info.features
    dq = [r for r in rest if alloc_per_block and r.bytes % (4 * sh.head_dim) == 0
          and r.bytes // (4 * sh.head_dim) <= 128]
    other = [r for r in rest if r not in dq]
    blocks = []
    for kind, group in (("per-thread scratch", scratch), ("dequant block", dq),
                        ("other", other)):
        if not group:
            continue
        big = max(group, key=lambda r: r.bytes)
        hw = max(r.high_water for r in group if r.bytes == big.bytes)
        blocks.append(BlockVerdict(kind, len(group), big.bytes, hw,
                                   1.0 - hw / big.bytes if big.bytes else 0.0,
                                   sum(r.overrun for r in group),
                                   sum(r.underrun for r in group)))
    for r in recs:
        if r.damaged:
            problems.append(f"overrun: a {r.bytes}-byte block was written {r.overrun} bytes past "
                            f"its end / {r.underrun} before its start")
    if asked > 0 and not scratch:
        sizes = sorted({r.bytes for r in recs})
        problems.append(f"no allocation of the {asked} x {nt} scratch bytes the kernel asks for "
                        f"(allocated: {sizes})")
    for b in blocks:
        # with several threads the block is one slice per thread and the high-water mark only
        # tells where the last slice used ends: waste is judged with n_threads = 1
        if b.kind == "other" or (b.kind == "per-thread scratch" and nt > 1):
            continue
        if b.waste > WASTE_LIMIT:
            problems.append(f"waste: {b.kind} of {b.bytes} bytes written only up to "
                            f"{b.high_water} ({100 * b.waste:.0f}% never touched)")
    if not np.isfinite(err) or err > 1e-3:
        problems.append(f"output differs from the reference by {err:.3g}")
    alloc = scratch[0].bytes // nt if scratch else None
    return ScratchReport(kernel_name, sh, asked, alloc, blocks, err, problems,
                         time.perf_counter() - t0)


# ---- seed 000's dequant buffer sizing ---------------------------------------------------

def seed000_qdq(q_len: int = 64, kv_len: int = 256, head_dim: int = 64,
                q_split: int = 32, kv_split: int = 128) -> dict:
    """What quant_int8_alloc's per-block dequant buffers really touch, against the per-thread
    size seed 000 asked for (qSplitSize * kvSplitSize * headSize floats) and the size its
    review proposed (kvSplitSize * headSize)."""
    sh = ScratchShape("seed000", q_len, kv_len, head_dim=head_dim)
    rep = measure_scratch("quant_int8_alloc", sh)
    dq = next((b for b in rep.blocks if b.kind == "dequant block"), None)
    touched = dq.high_water if dq else 0
    seed_bytes = q_split * kv_split * head_dim * 4
    fixed_bytes = kv_split * head_dim * 4
    return {
        "touched": touched,
        "dequant_blocks": dq.count if dq else 0,
        "seed000_bytes": seed_bytes,
        "seed000_waste": 1.0 - touched / seed_bytes,
        "fixed_bytes": fixed_bytes,
        "fixed_waste": 1.0 - touched / fixed_bytes,
        "overrun": (dq.overrun + dq.underrun) if dq else 0,
        "max_abs_err": rep.max_abs_err,
        "report": rep,
    }


# ---- the suite --------------------------------------------------------------------------

def _case(case: str, ok: bool, reason: str, err: float | None, t0: float) -> dict:
    return {"case": case, "status": "pass" if ok else "fail", "reason": reason,
            "max_abs_err": err, "seconds": time.perf_counter() - t0}


def run_suite(kernels: list[str] | None = None) -> list[dict]:
    """align_up, the guard's self-test, every kernel's scratch on a few shapes, seed 000's
    dequant sizing."""
    cases = []
    t0 = time.perf_counter()
    ar = check_align_up()
    reason = (f"{ar.checked} (x, a) pairs equal exact arithmetic; bad a, negative x and "
              "overflow give -1" if ar.ok else
              f"mismatches {ar.mismatches[:3]}, reject failures {ar.reject_failures[:3]}")
    cases.append(_case("align-up-native-grid", ar.ok, reason, None, t0))

    t0 = time.perf_counter()
    all_wrong = all(s["wrong"] > 0 for s in ar.seed000)
    a32 = next(s for s in ar.seed000 if s["align"] == 32)
    ex = a32["example"]
    plus_one = all(align_up_seed000(x, a) == align_up_exact(x, a) + (x % 2 == 0)
                   for a in (2, 4, 32, 4096) for x in range(0, 600))
    all_wrong = all_wrong and plus_one
    reason = (f"(x + a - 1) & -(a - 1) is wrong for every alignment 1..4096 (a=32: "
              f"{a32['wrong']} of {a32['checked']} x, e.g. x={ex['x']} -> {ex['seed000']}, "
              f"want {ex['exact']}): the exact result + 1 for every even x when a >= 2 "
              "(never below x, never aligned), 0 for a = 1")
    cases.append(_case("align-up-seed000-expression-wrong", all_wrong, reason, None, t0))

    t0 = time.perf_counter()
    st = guard_selftest()
    bad = [w for w, _, ok in st if not ok]
    cases.append(_case("scratch-guard-selftest", not bad,
                       "guard sees in-bounds writes, 1-byte overrun and underrun, partial "
                       "writes" if not bad else f"guard missed: {', '.join(bad)}", None, t0))

    names = kernels or list(native.builtin_kernels())
    for name in names:
        for sh in SHAPES:
            t0 = time.perf_counter()
            rep = measure_scratch(name, sh)
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
            cases.append(_case(f"scratch-{name}-{sh.name}", rep.ok, reason, rep.max_abs_err,
                               t0))

    t0 = time.perf_counter()
    s0 = seed000_qdq()
    ok = (s0["seed000_waste"] > WASTE_LIMIT and s0["fixed_waste"] == 0.0
          and s0["overrun"] == 0 and s0["dequant_blocks"] > 0)
    reason = (f"a dequantised key block writes {s0['touched']} B; seed 000 asks "
              f"{s0['seed000_bytes']} B (qSplitSize x kvSplitSize x headSize: "
              f"{100 * s0['seed000_waste']:.1f}% waste, flagged), the review's "
              f"kvSplitSize x headSize = {s0['fixed_bytes']} B is exact")
    cases.append(_case("seed000-qdq-buffer-sizing", ok, reason, s0["max_abs_err"], t0))
    return cases
