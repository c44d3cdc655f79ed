"""Kernel-level benchmarks: native kernels against torch's and ExecuTorch's SDPA,
measured side by side in one process.

A *shape* is named by a stable string that is also its spec, e.g.
`decode-h32kv8d64-kv8192-f32` or `prefill-h32kv8d64-q512-kv512-causal-f16`
(grammar: `{decode|prefill}-h{H}kv{Hkv}d{D}[-q{Q}]-kv{N}[-causal]-{dtype}[-b{B}]`;
decode means q_len 1, prefill means q_len = kv_len and causal unless given).
The presets are such names; any other name in the grammar is a custom shape.

Every party (a native kernel, torch, ExecuTorch) is warmed up, then measured in
rounds: each round runs a batch of calls of every party in turn (the order
rotating), so a burst of other work on a shared machine lands on all of them.
Native kernels are timed call by call in a C loop (sdpa_probe_bench_loop, no
Python overhead per call); peers are timed call by call from Python, as their
users call them. Reported: median and IQR per call, bytes and FLOPs per call,
GB/s, % of the DRAM read bandwidth and % of the roofline bound that `probe info`
measured, and ratio = peer median / kernel median (> 1: the kernel is faster).

Warm (default): every call reuses the same buffers, so inputs smaller than the
last-level cache are read from cache. Cold (--cold): calls rotate through
copies of the inputs totalling at least four times the last-level cache.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from importlib import metadata

import numpy as np

from . import TOOL, native
from .errors import ProbeError
from .workload import ITEMSIZE, Workload

SCHEMA = 1
DTYPES = ("f32", "f16", "bf16", "i8")
HEADS = ((32, 8, 64), (16, 16, 128))
DECODE_KV = (512, 2048, 8192, 32768)
PREFILL_LEN = 512
PEERS = ("torch", "executorch")
DEFAULT_KERNEL = {"f32": "flash", "f16": "flash", "bf16": "flash", "i8": "quant_int8"}
COLD_FACTOR = 4          # cold inputs span at least this many last-level caches
COLD_MAX_SETS = 4096     # input sets a party rotates through, at most
COLD_MEM_SHARE = 8       # one party's rotation takes at most 1/this of the free memory
SLOW_CALL_S = 1.0        # a party slower than this per call gets MIN_ROUNDS samples
MIN_ROUNDS = 3

Progress = Callable[[str], None]

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


# ---- inputs ---------------------------------------------------------------------

@dataclasses.dataclass
class Inputs:
    """One set of inputs: float32 values, the stored form for our kernels, an output."""

    q32: np.ndarray
    k32: np.ndarray
    v32: np.ndarray
    q: object
    k: object
    v: object
    out: np.ndarray


def _store(x32: np.ndarray, dtype: str):
    """float32 [B, S, H, D] -> (stored object for our kernels, its real values as float32)."""
    if dtype == "f32":
        return x32, x32
    if dtype == "f16":
        s = x32.astype(np.float16)
        return s, s.astype(np.float32)
    if dtype == "bf16":
        import torch

        t = torch.from_numpy(x32).to(torch.bfloat16)
        return t.view(torch.int16).numpy().view(np.uint16), t.to(torch.float32).numpy()
    from .inputs import quantize_per_token

    q, scale, zp = quantize_per_token(x32)
    real = ((q.astype(np.float32) - zp[..., None].astype(np.float32)) * scale[..., None])
    return native.QuantTensor(q, scale, zp), real


def _copy(x):
    if isinstance(x, native.QuantTensor):
        return native.QuantTensor(x.data.copy(), x.scale.copy(), x.zero_point.copy())
    return x.copy()


def make_inputs(shape: Shape, n_sets: int = 1, seed: int = 0) -> list[Inputs]:
    rng = np.random.default_rng(seed)
    B, H, Hkv, D = shape.batch, shape.n_heads, shape.n_kv_heads, shape.head_dim
    q32 = rng.standard_normal((B, shape.q_len, H, D), dtype=np.float32)
    k32 = rng.standard_normal((B, shape.kv_len, Hkv, D), dtype=np.float32)
    v32 = rng.standard_normal((B, shape.kv_len, Hkv, D), dtype=np.float32)
    (q, q32), (k, k32), (v, v32) = (_store(x, shape.dtype) for x in (q32, k32, v32))
    out_np = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[shape.out_dtype]
    first = Inputs(q32, k32, v32, q, k, v, np.zeros((B, shape.q_len, H, D), out_np))
    sets = [first]
    for _ in range(1, n_sets):
        sets.append(Inputs(q32, k32, v32, _copy(q), _copy(k), _copy(v),
                           np.zeros_like(first.out)))
    return sets


def cold_sets(shape: Shape, llc_bytes: int | None, avail_bytes: int | None = None) -> int:
    """How many input copies make the rotation span COLD_FACTOR last-level caches: a
    byte budget, not a count, so that a small shape is as cold as a large one (a cap
    of 64 sets had left kv 512 rotating through 130 MB of a 300 MiB L3), short of
    that only where the free memory (avail_bytes) cannot hold it."""
    llc = llc_bytes or 32 << 20
    per = max(1, shape.bytes)
    cap = COLD_MAX_SETS
    if avail_bytes:
        cap = min(cap, avail_bytes // COLD_MEM_SHARE // per)
    return max(2, min(cap, math.ceil(COLD_FACTOR * llc / per) + 1))


def rotation_note(shape: Shape, n_sets: int, llc_bytes: int | None) -> str | None:
    """What to say when a cold rotation spans fewer than COLD_FACTOR last-level caches."""
    if not llc_bytes or n_sets * shape.bytes >= COLD_FACTOR * llc_bytes:
        return None
    return (f"{shape.name}: the cold inputs span {n_sets * shape.bytes / llc_bytes:.1f}x the "
            f"last-level cache, not {COLD_FACTOR}x (free memory): some reads may hit it")


# ---- parties ---------------------------------------------------------------------

class Party:
    """Something to time on a shape: run(n) makes n calls and returns their seconds."""

    name: str

    def run(self, n: int) -> list[float]:
        raise NotImplementedError


class NativeParty(Party):
    """A kernel behind the C ABI, timed in the library's C loop: a registered kernel
    by its index, a user kernel through its sdpa_forward's address."""

    def __init__(self, kernel: native.Kernel, shape: Shape, sets: list[Inputs], threads: int):
        self.name = kernel.name
        self.kernel = kernel
        self.shape = shape
        self.threads = threads
        # a registered kernel runs in its own library's loop; a user kernel's module has
        # none, so it runs in ours
        ffi, lib = (native.native_lib()[:2] if kernel.user else (kernel.ffi, kernel.lib))
        if not hasattr(lib, "sdpa_probe_bench_loop_fn"):
            raise ProbeError("the native library lacks sdpa_probe_bench_loop_fn (stale build?)")
        self._lib, self._ffi = lib, ffi
        self._fn = None
        if kernel.user:
            uffi = kernel.ffi
            address = int(uffi.cast("uintptr_t", uffi.addressof(kernel.lib, "sdpa_forward")))
            self._fn = ffi.cast("sdpa_probe_forward_fn", address)
        self._calls = [native.prepare(ffi, s.q, s.k, s.v, s.out, is_causal=shape.causal,
                                      start_pos=shape.start_pos, n_threads=threads)
                       for s in sets]
        self._args = ffi.new("sdpa_args[]", len(self._calls))
        for i, c in enumerate(self._calls):
            self._args[i] = c.args[0]
        self._next = 0

    def run(self, n: int) -> list[float]:
        buf = self._ffi.new("double[]", n)
        self.call(n, buf)
        return list(self._ffi.unpack(buf, n))

    def call(self, n: int, seconds_out=None) -> None:
        """n calls in the C loop (each call's seconds into seconds_out, if given)."""
        # rotate through the sets across batches: start where the last batch stopped
        k = len(self._calls)
        order = self._ffi.new("sdpa_args[]", k)
        for i in range(k):
            order[i] = self._args[(self._next + i) % k]
        buf = self._ffi.NULL if seconds_out is None else seconds_out
        if self._fn is not None:
            st = self._lib.sdpa_probe_bench_loop_fn(self._fn, order, k, n, buf)
        else:
            st = self._lib.sdpa_probe_bench_loop(self.kernel.info.index, order, k, n, buf)
        native.raise_for_status(int(st), self.name)
        self._next = (self._next + n) % k


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 to /dev/null (ExecuTorch's ops log every call there)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


class _PyParty(Party):
    """A Python callable per input set, timed call by call."""

    def __init__(self, name: str, fns: list[Callable[[], object]], quiet: bool = False):
        self.name = name
        self._fns = fns
        self._next = 0
        self._quiet = quiet

    def run(self, n: int) -> list[float]:
        import torch

        out = []
        fns, k = self._fns, len(self._fns)
        with torch.no_grad(), (_quiet_stderr() if self._quiet else contextlib.nullcontext()):
            for _ in range(n):
                f = fns[self._next]
                self._next = (self._next + 1) % k
                t0 = time.perf_counter()
                f()
                out.append(time.perf_counter() - t0)
        return out


_TORCH_DT = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def torch_party(shape: Shape, sets: list[Inputs]) -> Party:
    """torch.nn.functional.scaled_dot_product_attention on contiguous [B, H, L, D]
    tensors in the shape's dtype (float32 on the dequantised values for int8), a
    copy per input set."""
    import torch
    import torch.nn.functional as F

    dt = getattr(torch, _TORCH_DT.get(shape.dtype, "float32"))
    gqa = shape.n_heads != shape.n_kv_heads
    mask = None
    is_causal = shape.causal
    if shape.causal and shape.q_len != shape.kv_len:
        # torch's is_causal is top-left aligned; ours is bottom-right
        i = torch.arange(shape.q_len)[:, None] + shape.start_pos
        mask = torch.arange(shape.kv_len)[None, :] <= i
        is_causal = False
    fns = []
    for s in sets:
        # (copy=True: a decode q [B, 1, H, D] permuted is contiguous already, and
        # would otherwise be the sets' one shared array)
        q, k, v = (torch.from_numpy(x).to(dt, copy=True).permute(0, 2, 1, 3).contiguous()
                   for x in (s.q32, s.k32, s.v32))

        def call(q=q, k=k, v=v):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                                  enable_gqa=gqa)
        fns.append(call)
    return _PyParty("torch", fns)


