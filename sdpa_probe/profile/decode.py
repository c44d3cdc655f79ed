"""The native decode step (native/include/sdpa_probe_decode.h) behind numpy-friendly objects."""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from .. import native
from ..errors import ProbeError, SdpaInvalid, SdpaUnsupported
from .models import ModelShape

WEIGHT_DTYPES = {"f32": native.F32, "f16": native.F16}
CACHE_DTYPES = {"f32": native.F32, "f16": native.F16, "i8": native.I8}
ROPE_STYLES = {"half": 0, "interleaved": 1}
GRAPH_DECOMPOSED, GRAPH_KERNEL = 0, 1
ENOMEM = 3


@dataclasses.dataclass(frozen=True)
class OpInfo:
    name: str
    kind: str
    layer: int


def _status(st: int, what: str) -> None:
    if st == 0:
        return
    if st == ENOMEM:
        raise ProbeError(f"{what}: out of memory")
    if st == 1:
        raise SdpaUnsupported(f"{what}: SDPA_UNSUPPORTED")
    raise SdpaInvalid(f"{what}: SDPA_INVALID (status {st})")


def _config(ffi, shape: ModelShape, weight_dtype: str, seed: int, threads: int,
            rope_style: str):
    cfg = ffi.new("sdpa_probe_decode_config *")
    cfg.n_layers, cfg.hidden, cfg.n_heads = shape.layers, shape.hidden, shape.heads
    cfg.n_kv_heads, cfg.head_dim, cfg.ffn, cfg.vocab = (shape.kv_heads, shape.head_dim,
                                                        shape.ffn, shape.vocab)
    cfg.weight_dtype = WEIGHT_DTYPES[weight_dtype]
    cfg.rope_style = ROPE_STYLES[rope_style]
    cfg.rope_theta, cfg.norm_eps = shape.rope_theta, shape.norm_eps
    cfg.seed = seed & 0xFFFFFFFFFFFFFFFF
    cfg.n_threads = threads
    return cfg


def _native(lib):
    """(ffi, lib) of a build (builds.Build, anything with .ffi and .lib) or the default one."""
    if lib is None:
        ffi, lib_, _ = native.native_lib()
        return ffi, lib_
    return lib.ffi, lib.lib


def model_bytes(shape: ModelShape, weight_dtype: str) -> int:
    ffi, lib, _ = native.native_lib()
    return int(lib.sdpa_probe_decode_model_bytes(_config(ffi, shape, weight_dtype, 0, 0, "half")))


def state_bytes(shape: ModelShape, graph: int, cache_dtype: str, capacity: int) -> int:
    ffi, lib, _ = native.native_lib()
    cfg = _config(ffi, shape, "f16", 0, 0, "half")
    return int(lib.sdpa_probe_decode_state_bytes(cfg, graph, CACHE_DTYPES[cache_dtype], capacity))


def record_cost_ns(iters: int = 200000, build=None) -> float:
    """Cost of the per-op bookkeeping (two clock reads, two allocation-counter reads)."""
    _, lib = _native(build)
    lib.sdpa_probe_decode_record_cost_ns(1000)  # warm the vDSO path
    return min(float(lib.sdpa_probe_decode_record_cost_ns(iters)) for _ in range(3))


class DecodeModel:
    """Random weights for a shape (a deterministic function of seed), in the native
    library of `build` (a builds.Build; None: the default build)."""

    def __init__(self, shape: ModelShape, weight_dtype: str = "f16", seed: int = 0,
                 threads: int = 0, rope_style: str = "half", build=None):
        ffi, lib = _native(build)
        self.ffi, self.lib = ffi, lib
        self.shape, self.weight_dtype, self.rope_style = shape, weight_dtype, rope_style
        self._cfg = _config(ffi, shape, weight_dtype, seed, threads, rope_style)
        pp = ffi.new("sdpa_probe_decode_model **")
        _status(lib.sdpa_probe_decode_model_new(self._cfg, pp), "allocating the weights")
        self._ptr = ffi.gc(pp[0], lib.sdpa_probe_decode_model_free)

    def close(self) -> None:
        if self._ptr is not None:
            self.ffi.release(self._ptr)
            self._ptr = None


