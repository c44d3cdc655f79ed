"""llama.cpp's attention on ggml's CPU backend, as two backends: `ggml`
(ggml_flash_attn_ext) and `ggml-nofa` (flash attention off: mul_mat K.Q,
ggml_soft_max_ext with the KQ mask and scale, mul_mat V.P), each graph built as
llama.cpp's build_attn_mha builds it at decode (native/ggml/ggml_sdpa.c).

ggml is built from source (ggml_build.py: `probe build --ggml`, minutes), never on
import nor by `why_unavailable`, which says what to run instead.

The case's inputs are copied, from whatever layout it has, into ggml's own tensors as
an application writes them into llama.cpp's KV cache: Q float32 [B, Lq, H, D], K and V
in the case's dtype (F16 is llama.cpp's default cache; F32 and BF16 ggml's CPU paths
take too) in the cache's [B, Lkv, Hkv, D], V transposed ([B, Hkv, D, Lkv]) with flash
off, as llama.cpp keeps it then. The causal edge (bottom-right, start_pos) and the
case's own additive mask are one KQ mask, F16 for flash attention (ggml takes no
other), F32 with it off (llama.cpp's choice). The output, float32 [B, Lq, H, D] in
ggml, is written into the case's output in its dtype. Graph, buffers and threadpool
are made once per shape and calling thread; the compute alone is timed, in a C loop.

With an F16 (BF16) cache ggml rounds Q to F16 (BF16) before K.Q in its vector path
(q_len under 64; from 64 its tiled path keeps Q and its sums in F32), and with flash
off rounds Q and the normalised P to the cache's type for its two products; flash
attention's mask is F16. These are its conventions, declared (`convention`). Its
vector path also sums P.V in an F16 accumulator over an F16 V, although llama.cpp
asks the op for F32 precision: not declared, so judged as any error is. The int8
cases have no ggml counterpart (its Q8_0 has one scale per 32 values, not per
token)."""

from __future__ import annotations

import functools
import threading

import numpy as np
import torch

from .. import ggml_build
from ..build import load
from ..errors import BuildError, KernelError, ProbeError
from ..judge.convention import Convention
from ..party import CLoopParty
from ..reference import bias_matrix
from .base import Unsupported, write_bshd

KV_TYPES = {"f32": 0, "f16": 1, "bf16": 2}
KV_NP = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}  # (bf16: its bits)
Q, K, V, MASK, OUT = range(5)
F16_MAX = float(np.finfo(np.float16).max)
INT8_REASON = "ggml has no per-token int8 cache (its Q8_0 is one scale per 32 values)"
TILED_Q = 64  # ggml's flash attention takes its tiled path (F32 Q and sums) from here


@functools.lru_cache(maxsize=1)
def adapter():
    """(the ggml build, ffi, lib) of the module that drives ggml; a ProbeError saying
    what to run when ggml is not built here."""
    ggml = ggml_build.find()
    if ggml is None:
        lacking = ggml_build.missing_tools()
        raise ProbeError(f"ggml is not built: run `{ggml_build.BUILD_COMMAND}` (about two "
                         "minutes)" + (f"; first: {lacking}" if lacking else ""))
    mod = load(ggml_build.build_adapter(ggml))
    return ggml, mod.ffi, mod.lib