def executorch_unsupported(shape: Shape) -> str | None:
    """Why ExecuTorch's custom ops cannot take this shape (they abort instead of
    returning an error), or None."""
    if shape.q_len > shape.kv_len:
        return "q_len > kv_len"
    if shape.n_heads % shape.n_kv_heads:
        return "n_heads not a multiple of n_kv_heads"
    if shape.dtype not in ("f32", "f16", "bf16", "i8"):
        return f"no {shape.dtype} path"
    return None


def executorch_inputs(shape: Shape, s: Inputs) -> tuple:
    """One input set as the ExecuTorch op's tensors: (q, k, v) for float shapes,
    (q, k, v, qz, qs, kz, ks, vz, vs) for int8; each set's own memory, so that a
    cold rotation reads what it says."""
    import torch

    if shape.dtype == "i8":
        def parts(x: native.QuantTensor):
            return (torch.from_numpy(x.data), torch.from_numpy(x.zero_point)[..., None],
                    torch.from_numpy(x.scale)[..., None])

        (q, qz, qs), (k, kz, ks), (v, vz, vs) = (parts(x) for x in (s.q, s.k, s.v))
        return q, k, v, qz, qs, kz, ks, vz, vs
    # a copy: the sets share their float32 values, and .to(float32) of them is none
    # (every cold F32 call had read the one same buffer)
    dt = getattr(torch, _TORCH_DT[shape.dtype])
    return tuple(torch.from_numpy(x).to(dt, copy=True) for x in (s.q32, s.k32, s.v32))