class DecodeState:
    """One attention graph's KV caches and scratch over a model.

    graph GRAPH_DECOMPOSED: the torch-style export graph built from blocks;
    GRAPH_KERNEL: kernel_index (a registered SDPA kernel) reading the roped cache, or
    kernel_index -1 and then set_forward() with any sdpa_forward's address."""

    def __init__(self, model: DecodeModel, graph: int, kernel_index: int, cache_dtype: str,
                 capacity: int, threads: int = 0):
        ffi, lib = model.ffi, model.lib
        self.ffi, self.lib, self.model = ffi, lib, model
        self.graph, self.cache_dtype, self.capacity = graph, cache_dtype, capacity
        pp = ffi.new("sdpa_probe_decode_state **")
        _status(lib.sdpa_probe_decode_state_new(model._ptr, graph, kernel_index,
                                                CACHE_DTYPES[cache_dtype], capacity, threads, pp),
                "allocating the KV cache and scratch")
        self._ptr = ffi.gc(pp[0], lib.sdpa_probe_decode_state_free)
        n = int(lib.sdpa_probe_decode_op_count(self._ptr))
        name, kind, layer = ffi.new("char **"), ffi.new("char **"), ffi.new("int64_t *")
        ops = []
        for i in range(n):
            lib.sdpa_probe_decode_op_info(self._ptr, i, name, kind, layer)
            ops.append(OpInfo(ffi.string(name[0]).decode(), ffi.string(kind[0]).decode(),
                              int(layer[0])))
        self.ops: list[OpInfo] = ops
        self._rec = ffi.new("sdpa_probe_op_record[]", n)
        self._rec_np = np.frombuffer(ffi.buffer(self._rec), dtype=np.int64).reshape(n, 4)
        self._step_ns = ffi.new("int64_t *")
        self._next = ffi.new("int64_t *")
        self._logits = np.zeros(model.shape.vocab, np.float32)
        self._logits_ptr = ffi.from_buffer("float[]", self._logits)

    def set_forward(self, address: int, keep=None) -> None:
        """Call the sdpa_forward at this address (e.g. a user kernel's, from its own cffi
        module) in the attention slot; keep holds whatever keeps that code loaded."""
        fn = self.ffi.cast("sdpa_probe_forward_fn", address)
        _status(self.lib.sdpa_probe_decode_set_forward(self._ptr, fn), "setting the kernel")
        self._forward_keep = keep

    def fill_history(self, begin: int, end: int, seed: int) -> None:
        _status(self.lib.sdpa_probe_decode_fill_history(self._ptr, begin, end,
                                                        seed & 0xFFFFFFFFFFFFFFFF),
                "filling the KV cache")

    def step(self, token: int, pos: int, timed: bool = True, logits: bool = False):
        """One step. Returns (wall_ns, native_step_ns, records copy or None, next_token);
        with logits=True the logits are in self.last_logits."""
        lib, ffi = self.lib, self.ffi
        rec = self._rec if timed else ffi.NULL
        lp = self._logits_ptr if logits else ffi.NULL
        t0 = time.perf_counter_ns()
        st = lib.sdpa_probe_decode_step(self._ptr, token, pos, lp, self._next, rec, self._step_ns)
        wall = time.perf_counter_ns() - t0
        _status(st, "decode step")
        return wall, int(self._step_ns[0]), (self._rec_np.copy() if timed else None), \
            int(self._next[0])

    @property
    def last_logits(self) -> np.ndarray:
        return self._logits

    def close(self) -> None:
        if self._ptr is not None:
            self.ffi.release(self._ptr)
            self._ptr = None
