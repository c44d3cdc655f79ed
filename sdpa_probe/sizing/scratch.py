"""Per-thread scratch sizing: every kernel runs with the per-thread scratch it asks for
(`sdpa_probe_kernel_scratch_bytes`) under the guarded allocator, and each of its
blocks is judged for overruns and waste; and the per-block dequant buffers of
ExecuTorch PR 15610's quantized SDPA, whose review found `qSplitSize * kvSplitSize *
headSize` floats allocated where a dequantised key block needs `kvSplitSize *
headSize`."""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from .. import native
from .guard import guarded

WASTE_LIMIT = 0.5  # flag a block when more than half of it is never written

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
    # deferred: torch takes seconds to import
    import torch

    # deferred: the oracle imports torch
    from ..reference import sdpa_reference

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
    # (a kernel whose products round to BF16 errs by some 1e-2 on these unit-scale inputs)
    limit = 3e-2 if "bf16-products" in kern.info.features else 1e-3
    if not np.isfinite(err) or err > limit:
        problems.append(f"output differs from the reference by {err:.3g}")
    alloc = scratch[0].bytes // nt if scratch else None
    return ScratchReport(kernel_name, sh, asked, alloc, blocks, err, problems,
                         time.perf_counter() - t0)


# ---- per-block dequant buffers ------------------------------------------------------

def per_block_dequant_sizing(q_len: int = 64, kv_len: int = 256, head_dim: int = 64,
                             q_split: int = 32, kv_split: int = 128) -> dict:
    """What quant_int8_alloc's per-block dequant buffers really touch, against the
    per-thread size ExecuTorch PR 15610 asked for (qSplitSize * kvSplitSize * headSize
    floats) and the size its review proposed (kvSplitSize * headSize)."""
    sh = ScratchShape("per-block-dequant", q_len, kv_len, head_dim=head_dim)
    rep = measure_scratch("quant_int8_alloc", sh)
    dq = next((b for b in rep.blocks if b.kind == "dequant block"), None)
    touched = dq.high_water if dq else 0
    per_block_bytes = q_split * kv_split * head_dim * 4
    fixed_bytes = kv_split * head_dim * 4
    return {
        "touched": touched,
        "dequant_blocks": dq.count if dq else 0,
        "per_block_bytes": per_block_bytes,
        "per_block_waste": 1.0 - touched / per_block_bytes,
        "fixed_bytes": fixed_bytes,
        "fixed_waste": 1.0 - touched / fixed_bytes,
        "overrun": (dq.overrun + dq.underrun) if dq else 0,
        "max_abs_err": rep.max_abs_err,
        "report": rep,
    }