def executorch_party(shape: Shape, sets: list[Inputs]) -> Party:
    """llama.custom_sdpa (float) / llama.custom_quantized_sdpa (int8 per token) on
    [B, S, H, D]; start_pos makes the op read keys [0, kv_len)."""
    import torch

    from .backends import _load_executorch

    _load_executorch()
    start_pos = shape.kv_len - shape.q_len
    fns = []
    for s in sets:
        t = executorch_inputs(shape, s)
        if shape.dtype == "i8":
            def call(t=t):
                q, k, v, qz, qs, kz, ks, vz, vs = t
                return torch.ops.llama.custom_quantized_sdpa(
                    q, k, v, start_pos, None, 0.0, shape.causal, None, qz, qs, kz, ks, vz, vs,
                    False)
        else:
            def call(t=t):
                return torch.ops.llama.custom_sdpa(*t, start_pos, None, 0.0, shape.causal, None)
        fns.append(call)
    return _PyParty("executorch", fns, quiet=True)


def executorch_version() -> str | None:
    try:
        return metadata.version("executorch")
    except metadata.PackageNotFoundError:
        return None


# ---- measuring ---------------------------------------------------------------------

def summarize(seconds: Sequence[float]) -> dict:
    a = np.asarray(seconds, dtype=np.float64) * 1e6
    q25, q50, q75 = np.percentile(a, [25, 50, 75])
    return {"median_us": float(q50), "iqr_us": float(q75 - q25), "min_us": float(a.min()),
            "samples": int(a.size)}


# A median whose interquartile range is more than this fraction of it is marked
# noisy: the rounds disagreed (a neighbour came and went), so its ratios are
# uncertain by about as much.
NOISY_IQR = 0.10


def is_noisy(stats: dict) -> bool:
    return stats["iqr_us"] > NOISY_IQR * stats["median_us"]


F32_REFERENCE = "flash@f32"
DRAM_READ = "dram-read"


