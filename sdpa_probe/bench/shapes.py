"""Bench shapes: named by a stable string that is also their spec, e.g.
`decode-h32kv8d64-kv8192-f32` or `prefill-h32kv8d64-q512-kv512-causal-f16`
(grammar: `{decode|prefill}-h{H}kv{Hkv}d{D}[-q{Q}]-kv{N}[-causal]-{dtype}[-b{B}]`;
decode means q_len 1, prefill means q_len = kv_len and causal unless given).
The presets are such names; any other name in the grammar is a custom shape.
An SDPA call's FLOPs and bytes are counted by workload.Workload."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

from ..errors import ProbeError
from ..workload import ITEMSIZE, Workload

DTYPES = ("f32", "f16", "bf16", "i8")
HEADS = ((32, 8, 64), (16, 16, 128))
DECODE_KV = (512, 2048, 8192, 32768)
PREFILL_LEN = 512

_NAME = re.compile(
    r"^(?P<kind>decode|prefill)-h(?P<h>\d+)kv(?P<hkv>\d+)d(?P<d>\d+)(?:-q(?P<q>\d+))?"
    r"-kv(?P<kv>\d+)(?P<causal>-causal)?-(?P<dtype>f32|f16|bf16|i8)(?:-b(?P<b>\d+))?$")


@dataclasses.dataclass(frozen=True)
class Shape:
    kind: str          # decode | prefill
    n_heads: int
    n_kv_heads: int
    head_dim: int
    q_len: int
    kv_len: int
    causal: bool
    dtype: str
    batch: int = 1

    @property
    def name(self) -> str:
        q = "" if (self.kind == "decode" and self.q_len == 1) else f"-q{self.q_len}"
        return (f"{self.kind}-h{self.n_heads}kv{self.n_kv_heads}d{self.head_dim}{q}"
                f"-kv{self.kv_len}{'-causal' if self.causal else ''}-{self.dtype}"
                + (f"-b{self.batch}" if self.batch != 1 else ""))

    @property
    def start_pos(self) -> int:
        """Bottom-right causal alignment: the queries are the last q_len positions."""
        return max(0, self.kv_len - self.q_len) if self.causal else 0

    @property
    def workload(self) -> Workload:
        # (an int8 shape's query is int8 too: its output F32)
        return Workload(self.batch, self.n_heads, self.n_kv_heads, self.q_len, self.kv_len,
                        self.head_dim, self.dtype, "", self.causal, self.start_pos)

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def out_dtype(self) -> str:
        return self.workload.out_dtype

    @property
    def flops(self) -> int:
        return self.workload.flops

    @property
    def kv_bytes(self) -> int:
        return self.workload.kv_bytes

    @property
    def kv_elements(self) -> int:
        return self.workload.kv_elements

    @property
    def bytes(self) -> int:
        return self.workload.bytes

    def as_dict(self) -> dict:
        return {"kind": self.kind, "batch": self.batch, "n_heads": self.n_heads,
                "n_kv_heads": self.n_kv_heads, "head_dim": self.head_dim, "q_len": self.q_len,
                "kv_len": self.kv_len, "causal": self.causal, "dtype": self.dtype}


def parse_shape(name: str) -> Shape:
    m = _NAME.match(name.strip())
    if m is None:
        raise ProbeError(f"bad shape {name!r}: want a preset, a group ({', '.join(GROUPS)}) or "
                         "{decode|prefill}-h{H}kv{Hkv}d{D}[-q{Q}]-kv{N}[-causal]-{dtype}[-b{B}], "
                         "e.g. decode-h32kv8d64-kv4096-f16")
    kind, kv = m["kind"], int(m["kv"])
    q = int(m["q"]) if m["q"] else (1 if kind == "decode" else kv)
    causal = bool(m["causal"]) or (kind == "prefill" and not m["q"])
    h, hkv, d = int(m["h"]), int(m["hkv"]), int(m["d"])
    b = int(m["b"]) if m["b"] else 1
    if min(h, hkv, d, q, kv, b) <= 0 or h % hkv:
        raise ProbeError(f"bad shape {name!r}: sizes must be positive and H a multiple of Hkv")
    return Shape(kind, h, hkv, d, q, kv, causal, m["dtype"], b)


def _presets() -> list[Shape]:
    out = []
    for dt in ("f32", "f16", "i8"):
        for h, hkv, d in HEADS:
            for kv in DECODE_KV:
                out.append(Shape("decode", h, hkv, d, 1, kv, False, dt))
            out.append(Shape("prefill", h, hkv, d, PREFILL_LEN, PREFILL_LEN, True, dt))
    return out


PRESETS: dict[str, Shape] = {s.name: s for s in _presets()}
GROUPS: dict[str, Callable[[Shape], bool]] = {
    "all": lambda s: True,
    "decode": lambda s: s.kind == "decode",
    "prefill": lambda s: s.kind == "prefill",
    # the shapes the performance targets are stated on
    "targets": lambda s: (s.n_heads == 32 and (s.kind == "prefill" and s.dtype == "f32"
                                                or s.kind == "decode" and (
                                                    s.kv_len == 8192 or s.dtype == "f32"
                                                    and s.kv_len in (512, 2048)))
                          # the int8 and F16 targets name no head shape: the other one too
                          or s.kind == "decode" and s.kv_len == 8192),
    "quick": lambda s: s.n_heads == 32 and s.kv_len in (2048, 8192) and s.kind == "decode",
}


def select_shapes(spec: str, dtypes: Sequence[str] | None = None) -> list[Shape]:
    """Comma-separated presets, groups and custom names, in order, without repeats."""
    out: list[Shape] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if part in GROUPS:
            picked = [s for s in PRESETS.values() if GROUPS[part](s)]
        else:
            picked = [PRESETS.get(part) or parse_shape(part)]
        for s in picked:
            if dtypes and s.dtype not in dtypes:
                continue
            if s not in out:
                out.append(s)
    if not out:
        raise ProbeError(f"no shape selected by {spec!r}"
                         + (f" with dtypes {','.join(dtypes)}" if dtypes else ""))
    return out