class GgmlGraph:
    """One shape's graph in ggml, its input and output tensors as numpy views."""

    def __init__(self, ffi, lib, pool, shape: dict):
        err = ffi.new("char[]", 256)
        ptr = lib.ggml_sdpa_new(ffi.new("ggml_sdpa_shape *", shape), pool, err, 256)
        if ptr == ffi.NULL:
            raise ProbeError(f"ggml: {ffi.string(err).decode()}")
        self.ptr = ffi.gc(ptr, lib.ggml_sdpa_free)
        self.pool = pool  # (the graph plans on it: it must outlive the graph)
        self.lib = lib
        B, H, Hkv, Lq, Lkv, D = (shape[k] for k in ("batch", "n_heads", "n_kv_heads", "q_len",
                                                     "kv_len", "head_dim"))
        kv_np = list(KV_NP.values())[shape["kv_type"]]
        v_dims = (B, Lkv, Hkv, D) if shape["flash"] else (B, Hkv, D, Lkv)
        mask_np = np.float16 if shape["flash"] else np.float32
        self.views = [self._view(ffi, part, dt, dims) for part, dt, dims in (
            (Q, np.float32, (B, Lq, H, D)), (K, kv_np, (B, Lkv, Hkv, D)), (V, kv_np, v_dims),
            (MASK, mask_np, (Lq, Lkv)), (OUT, np.float32, (B, Lq, H, D)))]

    def _view(self, ffi, part: int, dtype, dims) -> np.ndarray:
        n = self.lib.ggml_sdpa_nbytes(self.ptr, part)
        view = np.frombuffer(ffi.buffer(self.lib.ggml_sdpa_data(self.ptr, part), n), dtype)
        return view.reshape(dims)

    def fill(self, q, k, v, bias: np.ndarray, flash: bool) -> None:
        """q [B, Lq, H, D] as float32 (or bf16 bits), k and v [B, Lkv, Hkv, D] in the
        cache's storage, any strides; bias [Lq, Lkv] the additive mask."""
        self.views[Q][...] = bf16_to_f32(q) if q.dtype == np.uint16 else q
        self.views[K][...] = k
        self.views[V][...] = v if flash else v.transpose(0, 2, 3, 1)
        self.views[MASK][...] = bias

    def compute(self) -> np.ndarray:
        status = int(self.lib.ggml_sdpa_compute(self.ptr))
        if status:
            raise KernelError(f"ggml_graph_compute returned status {status}")
        return self.views[OUT]


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def shape_args(B, H, Hkv, Lq, Lkv, D, dtype: str, flash: bool, scale: float) -> dict:
    return {"batch": B, "n_heads": H, "n_kv_heads": Hkv, "q_len": Lq, "kv_len": Lkv,
            "head_dim": D, "kv_type": KV_TYPES[dtype], "flash": int(flash),
            "scale": scale if scale > 0 else D ** -0.5}