class ReadParty(Party):
    """`probe info`'s DRAM read benchmark (one pass over its buffer per call), timed
    in the same rounds as the kernels: on a shared machine the bandwidth a kernel
    is held against then had the same neighbours as the kernel."""

    def __init__(self, threads: int, nbytes: int):
        self.name = DRAM_READ
        self._ffi, self._lib, _ = native.native_lib()
        self._threads = threads
        self._buf = self._ffi.new("sdpa_probe_mb_buffer **")
        st = int(self._lib.sdpa_probe_mb_buffer_new(nbytes, threads, self._buf))
        if st != 0:
            raise ProbeError(f"could not allocate the {nbytes >> 20} MiB read buffer")
        self.nbytes = int(self._lib.sdpa_probe_mb_buffer_bytes(self._buf[0]))
        self._res = self._ffi.new("sdpa_probe_mb_result *")

    def run(self, n: int) -> list[float]:
        out = []
        for _ in range(n):
            st = int(self._lib.sdpa_probe_mb_read(self._buf[0], self._threads, 1, 1, self._res))
            if st != 0:
                raise ProbeError(f"the DRAM read benchmark failed (status {st})")
            out.append(float(self._res.best_seconds))
        return out

    def close(self) -> None:
        if self._buf[0] != self._ffi.NULL:
            self._lib.sdpa_probe_mb_buffer_free(self._buf[0])
            self._buf[0] = self._ffi.NULL

    def __del__(self):
        self.close()


FMA_PEAK = "fma-peak"
FMA_ITERS_PER_THREAD = 1 << 16  # x chains x lanes x 2 flops a thread: well under a ms here
SLOW_CORE = 0.85  # a same-run FMA rate under this share of probe info's gets a note


class FmaParty(Party):
    """`probe info`'s F32 FMA benchmark (independent chains on every thread), timed in
    the same rounds as the kernels: a core-bound kernel's time moves with the core's
    clock, which a shared host's neighbours change (stop 30: 345 GFLOP/s one hour, 455
    another), and this says what the core did during these very rounds."""

    def __init__(self, threads: int):
        self.name = FMA_PEAK
        self._ffi, self._lib, _ = native.native_lib()
        self._threads = threads
        self._res = self._ffi.new("sdpa_probe_mb_result *")
        self.flops = 0

    def run(self, n: int) -> list[float]:
        out = []
        for _ in range(n):
            st = int(self._lib.sdpa_probe_mb_fma(self._threads, FMA_ITERS_PER_THREAD, 1,
                                                 self._res))
            if st != 0:
                raise ProbeError(f"the FMA benchmark failed (status {st})")
            self.flops = int(self._res.work)
            out.append(float(self._res.best_seconds))
        return out


def f32_reference(shape: Shape, threads: int, n_sets: int = 1) -> NativeParty | None:
    """`flash` on the F32 twin of a F16 / BF16 / int8 shape, named F32_REFERENCE."""
    if shape.dtype == "f32":
        return None
    twin = dataclasses.replace(shape, dtype="f32")
    party = NativeParty(native.get_kernel("flash"), twin, make_inputs(twin, n_sets), threads)
    party.name = F32_REFERENCE
    return party


# A decode call within this factor of its L2-resident time is limited by the core
# (its arithmetic, conversions, overheads), not by where K and V come from.
CORE_LIMIT_SLACK = 1.15


def _l2_bytes_for(threads: int) -> int | None:
    """The L2 capacity the threads have between them (one L2 per core assumed)."""
    c = _cache_sizes()
    if not c.get("l2_bytes"):
        return None
    return threads * c["l2_bytes"] // max(1, c.get("l2_shared_cpus") or 1)


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


def _core_party_name(kernel: str, kv_len: int) -> str:
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


def measure(parties: Sequence[Party], rounds: int = 7, min_time: float = 0.05,
            max_batch: int = 2000, left: dict[str, list[str]] | None = None
            ) -> dict[str, list[float]]:
    """Interleaved timing: warm-up, then `rounds` rounds of one batch per party. A party
    that leaves its caller changed (a pinned thread, FTZ on, OMP_NUM_THREADS set: what
    `probe check` fails) would time every party after it in that state: it is put back
    after each of its batches, and said in `left` (party name -> the changes)."""
    from .caller_state import Guard

    guard = Guard(left)
    est = {}
    for p in parties:
        p.run(1)  # warm-up: first-touch, thread pool start, lazy init
        est[p.name] = min(p.run(2))
        guard.put_back(p.name)
    batch = {p.name: int(min(max_batch, max(1, math.ceil(min_time / max(est[p.name], 1e-7)))))
             for p in parties}
    samples: dict[str, list[float]] = {p.name: [] for p in parties}
    slow = {p.name for p in parties if est[p.name] > SLOW_CALL_S}
    for r in range(rounds):
        k = r % len(parties)
        for p in list(parties[k:]) + list(parties[:k]):  # rotate who goes first
            if p.name in slow and r >= MIN_ROUNDS:
                continue
            samples[p.name].extend(p.run(batch[p.name]))
            guard.put_back(p.name)
    return samples


