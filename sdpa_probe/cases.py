"""The case matrix. A case is data: parameters, a seed, a stable id that is
also its pytest id and `-k` filter, a tolerance, FLOP and byte counts. The
same objects feed `probe check`, pytest, golden data and benchmarks."""

from __future__ import annotations

import dataclasses
import math

from .workload import ITEMSIZE, Workload

DTYPES = ("f32", "f16", "bf16", "i8")
# mask recipes that make no mask, only change input values (inputs.materialise)
VALUE_RECIPES = ("constant-token", "zero-tokens", "nan-inputs")
# zero-tokens: V all zero at every ZERO_ROWS_EVERY-th key from ZERO_ROWS_FIRST (padding, a
# cleared slot), its key ordinary. An int8 zero row quantizes with scale 1.0 (some 40 times
# an ordinary token's at unit V) and adds nothing: a kernel that rounds P x v_scale to a
# fixed point below the largest scale in reach keeps that many bits fewer of every other
# token's weight, while torch's own error (the tolerance's floor) stays that of the
# ordinary tokens
ZERO_ROWS_FIRST, ZERO_ROWS_EVERY = 11, 37
LAYOUTS = ("bshd", "bhsd", "padded", "dmajor", "vdmajor", "qfused", "offset", "far", "fenced",
           "fenced-start", "reversed")

# Block sizes of the built-in kernels (flash_core.h); kv lengths and query
# lengths at block -1, +0, +1 catch partial-block bugs. Decode sizes its key
# blocks in bytes: at most 16 F32, 32 F16/BF16, 64 int8 keys, fewer (down to 16)
# when a position's K and V over every kv head exceed 64 KiB (F32) / 128 KiB per
# block, as with many kv heads of head_dim 128.
# On an AVX-512 build, decode tasks (at most 16 rows per kv head, a divisor of 16)
# take every kv head of X512_KV_BLOCK keys at a time instead (flash_x512.h).
Q_BLOCK, KV_BLOCK = 32, 128
X512_KV_BLOCK = 32
DECODE_KV_BLOCK = {"f32": 16, "f16": 32, "bf16": 32, "i8": 64}
DECODE_BLOCK_BYTES = {"f32": 64 << 10, "f16": 128 << 10, "bf16": 128 << 10, "i8": 128 << 10}
DECODE_MIN_KEYS = 16


