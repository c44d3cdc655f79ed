"""A case: the parameters of one SDPA call, a seed, and a stable id that is also its
pytest id, its `-k` filter and its golden data's key. Its FLOPs and bytes are its
Workload's."""

from __future__ import annotations

import dataclasses

from ..workload import Workload
from .invalid_calls import INVALID_CALLS

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
# metamorphic relations (sdpa_probe/check/relations.py says what each compares)
RELATIONS = ("permute-keys", "masked-key", "batch-split", "v-scale", "one-key", "rewritten",
             "concurrent")
LAYOUTS = ("bshd", "bhsd", "padded", "dmajor", "vdmajor", "qfused", "offset", "far", "fenced",
           "fenced-start", "reversed")


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
    invalid: str = ""         # a name in INVALID_CALLS: the valid call above with
    #                           that one thing broken, which the kernel must refuse
    seed: int = 0
    relation: str = ""        # a name in RELATIONS: the call judged against the oracle,
    #                           then against the kernel's own answer to a transformed call

    def __post_init__(self):
        if self.relation and self.relation not in RELATIONS:
            raise ValueError(f"relation {self.relation!r}: one of {', '.join(RELATIONS)}")
        if self.relation and (self.invalid or self.reuse or self.callers > 1
                              or self.stack_kib):
            raise ValueError("relation: a plain call (not invalid, reuse, callers or "
                             "stack_kib)")
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
            if self.invalid not in INVALID_CALLS:
                raise ValueError(f"invalid {self.invalid!r}: one of {', '.join(INVALID_CALLS)}")
            if self.reuse or self.callers > 1 or self.stack_kib:
                raise ValueError("invalid: a plain call (not reuse, callers or stack_kib)")

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads

    @property
    def keys_in_reach(self) -> int:
        """How many of the cache's keys some query sees: [0, start_pos + q_len) for a
        causal case (no row sees the slots after), every key otherwise."""
        return min(self.kv_len, self.start_pos + self.q_len) if self.causal else self.kv_len

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
        if self.scale != 0:  # (below zero: the default scale, asked for another way)
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
        if self.relation:
            parts.append(f"rel-{self.relation}")
        if self.seed:
            parts.append(f"s{self.seed}")
        return "-".join(p for p in parts if p)

    def params(self) -> dict:
        d = dataclasses.asdict(self)
        if not self.relation:  # (the records and golden data of plain cases as they were)
            del d["relation"]
        return d

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