def _roofline() -> dict | None:
    try:
        from . import machine

        return machine.roofline()
    except (ImportError, AttributeError, ProbeError, OSError):
        return None


def _cache_sizes() -> dict:
    """machine.cache_sizes(), or {} where it cannot be read."""
    try:
        from . import machine

        return machine.cache_sizes()
    except (ImportError, AttributeError, OSError):
        return {}


def _llc_bytes() -> int | None:
    c = _cache_sizes()
    return c.get("l3_bytes") or c.get("l2_bytes")


def _figures(shape: Shape, stats: dict, roof: dict | None, threads: int) -> dict:
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


def _read_buffer_bytes() -> int:
    try:
        from . import machine

        return int(machine.plan()["dram_buffer_bytes"])
    except (ImportError, AttributeError, KeyError, OSError):
        return 256 << 20


def _same_run_figures(shape: Shape, stats: dict, read_gb_s: float | None) -> dict:
    """The DRAM read bandwidth measured in the same rounds, and the kernel's share of it."""
    if not read_gb_s:
        return {"read_gb_s_same_run": None, "dram_pct_same_run": None}
    gb_s = shape.bytes / (stats["median_us"] * 1e-6) / 1e9
    return {"read_gb_s_same_run": round(read_gb_s, 2),
            "dram_pct_same_run": round(100.0 * gb_s / read_gb_s, 1)}


def _same_run_fma(gflops: float, roof: dict | None, threads: int) -> dict:
    """The F32 FMA rate measured in the same rounds, and its share of probe info's."""
    peak = (roof or {}).get("fma_gflops_all" if threads > 1 else "fma_gflops_1t")
    return {"fma_gflops_same_run": round(gflops, 1),
            "fma_pct_same_run": round(100.0 * gflops / peak, 1) if peak else None}


def is_kernel_file(spec: str) -> bool:
    return spec.endswith(native.KERNEL_SUFFIXES) or os.sep in spec


def resolve_kernels(specs: Sequence[str]) -> list[native.Kernel]:
    """Registered kernels by name and user kernels from .c / .cpp / .so files (built, or found
    in the build cache), in order; two files of one name are told apart by their path."""
    known = native.builtin_kernels()
    out: list[native.Kernel] = []
    for spec in specs:
        if is_kernel_file(spec):
            k = native.load_user_kernel(spec)
            if any(o.name == k.name for o in out):
                k = native.Kernel(k.ffi, k.lib, dataclasses.replace(k.info, name=f"user:{spec}"),
                                  user=True, build=k.build)
        elif spec in known:
            k = known[spec]
        else:
            raise ProbeError(f"unknown kernel {spec!r}; known: {', '.join(known)}, "
                             f"or {native.KERNEL_FILES} implementing sdpa_forward")
        if any(o.name == k.name for o in out):
            raise ProbeError(f"{spec} is given twice (as a kernel or a peer)")
        out.append(k)
    return out


def takes(kernel: native.Kernel, shape: Shape) -> bool:
    """Whether a registered kernel takes the shape's dtype (a user kernel says so by
    its status, at the first call)."""
    if kernel.user:
        return True
    if shape.dtype not in kernel.info.dtypes:
        return False
    return not (kernel.name.startswith("quant") and shape.dtype != "i8")  # int8 K/V only


def kernels_for(shape: Shape, kernels: Sequence[native.Kernel] | None) -> list[native.Kernel]:
    """The native kernels to run on a shape: the given ones that take its dtype, or
    the default fused kernel for the dtype."""
    if not kernels:
        return [native.get_kernel(DEFAULT_KERNEL[shape.dtype])]
    return [k for k in kernels if takes(k, shape)]


TRIAL_CRASH = "crashed in a trial call"  # _first_call's reason when the child died


def _first_call(party: NativeParty, left: dict[str, list[str]]) -> str | None:
    """Run a party's kernel once: None if it ran, else why it cannot be timed. A user
    kernel's first call is tried in a child process first: a crash there costs the child.
    What the call left changed in its caller is put back and said in `left`."""
    from .caller_state import Guard
    from .errors import SdpaInvalid, SdpaUnsupported
    from .harness import trial_call

    if party.kernel.user and party.kernel.build is not None:
        died = trial_call(party.kernel.build, dataclasses.asdict(party.shape), party.threads)
        if died:
            return f"{TRIAL_CRASH} ({died})"
    guard = Guard(left)  # (read here, after the kernel's build)
    try:
        party.run(1)
    except SdpaUnsupported:
        return "returned SDPA_UNSUPPORTED"
    except SdpaInvalid as exc:
        return "returned " + str(exc).split(": ", 1)[-1]
    finally:
        guard.put_back(party.name)
    return None