class GgmlBackend:
    name = "ggml"
    FLASH = True
    INVALID: tuple[str, ...] = ()  # (ggml aborts the process on a shape it cannot take)

    def __init__(self):
        self._graphs: dict[tuple, GgmlGraph] = {}
        self._pools: dict[tuple, object] = {}
        self._lock = threading.Lock()

    @classmethod
    def why_unavailable(cls) -> str | None:
        try:
            adapter()
        except (ProbeError, BuildError) as exc:
            return str(exc)
        return None

    def version(self) -> str:
        return adapter()[0].description + ("" if self.FLASH else ", flash attention off")

    def supports(self, case) -> str | None:
        if case.dtype == "i8":
            return INT8_REASON
        if case.dtype not in KV_TYPES:
            return f"ggml has no {case.dtype} path"
        if not self.FLASH and case.kv_len == 0:
            # (it aborts the process: a [0, D] V cache's strides read as transposed)
            return "ggml_mul_mat asserts on a transposed V cache of 0 keys"
        return None

    def convention(self, case) -> Convention | None:
        """Where ggml rounds by design on this case (ggml-cpu/ops.cpp): flash attention
        stores the mask in F16 (llama.cpp's KQ mask with flash attention on) and, in
        its vector path (q_len under 64, and every BF16 cache), rounds Q to the cache's
        type for Q.K; with flash off, mul_mat rounds Q and the normalised P to the
        cache's type. Not declared: flash attention's F16 P.V accumulator over an F16 V,
        which the F32 precision llama.cpp asks of the op (GGML_PREC_F32) rules out; a
        case it fails stays a failure (docs/runtimes/ggml.md)."""
        dt = case.dtype if case.dtype in ("f16", "bf16") else None
        if not self.FLASH:
            return (Convention(f"Q and the normalised P rounded to {dt.upper()}", q=dt, p=dt,
                               p_normalised=True) if dt else None)
        rounds_q = dt is not None and (dt == "bf16" or case.q_len < TILED_Q)
        mask = "f16" if case.mask != "none" else None
        if not rounds_q and mask is None:
            return None
        what = [f"Q rounded to {dt.upper()} before Q·K"] if rounds_q else []
        what += ["the mask stored in F16"] if mask else []
        return Convention(", ".join(what), q=dt if rounds_q else None, mask=mask)

    def _pool(self, n_threads: int):
        """A threadpool per calling thread and thread count (a pool runs one graph at a
        time; each caller thread is a llama.cpp context of its own)."""
        _, ffi, lib = adapter()
        key = (threading.get_ident(), n_threads)
        if key not in self._pools:
            pool = lib.ggml_sdpa_pool_new(n_threads)
            if pool == ffi.NULL:
                raise ProbeError(f"ggml: no threadpool of {n_threads} threads")
            self._pools[key] = ffi.gc(pool, lib.ggml_sdpa_pool_free)
        return self._pools[key]

    def graph(self, args: dict, n_threads: int) -> GgmlGraph:
        """The shape's graph for this thread, made on its first call."""
        key = (threading.get_ident(), n_threads, tuple(sorted(args.items())))
        with self._lock:
            if key not in self._graphs:
                self._forget_ended_threads()
                _, ffi, lib = adapter()
                self._graphs[key] = GgmlGraph(ffi, lib, self._pool(n_threads), args)
            return self._graphs[key]

    def _forget_ended_threads(self) -> None:
        alive = {t.ident for t in threading.enumerate()}
        for d in (self._graphs, self._pools):
            for key in [k for k in d if k[0] not in alive]:
                del d[key]

    def run(self, data, out) -> None:
        c = data.case
        why = self.supports(c)
        if why:
            raise Unsupported(why)
        bias = bias_matrix(c.q_len, c.kv_len, mask=data.mask_t, is_causal=c.causal,
                           start_pos=c.start_pos).numpy()
        if self.FLASH:
            finite = bias[np.isfinite(bias)]
            if finite.size and np.abs(finite).max() > F16_MAX:
                raise Unsupported("mask values beyond the F16 range (ggml_flash_attn_ext "
                                  "takes an F16 mask)")
        g = self.graph(shape_args(c.batch, c.n_heads, c.n_kv_heads, c.q_len, c.kv_len,
                                  c.head_dim, c.dtype, self.FLASH, c.scale), c.n_threads)
        g.fill(data.q_store, data.k_store, data.v_store, bias, self.FLASH)
        write_bshd(out, torch.from_numpy(g.compute().copy()))

    def timer(self, shape, sets, threads: int) -> CLoopParty:
        """A graph per input set (its own K and V), on one threadpool, timed in C."""
        if shape.dtype not in KV_TYPES:
            raise Unsupported(INT8_REASON if shape.dtype == "i8" else f"no {shape.dtype} path")
        bias = bias_matrix(shape.q_len, shape.kv_len, is_causal=shape.causal,
                           start_pos=shape.start_pos).numpy()
        args = shape_args(shape.batch, shape.n_heads, shape.n_kv_heads, shape.q_len,
                          shape.kv_len, shape.head_dim, shape.dtype, self.FLASH, 0.0)
        _, ffi, lib = adapter()
        pool = self._pool(threads)
        graphs = []
        for s in sets:
            g = GgmlGraph(ffi, lib, pool, args)
            g.fill(s.q32, s.k, s.v, bias, self.FLASH)
            graphs.append(g)
        return GgmlParty(self.name, ffi, lib, graphs)


class GgmlNofaBackend(GgmlBackend):
    name = "ggml-nofa"
    FLASH = False


class GgmlParty(CLoopParty):
    """ggml_graph_compute on one graph per input set, rotated through, in a C loop."""

    def __init__(self, name: str, ffi, lib, graphs: list[GgmlGraph]):
        self.name = name
        self._ffi, self._lib, self._graphs = ffi, lib, graphs  # (kept alive while timed)
        self._ptrs = ffi.new("ggml_sdpa *[]", [g.ptr for g in graphs])
        self._next = 0

    def call(self, n: int, seconds_out=None) -> None:
        k = len(self._graphs)
        st = self._lib.ggml_sdpa_compute_loop(self._ptrs, k, self._next, n,
                                              self._ffi.NULL if seconds_out is None
                                              else seconds_out)
        if st:
            raise KernelError(f"{self.name}: ggml_graph_compute returned status {st}")
        self._next = (self._next + n) % k