def decode_kv_block(dtype: str, n_kv_heads: int, head_dim: int) -> int:
    """Keys per decode block of the built-in kernels for this shape (see flash_core.c)."""
    per_key = n_kv_heads * head_dim * 2 * ITEMSIZE[dtype]
    return max(DECODE_MIN_KEYS, min(DECODE_KV_BLOCK[dtype], DECODE_BLOCK_BYTES[dtype] // per_key))


@dataclasses.dataclass(frozen=True)
class Case:
    family: str
    batch: int = 1
    n_heads: int = 8
    n_kv_heads: int = 2
    q_len: int = 1
    kv_len: int = 64
    head_dim: int = 64
    dtype: str = "f32"
    causal: bool = False
    start_pos: int = 0
    mask: str = "none"        # recipe, see inputs.MASKS (VALUE_RECIPES change values only)
    layout: str = "bshd"      # bshd | bhsd (seq at dim 2) | padded (views with NaN slack)
    #                           | dmajor ([B, H, D, S] storage: head_dim not innermost)
    #                           | vdmajor (only V so, as llama.cpp's transposed V cache)
    #                           | qfused (Q a view of a fused QKV output; out plain)
    #                           | offset (every base one element past 64-byte alignment)
    #                           | far (Q, K, V batches 2^31 + 4096 elements apart: offsets
    #                             past 32 bits, in a sparse mapping; batch >= 2)
    #                           | fenced / fenced-start (bshd with no slack, every buffer's
    #                             last byte before / first byte after an inaccessible page)
    #                           | reversed (Q, K, V and int8 scales with negative position
    #                             and dim strides: last position and dim first in memory)
    scale: float = 0.0        # <= 0: 1/sqrt(head_dim)
    magnitude: float = 1.0    # q and k are multiplied by this (large logits / tiny values)
    v_magnitude: float = 1.0  # v is multiplied by this (F16 values and outputs below its
    #                           smallest normal: subnormals a flushing conversion zeroes)
    quant: str = "asym"       # i8: asym (a zero point per token) | sym (zero_point NULL)
    q_dtype: str = ""         # Q's (and the output's) dtype when not K / V's: "f32", a
    #                           float query over an F16 / BF16 / int8 cache (llama.cpp's)
    n_threads: int = 1
    callers: int = 1          # threads calling the kernel at once, each its own inputs
    stack_kib: int = 0        # > 0: called from a thread with a stack this small
    reuse: bool = False       # called again on the same buffers, rewritten in place with
    #                           new values (a static KV cache and mask between decode steps)
    invalid: str = ""         # a name in invalid_args.INVALID: the valid call above with
    #                           that one thing broken, which the kernel must refuse
    seed: int = 0

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown layout {self.layout}")
        if self.quant not in ("asym", "sym") or (self.quant == "sym" and self.dtype != "i8"):
            raise ValueError(f"quant {self.quant!r}: asym, or sym with dtype i8")
        if self.n_heads % self.n_kv_heads:
            raise ValueError("n_heads must be a multiple of n_kv_heads")
        if self.q_dtype not in ("", "f32") or (self.q_dtype and self.dtype == "f32"):
            raise ValueError(f"q_dtype {self.q_dtype!r}: empty (dtype's), or f32 over a "
                             "f16 / bf16 / i8 cache")
        if self.callers < 1:
            raise ValueError("callers must be at least 1")
        if self.stack_kib and self.stack_kib < 64:
            raise ValueError("stack_kib: 0 (the default stack) or at least 64")
        if self.reuse and (self.layout == "far" or self.callers > 1):
            raise ValueError("reuse: not with the far layout or several callers")
        if self.stack_kib and (self.reuse or self.callers > 1):
            # (run_one takes those paths first: the small stack would be dropped silently)
            raise ValueError("stack_kib: not with reuse or several callers")
        if self.layout == "far" and self.batch < 2:
            raise ValueError("layout far needs batch >= 2 (batch 1 is the far one)")
        if self.invalid:
            from .invalid_args import INVALID

            if self.invalid not in INVALID:
                raise ValueError(f"invalid {self.invalid!r}: one of {', '.join(INVALID)}")
            if self.reuse or self.callers > 1 or self.stack_kib:
                raise ValueError("invalid: a plain call (not reuse, callers or stack_kib)")

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads

    @property
    def id(self) -> str:
        g = "mqa" if self.n_kv_heads == 1 and self.n_heads > 1 else f"gqa{self.group}"
        parts = [self.family, f"b{self.batch}" if self.batch != 1 else "",
                 f"h{self.n_heads}{g}", f"q{self.q_len}", f"kv{self.kv_len}",
                 f"d{self.head_dim}", self.dtype]
        if self.causal:
            parts.append(f"causal{self.start_pos}" if self.start_pos else "causal")
        elif self.start_pos:
            parts.append(f"pos{self.start_pos}")
        if self.mask != "none":
            parts.append(self.mask.replace(":", ""))
        if self.layout != "bshd":
            parts.append(self.layout)
        if self.scale > 0:
            parts.append(f"scale{self.scale:g}")
        if self.magnitude != 1.0:
            parts.append(f"x{self.magnitude:g}")
        if self.v_magnitude != 1.0:
            parts.append(f"v{self.v_magnitude:g}")
        if self.quant != "asym":
            parts.append(self.quant)
        if self.q_dtype:
            parts.append(f"q{self.q_dtype}")
        if self.n_threads != 1:
            parts.append(f"t{self.n_threads}")
        if self.callers != 1:
            parts.append(f"c{self.callers}")
        if self.stack_kib:
            parts.append(f"stack{self.stack_kib}k")
        if self.reuse:
            parts.append("reuse")
        if self.invalid:
            parts.append(f"invalid-{self.invalid}")
        if self.seed:
            parts.append(f"s{self.seed}")
        return "-".join(p for p in parts if p)

    def params(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def needs_reference(self) -> bool:
        """Judged against the oracle (an invalid call is judged on its status alone: no
        reference, no golden data)."""
        return not self.invalid

    @property
    def out_dtype(self) -> str:
        """Q's and the output's storage dtype (int8 Q: an F32 output)."""
        return self.q_dtype or self.dtype

    @property
    def workload(self) -> Workload:
        return Workload(self.batch, self.n_heads, self.n_kv_heads, self.q_len, self.kv_len,
                        self.head_dim, self.dtype, self.q_dtype, self.causal, self.start_pos,
                        self.quant)

    @property
    def flops(self) -> int:
        return self.workload.flops

    @property
    def bytes(self) -> int:
        return self.workload.bytes


# ---- tolerances ----------------------------------------------------------------
# err_i <= atol + rtol * |ref_i| elementwise. The atol grows slowly with the
# reduction length: the rounding of an F32 sum of kv_len terms grows like
# sqrt(kv_len), by ACCUM_ATOL a step of sqrt(kv_len / 64); the F16 / BF16 output's
# own rounding, most of their base atol, does not grow (grown with it, the F16 atol
# at 70,001 keys was 1.3e-2, above the output's own size there).
# Where torch runs the case, atol is also at least TORCH_MULT times torch's own
# max abs error on the same stored inputs (see verdict.py): cases whose
# conditioning amplifies rounding (large logits, an explicit scale, low
# precision) get the slack torch itself needs, and no more.
BASE_TOL = {"f32": (2e-6, 2e-5), "i8": (2e-6, 2e-5), "f16": (4e-4, 1e-3), "bf16": (3e-3, 8e-3)}
TORCH_MULT = 3.0
# ... and 16 times it for the random suite's cases: they draw conditioning the matrix
# does not (x10 logits over head_dim 48 in a batch of 2, say), where the plain F32
# kernels of docs/examples err 4x (sequential sums) to 10x (exp2 of a product with
# log2 e) as much as torch; a slice is there for structural bugs (indexing, masking,
# strides), which err by orders of magnitude more, while the matrix's own cases keep
# 3x for low-precision accumulation. The `pairs` family (pairwise.py) is there for the
# same structural bugs and combines conditioning the same way (x10 logits with an F32
# query over an F16 cache at head_dim 20: our flash kernel and ExecuTorch err 6x torch).
RANDOM_TORCH_MULT = 16.0
GENERATED_FAMILIES = ("random", "pairs")


def torch_mult(case: Case) -> float:
    """How many times torch's own error a case's atol is at least."""
    return RANDOM_TORCH_MULT if case.family in GENERATED_FAMILIES else TORCH_MULT


ACCUM_ATOL = 2e-6


# The output is a weighted mean of V, so the absolute tolerance scales with V; but not
# below one unit in the last place of the output dtype's subnormals, the error of a
# correctly rounded result there (F16: 2^-24, 6e-8; a kernel that flushes F16
# subnormals to zero errs by up to 6.1e-5).
SUBNORMAL_ULP = {"f32": 2.0 ** -149, "i8": 2.0 ** -149, "f16": 2.0 ** -24, "bf16": 2.0 ** -133}


def tolerance(case: Case) -> tuple[float, float]:
    # (by Q's and the output's dtype: the cache's rounding is in the oracle's inputs, and
    # a float query over an F16 cache is computed and returned in F32, as torch would
    # after casting K and V up)
    atol, rtol = BASE_TOL[case.out_dtype]
    atol += ACCUM_ATOL * (math.sqrt(max(1.0, case.kv_len / 64.0)) - 1.0)
    if case.v_magnitude != 1.0:
        atol = max(atol * case.v_magnitude, SUBNORMAL_ULP[case.out_dtype])
    return atol, rtol


def judged_tolerance(case: Case, torch_err: float | None) -> tuple[float, float]:
    """(atol, rtol) a verdict applies: the case's tolerance, its atol at least
    torch_mult(case) times torch's own error on the case where torch has one."""
    atol, rtol = tolerance(case)
    if torch_err is not None:
        atol = max(atol, torch_mult(case) * torch_err)
    return atol, rtol


# ---- suites --------------------------------------------------------------------

def _smoke() -> list[Case]:
    return [
        Case("decode", n_heads=8, n_kv_heads=2, kv_len=129),
        # a runtime's most common call: one decode step over a static cache longer than
        # the step's causal edge (its stale slots NaN)
        Case("decode", kv_len=300, causal=True, start_pos=200, n_heads=8, n_kv_heads=2),
        Case("prefill", q_len=33, kv_len=33, causal=True),
        Case("causal", q_len=5, kv_len=70, causal=True, start_pos=65),
        Case("masked-rows", q_len=4, kv_len=40, mask="rows:first"),
        Case("window", q_len=3, kv_len=130, mask="window:48", causal=True, start_pos=127),
        Case("dtype", kv_len=65, dtype="f16"),
        Case("dtype", kv_len=65, dtype="bf16"),
        Case("dtype", kv_len=65, dtype="i8"),
        Case("layout", q_len=3, kv_len=65, layout="padded"),
    ]


def _default() -> list[Case]:
    cs: list[Case] = []
    # decode, GQA ratios 1, 2, 4, 8 and MQA, at the key-block edges
    for h, hkv in ((8, 8), (8, 4), (8, 2), (8, 1), (16, 2), (32, 8)):
        cs.append(Case("gqa", n_heads=h, n_kv_heads=hkv, kv_len=KV_BLOCK + 1))
    # GQA groups real models have that are not a power of two, or wider than 8: Qwen2.5's
    # 14 heads over 2 (7 a group), SmolLM2's 15 over 5 (3), 16 a group (Llama 3.1 405B,
    # Qwen3 235B), Falcon-7B's 71 heads over one; a kernel that maps a head to its kv head
    # by a shift, or keeps a group's rows in a fixed-size tile, is right on every power of
    # two up to 8 and wrong here
    for h, hkv, q, dt in ((14, 2, 1, "f32"), (15, 5, 1, "f32"), (32, 2, 1, "f32"),
                          (71, 1, 1, "f32"), (14, 2, 3, "f16"), (15, 5, 2, "i8"),
                          (32, 2, 1, "i8")):
        cs.append(Case("gqa", n_heads=h, n_kv_heads=hkv, q_len=q, dtype=dt,
                       kv_len=KV_BLOCK + 1, causal=q > 1,
                       start_pos=KV_BLOCK + 1 - q if q > 1 else 0))
    for kv in (1, KV_BLOCK - 1, KV_BLOCK, KV_BLOCK + 1, 2 * KV_BLOCK + 1):
        cs.append(Case("decode", kv_len=kv))
    cs.append(Case("decode", kv_len=2049, dtype="f16", n_heads=4, n_kv_heads=1))
    for dt, blk in DECODE_KV_BLOCK.items():
        for kv in (blk - 1, blk, blk + 1):
            if dt == "f32" and kv in (1, KV_BLOCK - 1, KV_BLOCK, KV_BLOCK + 1):
                continue
            cs.append(Case("decode", kv_len=kv, dtype=dt, n_heads=8, n_kv_heads=2))
    # wide positions (16 kv heads x 128): byte-sized blocks of 16 / 16 / 32 keys
    for dt in ("f32", "f16", "i8"):
        blk = decode_kv_block(dt, 16, 128)
        for kv in (blk - 1, blk + 1):
            cs.append(Case("decode", kv_len=kv, dtype=dt, n_heads=16, n_kv_heads=16,
                           head_dim=128))
    # decode tasks on the AVX-512 block path: its block edges, rows per kv head of 8 and 16
    # (short chunks, speculative decode: a query row each, causal and masked), a partial
    # lane chunk of heads (24 kv heads, 1 row each), head_dim not a multiple of 32 (int8)
    for kv in (X512_KV_BLOCK - 1, X512_KV_BLOCK + 1):
        cs.append(Case("decode", kv_len=kv, n_heads=8, n_kv_heads=2))
    cs.append(Case("decode", q_len=4, kv_len=100, causal=True, start_pos=96, n_heads=8,
                   n_kv_heads=2))
    cs.append(Case("decode", q_len=2, kv_len=77, mask="random", n_heads=16, n_kv_heads=2))
    cs.append(Case("decode", q_len=2, kv_len=70, causal=True, start_pos=68, dtype="i8",
                   n_heads=8, n_kv_heads=2))
    # decode over a static cache: kv_len is the cache's length, causal with start_pos the
    # step's position, the slots past it stale (NaN here) -- how a runtime with a
    # preallocated cache calls its op (ExecuTorch's custom_sdpa: start_pos, is_causal).
    # A decode path that reads every slot of the cache because a single query row "sees
    # everything" passed every case before these, each of whose decode rows saw a full
    # cache. On the first step (start_pos 0) the row sees one key; over two threads the
    # visible range, not the cache, is what a split must divide
    for dt in DTYPES:
        cs.append(Case("decode", kv_len=300, causal=True, start_pos=200, dtype=dt,
                       n_heads=8, n_kv_heads=2))
    cs.append(Case("decode", kv_len=64, causal=True, start_pos=0, n_heads=8, n_kv_heads=2))
    for dt in ("f32", "i8"):
        cs.append(Case("decode", kv_len=1030, causal=True, start_pos=700, dtype=dt,
                       n_heads=8, n_kv_heads=2, n_threads=2))
    # batched decode (several sequences a step, as a server or beam search runs them):
    # every decode case before these had one sequence, so a decode path that indexes
    # K / V (or int8 scales) by batch wrongly, or serves batch 0 alone, passed them all
    for dt, t in (("f32", 1), ("f16", 1), ("i8", 1), ("f32", 2), ("bf16", 2)):
        cs.append(Case("decode", batch=3, kv_len=150, causal=True, start_pos=120, dtype=dt,
                       n_heads=8, n_kv_heads=2, n_threads=t))
    cs.append(Case("decode", kv_len=40, n_heads=24, n_kv_heads=24, dtype="f16"))
    cs.append(Case("decode", kv_len=70, head_dim=80, dtype="i8"))
    cs.append(Case("decode", kv_len=70, head_dim=48, dtype="bf16", n_heads=16, n_kv_heads=2))
    # prefill, query-block edges, batch > 1, q_len > kv_len
    for q in (Q_BLOCK - 1, Q_BLOCK, Q_BLOCK + 1):
        cs.append(Case("prefill", q_len=q, kv_len=q, causal=True, n_heads=4, n_kv_heads=2))
    cs.append(Case("prefill", batch=3, q_len=20, kv_len=45, causal=True, start_pos=25,
                   n_heads=4, n_kv_heads=2))
    cs.append(Case("prefill", q_len=40, kv_len=20, causal=True, n_heads=4, n_kv_heads=1))
    cs.append(Case("prefill", q_len=17, kv_len=150, n_heads=4, n_kv_heads=2))
    # head dims
    # (512: past the 256 a kernel's fixed-size row buffer, `float acc[256]`, assumes)
    for d in (64, 80, 96, 128, 256, 67, 512):
        cs.append(Case("hdim", head_dim=d, q_len=2, kv_len=70, n_heads=4, n_kv_heads=2))
    # head_dims under a vector's width (a kernel whose first load, or an unsigned
    # `d < D - 16` loop bound, assumes at least 16 elements), as tiny test models have
    for d, dt in ((16, "f32"), (8, "f32"), (1, "f32"), (16, "f16"), (8, "i8"), (4, "bf16")):
        cs.append(Case("hdim", head_dim=d, q_len=2, kv_len=70, n_heads=4, n_kv_heads=2,
                       dtype=dt))
    # causal with a KV-cache offset
    for q, kv, sp in ((1, 100, 99), (4, 100, 96), (7, 135, 128), (3, 60, 0), (5, 80, 40)):
        cs.append(Case("causal", q_len=q, kv_len=kv, causal=True, start_pos=sp,
                       n_heads=4, n_kv_heads=2))
    # a start_pos with is_causal off: every key visible to every row (a kernel that takes
    # a given start_pos for a causal edge hides the keys past it)
    cs.append(Case("causal", q_len=4, kv_len=100, start_pos=40, n_heads=4, n_kv_heads=2))
    cs.append(Case("causal", q_len=1, kv_len=X512_KV_BLOCK * 2 + 3, start_pos=20, dtype="f16",
                   n_heads=8, n_kv_heads=2))
    cs.append(Case("causal", q_len=2, kv_len=70, start_pos=30, dtype="i8", n_heads=8,
                   n_kv_heads=2))
    # additive masks, with and without causal
    cs.append(Case("mask", q_len=6, kv_len=140, mask="random", n_heads=4, n_kv_heads=2))
    cs.append(Case("mask", q_len=6, kv_len=140, mask="random", causal=True, start_pos=134,
                   n_heads=4, n_kv_heads=2))
    cs.append(Case("mask", q_len=1, kv_len=300, mask="random", n_heads=8, n_kv_heads=2))
    # a mask over a causal edge 34 keys short of the cache's end, int8: the slots past the
    # edge hold stale NaN scales (inputs.py) that a kernel reading every key under the mask
    # must not let through (0 x NaN); found by the random suite in ExecuTorch 1.5.1's
    # quantized op, NaN in every row (finite scales there: it passes), where its float op
    # and the bottom-edge cases pass
    cs.append(Case("mask", q_len=6, kv_len=140, mask="window:40", causal=True, start_pos=100,
                   dtype="i8", n_heads=4, n_kv_heads=2))
    # large logits under a mask: a hidden key with the row's largest raw score must not set
    # the softmax's max (the visible keys' weights would underflow to zero)
    cs.append(Case("mask", q_len=6, kv_len=140, mask="random", magnitude=100.0, n_heads=4,
                   n_kv_heads=2))
    cs.append(Case("mask", q_len=1, kv_len=300, mask="random", magnitude=100.0, n_heads=8,
                   n_kv_heads=2))
    # the same through the low-precision paths: a mask read as hidden / visible only (its
    # finite biases dropped), or a softmax without its max, on the F16 / BF16 / int8 path
    # alone passed every case, the random masks and large logits being F32 (and int8
    # decode) only
    cs.append(Case("mask", q_len=1, kv_len=300, mask="random", n_heads=8, n_kv_heads=2,
                   dtype="f16"))
    cs.append(Case("mask", q_len=6, kv_len=140, mask="random", causal=True, start_pos=134,
                   n_heads=4, n_kv_heads=2, dtype="f16"))
    cs.append(Case("mask", q_len=2, kv_len=140, mask="random", n_heads=4, n_kv_heads=2,
                   dtype="bf16"))
    cs.append(Case("mask", q_len=1, kv_len=300, mask="random", magnitude=100.0, n_heads=8,
                   n_kv_heads=2, dtype="i8"))
    # fully masked query rows
    for where in ("first", "middle", "last"):
        cs.append(Case("masked-rows", q_len=5, kv_len=140, mask=f"rows:{where}",
                       n_heads=4, n_kv_heads=2))
    cs.append(Case("masked-rows", q_len=Q_BLOCK + 8, kv_len=150, mask="rows:block",
                   n_heads=4, n_kv_heads=2))
    cs.append(Case("masked-rows", q_len=1, kv_len=200, mask="rows:first", n_heads=8,
                   n_kv_heads=2))
    cs.append(Case("masked-rows", q_len=4, kv_len=3 * KV_BLOCK + 5, mask="rows:far",
                   n_heads=4, n_kv_heads=2))
    cs.append(Case("masked-rows", q_len=4, kv_len=140, mask="rows:negfinite",
                   n_heads=4, n_kv_heads=2))
    cs.append(Case("masked-rows", q_len=3, kv_len=70, mask="rows:first", dtype="f16",
                   n_heads=4, n_kv_heads=2))
    # an empty cache (kv_len 0, K and V NULL): every row sees no key, zeros; a kernel that
    # reads a first key (a hoisted load, a scale) before its loop dereferences NULL
    cs.append(Case("masked-rows", q_len=2, kv_len=0, n_heads=4, n_kv_heads=2))
    for dt in ("f16", "i8"):  # (the per-dtype paths: an int8 scale or F16 K read early)
        cs.append(Case("masked-rows", q_len=1, kv_len=0, n_heads=8, n_kv_heads=2, dtype=dt))
    # NaN in visible inputs (K, V and Q; int8: their scales): the rows that read one are
    # NaN, the rest finite
    cs.append(Case("nan", kv_len=2 * X512_KV_BLOCK + 5, mask="nan-inputs", n_heads=12,
                   n_kv_heads=3, dtype="i8"))
    for dt in ("f32", "f16"):
        cs.append(Case("nan", q_len=3, kv_len=100, causal=True, start_pos=97, mask="nan-inputs",
                       n_heads=6, n_kv_heads=3, dtype=dt))
        cs.append(Case("nan", kv_len=2 * X512_KV_BLOCK + 5, mask="nan-inputs", n_heads=12,
                       n_kv_heads=3, dtype=dt))
    # sliding window, wrapped ring and attention sinks over caches out of position order
    cs.append(Case("window", q_len=4, kv_len=300, mask="window:100", causal=True,
                   start_pos=296, n_heads=4, n_kv_heads=2))
    cs.append(Case("window", q_len=40, kv_len=300, mask="window:64", causal=True,
                   start_pos=260, n_heads=4, n_kv_heads=2))
    # a window far down a long cache: the first ~2000 keys are masked for every row, so
    # whole blocks of up to 1024 keys (and a 2-way split's first range) see no key; a
    # kernel that does not skip an empty block (-inf - -inf) or merge an empty split
    # safely fails here whatever its block size (docs/check.md, the tiling sweep)
    cs.append(Case("window", q_len=1, kv_len=2100, mask="window:64", causal=True,
                   start_pos=2099, n_heads=8, n_kv_heads=2))
    cs.append(Case("window", q_len=3, kv_len=2100, mask="window:64", causal=True,
                   start_pos=2097, n_heads=4, n_kv_heads=2, dtype="i8"))
    cs.append(Case("ring", q_len=1, kv_len=256, mask="ring:200", n_heads=8, n_kv_heads=2))
    cs.append(Case("ring", q_len=8, kv_len=256, mask="ring:192", n_heads=4, n_kv_heads=2))
    cs.append(Case("sink", q_len=1, kv_len=260, mask="sink:4:128", n_heads=8, n_kv_heads=2))
    cs.append(Case("sink", q_len=6, kv_len=260, mask="sink:4:128", n_heads=4, n_kv_heads=2))
    # logit magnitudes and explicit scale
    cs.append(Case("logits", q_len=3, kv_len=130, magnitude=10.0, n_heads=4, n_kv_heads=2))
    cs.append(Case("logits", q_len=3, kv_len=130, magnitude=100.0, n_heads=4, n_kv_heads=2))
    cs.append(Case("logits", q_len=3, kv_len=130, magnitude=10.0, n_heads=4, n_kv_heads=2,
                   dtype="f16"))
    # large logits at head_dim 128 in F16 and BF16, whose 1/sqrt(128) no half-precision
    # float holds: a scale (or q * scale) rounded to the storage dtype shifts every logit
    # by up to 2^-12 (F16) / 2^-9 (BF16) of itself, here a weight error of up to 10 %.
    # At head_dim 64 the scale, 1/8, is exact and hides it
    for dt in ("f16", "bf16"):
        cs.append(Case("logits", q_len=1, kv_len=130, head_dim=128, magnitude=10.0,
                       n_heads=8, n_kv_heads=2, dtype=dt))
    cs.append(Case("logits", q_len=3, kv_len=130, magnitude=1e-3, n_heads=4, n_kv_heads=2))
    cs.append(Case("logits", q_len=3, kv_len=130, scale=0.5, n_heads=4, n_kv_heads=2))
    # an explicit scale through the F16, BF16 and int8 paths (decode and a short prefill):
    # a kernel whose low-precision path alone falls back to 1/sqrt(head_dim) passed
    # every case with the F32 one above as the only explicit scale
    for q, dt, qdt in ((1, "f16", ""), (3, "f16", "f32"), (3, "bf16", ""), (1, "i8", ""),
                       (3, "i8", "")):
        cs.append(Case("logits", q_len=q, kv_len=130, scale=0.5, n_heads=8, n_kv_heads=2,
                       dtype=dt, q_dtype=qdt))
    # storage dtypes
    for dt in ("f16", "bf16", "i8"):
        cs.append(Case("dtype", q_len=1, kv_len=KV_BLOCK + 1, dtype=dt))
        cs.append(Case("dtype", q_len=9, kv_len=100, dtype=dt, causal=True, start_pos=91,
                       n_heads=4, n_kv_heads=2))
    cs.append(Case("dtype", q_len=1, kv_len=2049, dtype="bf16", n_heads=4, n_kv_heads=1))
    # F16 V and outputs in the subnormal range (|x| < 6.1e-5): a conversion that flushes
    # them to zero, in or out, was within the F16 tolerance everywhere else (decode through
    # the block path, a causal prefill through the panel)
    cs.append(Case("dtype", q_len=1, kv_len=KV_BLOCK + 1, dtype="f16", v_magnitude=1e-5))
    cs.append(Case("dtype", q_len=9, kv_len=100, dtype="f16", causal=True, start_pos=91,
                   n_heads=4, n_kv_heads=2, v_magnitude=1e-5))
    # the int8 paths through the edge-case families
    cs.append(Case("dtype", q_len=1, kv_len=2049, dtype="i8", n_heads=16, n_kv_heads=2))
    cs.append(Case("dtype", q_len=1, kv_len=KV_BLOCK + 1, dtype="i8", n_heads=8, n_kv_heads=1))
    cs.append(Case("dtype", q_len=5, kv_len=140, dtype="i8", mask="rows:middle",
                   n_heads=4, n_kv_heads=2))
    cs.append(Case("dtype", q_len=3, kv_len=256, dtype="i8", mask="ring:200",
                   n_heads=4, n_kv_heads=2))
    cs.append(Case("dtype", q_len=3, kv_len=70, dtype="i8", head_dim=67, causal=True,
                   start_pos=67, n_heads=4, n_kv_heads=2))
    cs.append(Case("dtype", q_len=2, kv_len=70, dtype="i8", mask="constant-token",
                   n_heads=4, n_kv_heads=2))
    # V rows of zeros among the keys (ZERO_ROWS_*): int8 scale 1.0, no weight in the
    # output. A P.V that rounds P x v_scale to a fixed point below the largest scale of a
    # block passed every case but constant-token (docs/check.md, stop 35). Decode on the
    # AVX-512 block path, a causal chunk, symmetric int8; V at 0.01 (ordinary scales
    # 1.3e-4-2.8e-4): the tolerance scales with V, the bits the fixed point loses do not
    cs.append(Case("dtype", kv_len=300, dtype="i8", mask="zero-tokens", v_magnitude=0.01,
                   n_heads=8, n_kv_heads=2))
    cs.append(Case("dtype", q_len=3, kv_len=130, dtype="i8", mask="zero-tokens", causal=True,
                   start_pos=127, v_magnitude=0.01, n_heads=4, n_kv_heads=2))
    cs.append(Case("dtype", kv_len=300, dtype="i8", mask="zero-tokens", quant="sym",
                   v_magnitude=0.01, n_heads=8, n_kv_heads=2))
    # a float query (and output) over an F16 / BF16 / int8 cache, as llama.cpp and
    # ExecuTorch's quantized cache run: Q's dtype is not K's
    cs.append(Case("dtype", q_len=1, kv_len=KV_BLOCK + 1, dtype="f16", q_dtype="f32",
                   n_heads=8, n_kv_heads=2))
    cs.append(Case("dtype", q_len=9, kv_len=100, dtype="f16", q_dtype="f32", causal=True,
                   start_pos=91, n_heads=4, n_kv_heads=2))
    cs.append(Case("dtype", q_len=1, kv_len=KV_BLOCK + 1, dtype="bf16", q_dtype="f32",
                   n_heads=8, n_kv_heads=2))
    cs.append(Case("dtype", q_len=3, kv_len=100, dtype="i8", q_dtype="f32", causal=True,
                   start_pos=97, n_heads=8, n_kv_heads=2))
    # symmetric int8 (no zero-point array: the ABI's NULL), decode and a causal prefill
    cs.append(Case("dtype", q_len=1, kv_len=KV_BLOCK + 1, dtype="i8", quant="sym"))
    cs.append(Case("dtype", q_len=9, kv_len=100, dtype="i8", causal=True, start_pos=91,
                   n_heads=4, n_kv_heads=2, quant="sym"))
    # layouts through strides, with NaN in every byte a kernel must not read
    for lay in ("bhsd", "padded", "dmajor", "offset"):
        cs.append(Case("layout", q_len=3, kv_len=KV_BLOCK + 3, layout=lay,
                       n_heads=4, n_kv_heads=2))
        cs.append(Case("layout", q_len=1, kv_len=200, layout=lay, dtype="f16"))
        cs.append(Case("layout", q_len=2, kv_len=90, layout=lay, dtype="i8",
                       n_heads=4, n_kv_heads=2))
    cs.append(Case("layout", batch=2, q_len=5, kv_len=75, layout="padded", causal=True,
                   start_pos=70, mask="random", n_heads=4, n_kv_heads=2))
    # (the mask too one element past a 64-byte boundary)
    cs.append(Case("layout", q_len=5, kv_len=75, layout="offset", causal=True, start_pos=70,
                   mask="random", n_heads=4, n_kv_heads=2))
    # element offsets past 2^31 (batch 1 of Q, K, V 2^31 + 4096 elements after batch 0, as
    # in a cache of many sequences or one interleaving every layer per position): a
    # kernel that forms an offset in int truncates it and reads far outside its tensor
    for dt in ("f32", "f16", "i8"):
        cs.append(Case("layout", batch=2, q_len=2, kv_len=70, layout="far", dtype=dt,
                       n_heads=4, n_kv_heads=2, causal=dt == "f16",
                       start_pos=68 if dt == "f16" else 0))
    # tensors of one call in different layouts (K's strides are not V's, Q's not out's)
    cs.append(Case("layout", q_len=3, kv_len=KV_BLOCK + 3, layout="vdmajor",
                   n_heads=4, n_kv_heads=2, causal=True, start_pos=KV_BLOCK))
    cs.append(Case("layout", q_len=2, kv_len=90, layout="vdmajor", dtype="i8",
                   n_heads=4, n_kv_heads=2))
    cs.append(Case("layout", q_len=4, kv_len=70, layout="qfused", dtype="f16",
                   n_heads=8, n_kv_heads=2))
    # BF16 through a padded and a transposed view (its path's own stride handling), V
    # alone transposed, and element offsets past 2^31: the BF16 path forms its own
    # offsets, so the F32 / F16 / int8 cases above do not speak for it
    for lay in ("padded", "dmajor", "vdmajor"):
        cs.append(Case("layout", q_len=1, kv_len=200, layout=lay, dtype="bf16", n_heads=8,
                       n_kv_heads=2))
    cs.append(Case("layout", batch=2, q_len=2, kv_len=70, layout="far", dtype="bf16",
                   n_heads=4, n_kv_heads=2))
    # llama.cpp's own cache: F16, V transposed (head_dim-major) beside a plain K; and the
    # same over a static cache whose slots past the step's position are stale
    cs.append(Case("layout", q_len=1, kv_len=200, layout="vdmajor", dtype="f16",
                   n_heads=8, n_kv_heads=2))
    cs.append(Case("layout", q_len=1, kv_len=200, layout="vdmajor", dtype="f16", causal=True,
                   start_pos=150, n_heads=8, n_kv_heads=2))
    cs.append(Case("layout", q_len=4, kv_len=70, layout="qfused", n_heads=8, n_kv_heads=2))
    # negative strides, which the ABI allows (a view walked backwards): each position and
    # dim of Q, K, V (and int8 scales) first in memory is the last in order; a kernel that
    # keeps strides unsigned (uint32) passes every other case and reads far outside here
    for dt, q in (("f32", 3), ("f16", 1), ("bf16", 1), ("i8", 2)):
        cs.append(Case("layout", q_len=q, kv_len=90, layout="reversed", dtype=dt, n_heads=8,
                       n_kv_heads=2, causal=q > 1, start_pos=88 - q if q > 1 else 0))
    # every buffer flush against an inaccessible page, after its last byte or before its
    # first: a full vector loaded over a row's tail, a block of keys (of int8 scales, of a
    # mask row) read past kv_len or a row read before the first faults here, where
    # elsewhere the read lands in slack and, its value thrown away, goes unseen. kv 77 and
    # 45, head_dim 67: tails for any vector width and key block
    for dt in DTYPES:
        cs.append(Case("layout", q_len=1, kv_len=77, layout="fenced", dtype=dt, mask="random",
                       n_heads=8, n_kv_heads=2, n_threads=2))
        cs.append(Case("layout", q_len=5, kv_len=45, head_dim=67, layout="fenced", dtype=dt,
                       causal=True, start_pos=40, mask="random", n_heads=4, n_kv_heads=2))
    for dt in ("f32", "f16", "i8"):
        cs.append(Case("layout", q_len=3, kv_len=77, head_dim=67, layout="fenced-start",
                       dtype=dt, mask="random", n_heads=4, n_kv_heads=2))
    cs.append(Case("layout", batch=2, q_len=2, kv_len=70, layout="vdmajor", dtype="i8",
                   n_heads=4, n_kv_heads=2, mask="random"))
    # threads
    for t in (1, 2, 3):
        cs.append(Case("threads", q_len=1, kv_len=1030, n_threads=t, n_heads=8, n_kv_heads=2))
        cs.append(Case("threads", batch=2, q_len=33, kv_len=100, n_threads=t, causal=True,
                       start_pos=67, n_heads=4, n_kv_heads=2))
    # threaded prefill through the F16, BF16 and int8 paths (their own query-block splits:
    # every threaded prefill case before these was F32, or int8 under two callers)
    for dt, b in (("f16", 1), ("bf16", 2), ("i8", 2)):
        cs.append(Case("threads", batch=b, q_len=33, kv_len=100, n_threads=3, causal=True,
                       start_pos=67, n_heads=4, n_kv_heads=2, dtype=dt))
    # more threads than keys: a kv split per thread leaves one empty, whose partial state
    # (max -inf, sum 0) the merge must take as nothing
    for dt in ("f32", "i8"):
        cs.append(Case("threads", q_len=1, kv_len=2, n_threads=3, n_heads=8, n_kv_heads=2,
                       dtype=dt))
    # the same buffers called again, rewritten in place with new values, as a runtime's
    # static KV cache and mask are between decode steps: a kernel that keeps what it
    # derived from a buffer (dequantised or packed K / V, a mask's visible ranges) by its
    # address answers the second call with the first's
    cs.append(Case("reuse", kv_len=300, mask="random", n_heads=8, n_kv_heads=2, reuse=True))
    cs.append(Case("reuse", kv_len=KV_BLOCK + 1, dtype="i8", n_heads=8, n_kv_heads=2,
                   reuse=True))
    cs.append(Case("reuse", q_len=4, kv_len=300, mask="window:100", causal=True, start_pos=296,
                   n_heads=4, n_kv_heads=2, dtype="f16", reuse=True))
    # as many threads as a server has cores: a kernel with a fixed-size array of per-thread
    # partial states or scratch (sized for a laptop) overflows it
    for dt in ("f32", "i8"):
        cs.append(Case("threads", q_len=1, kv_len=1030, n_threads=64, n_heads=8, n_kv_heads=2,
                       dtype=dt))
    cs.append(Case("threads", batch=2, q_len=33, kv_len=100, n_threads=64, causal=True,
                   start_pos=67, n_heads=4, n_kv_heads=2))
    # two threads calling the kernel at once, each with its own inputs and output: a
    # kernel with static scratch, or a non-reentrant pool or cache, mixes their rows
    cs.append(Case("threads", q_len=1, kv_len=1030, n_heads=8, n_kv_heads=2, callers=2))
    for dt in ("f16", "bf16"):
        cs.append(Case("threads", q_len=1, kv_len=1030, n_heads=8, n_kv_heads=2, callers=2,
                       dtype=dt))
    cs.append(Case("threads", q_len=1, kv_len=1030, n_heads=8, n_kv_heads=2, n_threads=2,
                   dtype="bf16"))
    cs.append(Case("threads", q_len=9, kv_len=100, causal=True, start_pos=91, n_heads=4,
                   n_kv_heads=2, dtype="i8", n_threads=2, callers=2))
    # called from a thread with a 256 KiB stack, 100,000 keys: a kernel with a kv_len-long
    # array on its stack (a VLA, alloca) overflows it
    cs.append(Case("threads", q_len=1, kv_len=100_000, n_heads=4, n_kv_heads=1, stack_kib=256))
    # long contexts past 2^16 keys in the low-precision caches (the F32 one has the case
    # above): a token index or position kept in 16 bits, or scratch sized for a maximum
    # context, on the F16 / BF16 / int8 path alone, is right at every shorter length
    cs.append(Case("long", kv_len=70_001, dtype="i8", n_heads=4, n_kv_heads=1))
    cs.append(Case("long", kv_len=70_001, dtype="f16", n_heads=4, n_kv_heads=1, n_threads=2))
    cs.append(Case("long", q_len=3, kv_len=70_001, dtype="bf16", causal=True,
                   start_pos=69_998, n_heads=4, n_kv_heads=2))
    cs.append(Case("long", q_len=2, kv_len=70_001, dtype="i8", q_dtype="f32", causal=True,
                   start_pos=69_999, n_heads=8, n_kv_heads=2, n_threads=2))
    # every pair of two code-path factors' values in some case (pairwise.py)
    from .pairwise import cases as pairwise_cases

    cs.extend(pairwise_cases())
    # calls the ABI says a kernel must refuse with SDPA_INVALID, writing nothing: each a
    # valid masked GQA call with one argument broken (a kernel that trusts its arguments
    # crashes, reads the wrong heads or answers SDPA_OK)
    from .invalid_args import INVALID

    for name in INVALID:
        cs.append(Case("args", q_len=2, kv_len=70, mask="random", invalid=name))
    return cs


def _full() -> list[Case]:
    cs = list(_default())
    for d in (64, 80, 96, 128, 256, 67):
        for dt in DTYPES:
            cs.append(Case("hdim", head_dim=d, q_len=3, kv_len=KV_BLOCK + 1, dtype=dt,
                           causal=True, start_pos=KV_BLOCK - 2, n_heads=8, n_kv_heads=2))
    for kv in (4097, 8193):
        for dt in ("f32", "f16", "i8"):
            cs.append(Case("long", kv_len=kv, dtype=dt, n_heads=32, n_kv_heads=8, n_threads=2))
    cs.append(Case("long", q_len=130, kv_len=1030, causal=True, start_pos=900, n_heads=8,
                   n_kv_heads=2, n_threads=2))
    for seed in range(1, 4):
        cs.append(Case("ring", q_len=5, kv_len=512, mask="ring:300", seed=seed))
        cs.append(Case("sink", q_len=5, kv_len=512, mask="sink:8:300", seed=seed))
    return cs


# ---- random cases ----------------------------------------------------------------
# The fixed matrix names the edges known to matter; `--suite random --seed N` draws
# RANDOM_CASES more from the whole parameter space (head counts and groups, head_dim,
# lengths, dtypes, causal offsets, masks, layouts, scales, threads, batch), a new slice
# for every N, for the bugs nobody thought to list. Case i of slice N has seed
# RANDOM_SEED_STRIDE * (N + 1) + i: its id names its slice and index, so --repro and
# --last-failed find it again.
RANDOM_CASES = 64
RANDOM_SEED_STRIDE = 1000
RANDOM_MAX_FLOPS = 2e8     # a case's work, so that a slice runs in seconds
RANDOM_LAYOUTS = ("bshd",) * 5 + ("bhsd", "padded", "dmajor", "vdmajor", "offset", "qfused")
RANDOM_HEAD_DIMS = (64, 64, 128, 128, 16, 32, 48, 80, 96, 112, 256, 8, 3, 17, 72)


def random_case(slice_seed: int, i: int) -> Case:
    """Case i of random slice slice_seed (drawn from its own stream: the same case
    whatever the slice's length)."""
    import random

    r = random.Random(f"sdpa_probe-random-{slice_seed}-{i}")
    dtype = r.choice(("f32", "f32", "f16", "bf16", "i8"))
    n_kv = r.choice((1, 1, 2, 2, 3, 4, 8))
    group = r.choice((1, 2, 3, 4, 4, 5, 7, 8))
    n_heads = n_kv * group
    head_dim = r.choice(RANDOM_HEAD_DIMS)
    q_len = 1 if r.random() < 0.5 else r.randint(2, 80)
    kv_len = 0 if r.random() < 0.03 else int(math.exp(r.uniform(0.0, math.log(4000.0))))
    batch = r.choice((1, 1, 1, 1, 2, 3))
    # bounded work (Case.flops, a key counted for an empty cache): fewer keys, then rows
    def flops() -> int:
        return 4 * batch * n_heads * q_len * max(kv_len, 1) * head_dim

    while kv_len > 1 and flops() > RANDOM_MAX_FLOPS:
        kv_len //= 2
    while q_len > 1 and flops() > RANDOM_MAX_FLOPS:
        q_len //= 2
    causal = kv_len > 0 and r.random() < 0.5
    start_pos = 0
    if causal:
        bottom = max(0, kv_len - q_len)
        start_pos = bottom if r.random() < 0.7 else r.randint(0, bottom)
    mask = "none"
    if kv_len > 0:
        u = r.random()
        if u < 0.25:
            mask = "random"
        elif u < 0.35:
            mask = f"window:{r.randint(1, kv_len)}"
        elif u < 0.42:
            mask = r.choice(("rows:first", "rows:middle", "rows:last"))
    q_dtype = "f32" if dtype != "f32" and r.random() < 0.2 else ""
    layout = r.choice(RANDOM_LAYOUTS)
    if layout == "qfused" and q_dtype:
        layout = "bshd"  # (a fused QKV output holds Q in the cache's dtype)
    case = Case(
        "random", batch=batch, n_heads=n_heads, n_kv_heads=n_kv, q_len=q_len, kv_len=kv_len,
        head_dim=head_dim, dtype=dtype, causal=causal, start_pos=start_pos, mask=mask,
        layout=layout, scale=round(r.uniform(0.02, 0.5), 3) if r.random() < 0.15 else 0.0,
        magnitude=r.choice((0.01, 10.0)) if r.random() < 0.1 else 1.0,
        quant="sym" if dtype == "i8" and r.random() < 0.25 else "asym", q_dtype=q_dtype,
        n_threads=r.choice((1, 1, 2, 3, 8)), seed=RANDOM_SEED_STRIDE * (slice_seed + 1) + i)
    # the layouts of stop 34, drawn last so that every draw above (and so every case of
    # the slices measured before) stays as it was: a quarter of the plain ones
    if layout == "bshd" and r.random() < 0.25:
        case = dataclasses.replace(case, layout=r.choice(("fenced", "fenced-start", "reversed")))
    # stop 35's int8 V rows of zeros (V at 0.01, as the matrix's), drawn after those
    if dtype == "i8" and mask == "none" and kv_len > ZERO_ROWS_FIRST and r.random() < 0.25:
        case = dataclasses.replace(case, mask="zero-tokens", v_magnitude=0.01)
    return case


def random_cases(slice_seed: int = 0, n: int = RANDOM_CASES) -> list[Case]:
    if slice_seed < 0:
        raise ValueError("the random suite's seed is >= 0")
    return [random_case(slice_seed, i) for i in range(n)]


SUITES = {"smoke": _smoke, "default": _default, "full": _full}


def suite(name: str) -> list[Case]:
    if name not in SUITES:
        raise KeyError(name)
    cases = SUITES[name]()
    ids = [c.id for c in cases]
    dup = {i for i in ids if ids.count(i) > 1}
    assert not dup, f"duplicate case ids: {sorted(dup)}"
    return cases


def all_cases() -> dict[str, Case]:
    return {c.id: c for c in suite("full")}


def find_case(case_id: str, fixed: dict[str, Case] | None = None) -> Case | None:
    """The case an id names: a fixed suite's; one of them with another seed (the id
    ending -s<seed>, as --seed makes it); or a random slice's (its seed names the
    slice and index). None for any other id. fixed: all_cases(), if the caller has it."""
    fixed = all_cases() if fixed is None else fixed
    if case_id in fixed:
        return fixed[case_id]
    base, sep, tail = case_id.rpartition("-s")
    if not (sep and tail.isdigit()):
        return None
    if case_id.startswith("random-"):
        slice_seed, i = divmod(int(tail), RANDOM_SEED_STRIDE)
        c = random_case(slice_seed - 1, i) if slice_seed >= 1 else None
        return c if c is not None and c.id == case_id else None
    return dataclasses.replace(fixed[base], seed=int(tail)) if base in fixed else None