def run(shapes: Sequence[Shape], kernels: Sequence[str] | None = None,
        peers: Sequence[str] = ("torch",), threads: int | None = None, cold: bool = False,
        rounds: int = 7, min_time: float = 0.05, progress: Progress | None = None,
        roofline: dict | None | bool = True, allocs: bool = False) -> dict:
    """Benchmark every (kernel, shape) against the peers; returns the JSON document.
    Kernels and peers other than torch / executorch are registered kernel names or
    .c / .cpp / .so files implementing sdpa_forward (a native peer is timed like a kernel).
    allocs: also count each party's heap allocations per call (alloc_count, a worker)."""
    import torch

    say = progress or (lambda _m: None)
    known = native.builtin_kernels()
    for p in peers:
        if p not in PEERS and p not in known and not is_kernel_file(p):
            raise ProbeError(f"unknown peer {p!r}; known: {', '.join(PEERS)}, a kernel "
                             f"({', '.join(known)}) or {native.KERNEL_FILES} implementing "
                             "sdpa_forward")
    kernels = list(kernels or [])
    resolved = resolve_kernels(kernels + [p for p in peers if p not in PEERS])
    chosen, native_peers = resolved[:len(kernels)] or None, resolved[len(kernels):]
    # what a worker process loads a kernel by (a user kernel's name is not its file)
    spec_of = {k.name: spec for k, spec in zip(
        resolved, kernels + [p for p in peers if p not in PEERS], strict=True)}
    peers = [p for p in peers if p in PEERS] + [k.name for k in native_peers]
    ffi, lib, res = native.native_lib()
    if threads is None or threads <= 0:
        threads = int(lib.sdpa_probe_default_threads())
    notes: list[str] = []
    crashed: list[str] = []  # "shape: kernel" whose trial call died (the command exits 1)
    left_changed: dict[str, list[str]] = {}  # party -> what it left changed in its caller
    peers = list(peers)
    if "executorch" in peers:
        from .backends import executorch_library

        if executorch_library() is None:
            notes.append("executorch is not installed (pip install --no-deps "
                         "executorch==1.5.1): skipped")
            peers.remove("executorch")
    roof = _roofline() if roofline is True else (roofline or None)
    if roof is None:
        notes.append("no roofline (probe info): dram_pct and roofline_pct are null")
    elif (roof.get("load") or {}).get("busy"):
        notes.append("the roofline was measured while the machine was busy, so the % figures "
                     "are against low ceilings; probe info --refresh re-measures")
    llc = _llc_bytes()
    l2 = _l2_bytes_for(threads)
    from . import machine

    avail = machine.mem_available()

    monitor = machine.LoadMonitor()  # others' CPU use and the hypervisor's steal, for a note
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    results = []
    read: ReadParty | None = None
    fma = FmaParty(threads)
    try:
        for shape in shapes:
            ks = kernels_for(shape, chosen)
            if not ks:
                notes.append(f"{shape.name}: no selected kernel takes {shape.dtype}")
                continue
            n_sets = cold_sets(shape, llc, avail) if cold else 1
            say(f"{shape.name}: {', '.join([k.name for k in ks] + peers)}"
                + (f" ({n_sets} input sets, {n_sets * shape.bytes / 2**20:,.0f} MiB)"
                   if cold else ""))
            short = rotation_note(shape, n_sets, llc) if cold else None
            if short:
                notes.append(short)
            try:
                sets = make_inputs(shape, n_sets)
            except MemoryError as exc:
                raise ProbeError(f"shape {shape.name} does not fit in memory: {exc}") from None
            parties: list[Party] = []
            for k in ks:  # (a user kernel says by its status whether it takes the shape)
                party = NativeParty(k, shape, sets, threads)
                why = _first_call(party, left_changed)
                if why:
                    notes.append(f"{shape.name}: {k.name} {why}: skipped")
                    if why.startswith(TRIAL_CRASH):
                        crashed.append(f"{shape.name}: {k.name}")
                else:
                    parties.append(party)
            ks = [k for k in ks if any(p.name == k.name for p in parties)]
            names = [k.name for k in ks]
            if not names:
                continue
            # F16 / BF16 / int8: `flash` on the same shape in F32, timed in the same rounds, so
            # "how much faster than F32" is a side-by-side ratio like the peers' ones
            # F32 inputs (the reference; torch's for int8) rotate through as many sets as
            # their own bytes need
            f32_sets = (cold_sets(dataclasses.replace(shape, dtype="f32"), llc, avail)
                        if cold else 1)
            ref = f32_reference(shape, threads, f32_sets)
            if ref is not None:
                parties.append(ref)
            # decode: each kernel also at two L2-resident context lengths, for its limit
            lengths = core_lengths(shape, l2)
            if lengths:
                for k in ks:
                    for kv in lengths:
                        short = dataclasses.replace(shape, kv_len=kv)
                        sp = NativeParty(k, short, make_inputs(short, 1), threads)
                        sp.name = _core_party_name(k.name, kv)
                        parties.append(sp)
            if shape.kind == "decode":  # memory-bound: the bandwidth of these very rounds
                if read is None:
                    read = ReadParty(threads, _read_buffer_bytes())
                parties.append(read)
            parties.append(fma)  # and the core's FMA rate of these very rounds
            peer_skips = {}
            native_peer = {k.name: k for k in native_peers}
            for p in peers:
                if p in native_peer:
                    k = native_peer[p]
                    if p in names:
                        peer_skips[p] = "it is a kernel of this run"
                    elif not takes(k, shape):
                        peer_skips[p] = f"no {shape.dtype} path"
                    else:
                        party = NativeParty(k, shape, sets, threads)
                        why = _first_call(party, left_changed)
                        if why:
                            peer_skips[p] = why
                            if why.startswith(TRIAL_CRASH):
                                crashed.append(f"{shape.name}: {k.name}")
                        else:
                            parties.append(party)
                elif p == "torch":
                    parties.append(torch_party(shape, sets[:f32_sets] if shape.dtype == "i8"
                                               else sets))
                else:
                    why = executorch_unsupported(shape)
                    if why:
                        peer_skips[p] = why
                    else:
                        parties.append(executorch_party(shape, sets))
            samples = measure(parties, rounds=rounds, min_time=min_time, left=left_changed)
            stats = {name: summarize(s) for name, s in samples.items()}
            same_bw = (read.nbytes / (stats[DRAM_READ]["median_us"] * 1e-6) / 1e9
                       if DRAM_READ in stats else None)
            same_fma = fma.flops / (stats[FMA_PEAK]["median_us"] * 1e-6) / 1e9
            peer_stats = {p: stats[p] | _figures(shape, stats[p], roof, threads)
                          for p in peers if p in stats}
            if ref is not None:
                peer_stats[F32_REFERENCE] = (stats[F32_REFERENCE]
                                             | _figures(ref.shape, stats[F32_REFERENCE], roof,
                                                        threads))
            for n in names:
                st = stats[n]
                core = {"core_us": None, "core_kv": None, "limit": None}
                if lengths:
                    core_us, limit = core_limit(st["median_us"], shape.kv_len, lengths,
                                                *(stats[_core_party_name(n, kv)]["median_us"]
                                                  for kv in lengths))
                    core = {"core_us": round(core_us, 2), "core_kv": list(lengths),
                            "limit": limit}
                results.append({
                    "kernel": n, "shape": shape.name, **shape.as_dict(),
                    "median_us": round(st["median_us"], 2), "iqr_us": round(st["iqr_us"], 2),
                    "noisy": is_noisy(st),
                    "min_us": round(st["min_us"], 2), "samples": st["samples"],
                    "bytes": shape.bytes, "kv_bytes": shape.kv_bytes, "flops": shape.flops,
                    "input_sets": n_sets,  # cold: the copies rotated through (warm: 1)
                    **_figures(shape, st, roof, threads),
                    **_same_run_figures(shape, st, same_bw),
                    **_same_run_fma(same_fma, roof, threads),
                    **core,
                    "ratio": {p: round(ps["median_us"] / st["median_us"], 3)
                              for p, ps in peer_stats.items()},
                    "allocs": None,  # heap allocations per call (filled in at the end)
                    "peers": {p: {k: (round(v, 2) if isinstance(v, float) else v)
                                  for k, v in ps.items()} | {"noisy": is_noisy(ps),
                                                             "allocs": None}
                              for p, ps in peer_stats.items()},
                    "peer_skipped": peer_skips,
                })
            del parties, sets
    finally:
        torch.set_num_threads(saved_threads)
        if read is not None:
            read.close()
    load = monitor.result()
    notes.extend(f"{name} left its caller changed ({'; '.join(what)}): put back after each of "
                 "its batches, so that the parties after it ran as they should (probe check "
                 "fails such a kernel)" for name, what in left_changed.items())
    if allocs and results:
        say("counting heap allocations per call")
        why = _count_allocs(results, spec_of, threads)
        if why:
            notes.append(why)
        notes.extend(_thread_start_notes(results))
    if load["busy"]:
        notes.append(f"other processes or the hypervisor took "
                     f"{load['other_cpu_fraction'] + load['steal_fraction']:.0%} of the CPUs "
                     "during these rounds: times may be high and ratios skewed")
    slow = sorted({r["shape"] for r in results if r["fma_pct_same_run"] is not None
                   and r["fma_pct_same_run"] < 100 * SLOW_CORE})
    if slow:
        low = min(r["fma_pct_same_run"] for r in results if r["shape"] in slow)
        notes.append(f"the core ran slower than when probe info measured it (F32 FMA in the same "
                     f"rounds down to {low:.0f}% of its peak): times bound by the core are high, "
                     f"and their ratios to memory-bound parties low, for {', '.join(slow)}")
    noisy = [f"{r['shape']} {r['kernel']}" for r in results if r["noisy"]]
    noisy += sorted({f"{r['shape']} {p}" for r in results for p, ps in r["peers"].items()
                     if ps["noisy"]})
    if noisy:
        notes.append(f"noisy (IQR over {NOISY_IQR:.0%} of the median; more --rounds or a "
                     f"quieter machine): {', '.join(noisy)}")
    doc = {
        "schema": SCHEMA,
        "tool": dict(TOOL),
        "mode": "cold" if cold else "warm",
        "threads": threads,
        "rounds": rounds,
        "min_batch_seconds": min_time,
        "machine": _machine_summary(res),
        "roofline": None if roof is None else {
            k: roof.get(k) for k in ("read_bw_gbs_1t", "read_bw_gbs_all", "l2_read_bw_gbs",
                                     "fma_gflops_1t", "fma_gflops_all",
                                     *(k for k in roof if k.startswith("cvt_")),
                                     "measured_at", "load")},
        "versions": {"torch": torch.__version__, "executorch": executorch_version(),
                     "numpy": np.__version__},
        "peers": peers,
        "load": load,
        "notes": notes,
        "crashed": crashed,
        # kernels asked for (--kernel) that no shape timed: each declined or crashed on all
        "untimed": [k.name for k in chosen or ()
                    if not any(r["kernel"] == k.name for r in results)],
        "results": results,
    }
    # the kernel-speed targets this run measured (none for a user's kernel or other shapes)
    doc["targets"] = [t for t in check_targets(doc) if t["met"] is not None]
    return doc


def _count_allocs(results: list[dict], spec_of: dict, threads: int) -> str | None:
    """Each result's heap allocations per call, its kernel's and its peers' (not the F32
    reference: that is `flash`), counted in a worker (alloc_count): result["allocs"] and
    result["peers"][p]["allocs"]. Returns why nothing was counted, or None."""
    from . import alloc_count

    jobs: list[dict] = []
    where: list[list[dict]] = []
    index: dict[tuple[str, str], int] = {}
    for r in results:
        for name, into in [(r["kernel"], r)] + [(p, ps) for p, ps in r["peers"].items()
                                                  if p != F32_REFERENCE]:
            key = (r["shape"], spec_of.get(name, name))
            if key not in index:
                index[key] = len(jobs)
                jobs.append({"shape": key[0], "party": key[1]})
                where.append([])
            where[index[key]].append(into)
    counts, why = alloc_count.count(jobs, threads)
    for c, intos in zip(counts, where, strict=True):
        for into in intos:
            into["allocs"] = c
    return why


def _thread_start_notes(results: list[dict]) -> list[str]:
    """A note per party that starts threads on every call (alloc_count's `threads`): a
    pool kept between calls costs nothing per call; a thread started and joined costs
    some 8 µs here (docs/performance.md), and a decode step makes the call per layer."""
    seen: dict[str, tuple[float, str]] = {}
    for r in results:
        for name, c in [(r["kernel"], r.get("allocs"))] + [
                (p, ps.get("allocs")) for p, ps in r["peers"].items()]:
            n = (c or {}).get("threads") or 0
            if n >= 0.5 and n > seen.get(name, (0, ""))[0]:
                seen[name] = (n, r["shape"])
    return [f"{name} starts {n:g} threads on every call (e.g. {shape}): a thread pool kept "
            "between calls would not" for name, (n, shape) in seen.items()]


# ---- the performance targets (issue: kernel speed) ----------------------------------

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


def _machine_summary(res) -> dict:
    from .build import cpu_model

    out = {"cpu_model": cpu_model(), "compiler": res.cc_version, "flags": list(res.flags),
           "module": res.module_name}
    try:
        from . import machine

        m = machine.describe()
        out.update(logical_cores=m.get("logical_cores"), caches=m.get("caches"),
                   isa=[k for k, v in (m.get("isa") or {}).items() if v])
    except (ImportError, AttributeError, OSError):
        pass
    return out
