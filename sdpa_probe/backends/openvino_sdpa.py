"""OpenVINO's CPU plugin running the opset-13 ScaledDotProductAttention op, one model of
that one op compiled per shape, dtype and flags (openvino_graph.py builds it), with
INFERENCE_PRECISION_HINT set per backend: `openvino` f32 (the plugin's default on a
CPU with AMX is bf16, which errs by ~1e-3 on F32 inputs), `openvino-bf16` bf16 and
`openvino-f16` f16. Each takes the cases whose query and output dtype is its
precision, so a case is judged at its own dtype's tolerance; `version()` says the
precision the compiled model reports back.

The op's conventions, and how a case is put to it so that it computes the oracle's
definition:
  - causal: the op's own is top-left (query i sees keys j <= i), ours is j <=
    start_pos + i. The op is given the filled part of the cache, keys [0, start_pos +
    q_len) (the op has no start_pos: it multiplies in every key it is given, so a stale
    NaN slot behind the edge would turn rows NaN), and then its flag where start_pos is
    0 and no mask is given (the two edges agree there); no mask at all where the edge
    hides no key (a decode step); else the edge and the case's mask as one additive
    float32 mask made here.
  - grouped-query heads: the op broadcasts K / V heads numpy-wise only (1 over H); it
    refuses 8 query heads over 2 kv heads at validation, so the graph broadcasts them
    (Unsqueeze, Broadcast, Reshape: OpenVINO's work, not a copy made here).
  - rows that see no key: the op gives NaN there (F32 and boolean masks alike); the
    oracle gives zeros. Left as the op answers: the check reports it.
Inputs are ov.Tensors over the case's own numpy memory (no copy); a strided view is cut
out of its C-contiguous block in the graph. The output is copied into out.view. One
InferRequest per compiled model and calling thread, reused."""

from __future__ import annotations

import functools
import importlib.util
import threading
from importlib import metadata

import numpy as np

from ..party import Party, PyParty
from .base import Unsupported
from .openvino_graph import Frame, frame, sdpa_model

INSTALL = "pip install openvino==2026.4.1"
FLOAT_DTYPES = ("f32", "f16", "bf16")


@functools.lru_cache(maxsize=1)
def ov_modules():
    """(openvino, openvino.opset13), imported on first use: importing openvino starts
    threads, which stay out of every process that never runs it."""
    import openvino  # deferred: see above
    import openvino.opset13 as ops  # deferred: with openvino

    return openvino, ops


def openvino_version() -> str | None:
    try:
        return metadata.version("openvino")
    except metadata.PackageNotFoundError:
        return None


def element_type(dtype: str):
    ov = ov_modules()[0]
    return {"f32": ov.Type.f32, "f16": ov.Type.f16, "bf16": ov.Type.bf16}[dtype]


def attention_mask(q_len: int, kv_len: int, causal: bool, start_pos: int,
                   mask: np.ndarray | None) -> tuple[bool, np.ndarray | None]:
    """(the op's causal flag, the mask to give it) for the oracle's causal edge: the
    op's own flag where it agrees (start_pos 0, no mask), nothing where the edge hides
    no key, else the edge added to the case's mask in a float32 array of our own."""
    if not causal or (start_pos >= kv_len - 1 and mask is None):
        return False, mask
    if start_pos == 0 and mask is None:
        return True, None
    merged = np.zeros((q_len, kv_len), np.float32) if mask is None else mask.copy()
    hidden = np.arange(kv_len)[None, :] > start_pos + np.arange(q_len)[:, None]
    merged[hidden] = -np.inf
    return False, merged


def framed(view: np.ndarray, what: str) -> tuple[np.ndarray, Frame, tuple[int, ...]]:
    """(the block ov.Tensor shares, its Frame, the axes the view walks backwards) for
    one input view; Unsupported when its memory is no block OpenVINO can share."""
    flipped = tuple(i for i in range(view.ndim) if view.strides[i] < 0 and view.shape[i] > 1)
    got = frame(np.flip(view, flipped) if flipped else view)
    if got is None:
        raise Unsupported(f"{what}'s memory is no C-contiguous block (ov.Tensor shares "
                          "only such; strides that do not nest, or a block past its memory)")
    return got[0], got[1], flipped


class OpenvinoBackend:
    name = "openvino"
    PRECISION = "f32"  # INFERENCE_PRECISION_HINT, and the query / output dtype it takes
    # (the op's shape inference refuses kv heads that do not divide the query heads, but
    # it refuses 2 kv heads for 8 query heads just as well: its refusal says nothing of
    # an invalid call)
    INVALID: tuple[str, ...] = ()

    def __init__(self):
        self._core = None
        self._precision: str | None = None
        self._compiled: dict = {}
        self._requests: dict = {}
        self._lock = threading.Lock()

    @classmethod
    def why_unavailable(cls) -> str | None:
        if importlib.util.find_spec("openvino") is None:
            return f"openvino is not installed: {INSTALL}"
        return None

    def version(self) -> str:
        return (f"openvino {openvino_version()} (CPU, INFERENCE_PRECISION_HINT "
                f"{self.PRECISION}, compiled model reports {self.precision_ran()})")

    def precision_ran(self) -> str:
        """The inference precision a compiled model reports (the plugin may refuse the
        hint's type and run another)."""
        if self._precision is None:
            self._precision = self._read_precision()
        return self._precision

    def _read_precision(self) -> str:
        ov, ops = ov_modules()
        p = ops.parameter([1, 1, 2, 8], element_type(self.PRECISION))
        model = ov.Model([ops.scaled_dot_product_attention(p, p, p)], [p])
        cm = self.core().compile_model(model, "CPU", self.config(1))
        return str(cm.get_property("INFERENCE_PRECISION_HINT").to_string())

    def core(self):
        if self._core is None:
            self._core = ov_modules()[0].Core()
        return self._core

    def config(self, n_threads: int) -> dict:
        return {"INFERENCE_PRECISION_HINT": self.PRECISION, "PERFORMANCE_HINT": "LATENCY",
                "NUM_STREAMS": 1, "INFERENCE_NUM_THREADS": max(0, n_threads)}

    def supports(self, case) -> str | None:
        if case.dtype == "i8":
            return "the opset-13 ScaledDotProductAttention op has no int8 path"
        if case.out_dtype != self.PRECISION:
            other = "openvino" if case.out_dtype == "f32" else f"openvino-{case.out_dtype}"
            return (f"{self.name} runs {self.PRECISION} queries (its inference precision); "
                    f"{case.out_dtype} ones: {other}")
        return None

    def run(self, data, out) -> None:
        c = data.case
        why = self.supports(c)
        if why:
            raise Unsupported(why)
        # a causal case's cache slots past start_pos + q_len are no key of any row: the op
        # is given the filled part of the cache, as a caller gives it
        seen = c.keys_in_reach
        k, v, mask = data.k_store[:, :seen], data.v_store[:, :seen], data.mask
        is_causal, mask = attention_mask(c.q_len, seen, c.causal, c.start_pos,
                                         None if mask is None else mask[:, :seen])
        views = [(data.q_store, c.out_dtype, "Q"), (k, c.dtype, "K"), (v, c.dtype, "V")]
        if mask is not None:
            views.append((mask, "f32", "the mask"))
        blocks = [(*framed(v, what), dtype) for v, dtype, what in views]
        scale = c.scale if c.scale > 0 else None
        key = (tuple((b.dtype.str, f, flip, d) for b, f, flip, d in blocks), c.n_heads,
               c.n_kv_heads, is_causal, scale, c.n_threads)
        shapes = [tuple(v.shape) for v, _, _ in views]
        request = self.request(key, lambda: self._model(blocks, shapes, c.n_heads, is_causal,
                                                        scale), c.n_threads)
        ov = ov_modules()[0]
        for i, (block, _f, _flip, dtype) in enumerate(blocks):
            request.set_input_tensor(i, ov.Tensor(block, list(block.shape),
                                                  element_type(dtype)))
        request.infer()
        got = request.get_output_tensor(0).data
        out.view[...] = got.view(np.uint16) if out.view.dtype == np.uint16 else got

    def _model(self, blocks, shapes, n_heads: int, is_causal: bool, scale: float | None):
        ov, ops = ov_modules()
        inputs = [(element_type(d), f, flip, s)
                  for (_b, f, flip, d), s in zip(blocks, shapes, strict=True)]
        mask = inputs[3][:3] if len(inputs) > 3 else None
        return sdpa_model(ov, ops, inputs[:3], element_type(self.PRECISION), n_heads,
                          causal=is_causal, scale=scale, mask=mask)

    def request(self, key, build, n_threads: int):
        """The InferRequest of the model `key` names (compiled by build() once) for the
        calling thread."""
        with self._lock:
            cm = self._compiled.get(key)
            if cm is None:
                cm = self.core().compile_model(build(), "CPU", self.config(n_threads))
                self._compiled[key] = cm
            slot = (key, threading.get_ident())
            if slot not in self._requests:
                self._requests[slot] = cm.create_infer_request()
            return self._requests[slot]

    def timer(self, shape, sets, threads: int) -> Party:
        """infer() on [B, S, H, D] inputs in the shape's dtype: the model is compiled,
        and each input set's tensors made (over the set's own memory) and set on an
        InferRequest of its own, before any call is timed; a call is infer() alone
        (the output stays in the request's memory)."""
        if shape.dtype not in FLOAT_DTYPES or shape.out_dtype != self.PRECISION:
            raise Unsupported(f"{self.name} times {self.PRECISION} shapes")
        if shape.n_heads % shape.n_kv_heads:
            raise Unsupported("n_heads not a multiple of n_kv_heads")
        ov = ov_modules()[0]
        is_causal, mask = attention_mask(shape.q_len, shape.kv_len, shape.causal,
                                         shape.start_pos, None)
        first = [(x, shape.dtype) for x in (sets[0].q, sets[0].k, sets[0].v)]
        if mask is not None:
            first.append((mask, "f32"))
        blocks = [(*framed(x, "a bench input"), d) for x, d in first]
        model = self._model(blocks, [x.shape for x, _ in first], shape.n_heads, is_causal,
                            None)
        cm = self.core().compile_model(model, "CPU", self.config(threads))
        fns = []
        for s in sets:
            request = cm.create_infer_request()
            arrays = [s.q, s.k, s.v] + ([mask] if mask is not None else [])
            tensors = [ov.Tensor(np.ascontiguousarray(x), list(x.shape), element_type(d))
                       for x, (_x, d) in zip(arrays, first, strict=True)]
            for i, t in enumerate(tensors):
                request.set_input_tensor(i, t)

            # (the call keeps the tensors: a request given one does not keep the memory it
            # shares alive, and the mask's is nobody else's)
            def call(request=request, tensors=tensors):
                request.infer()
            call.request = request
            fns.append(call)
        return PyParty(self.name, fns)


class OpenvinoBf16Backend(OpenvinoBackend):
    name = "openvino-bf16"
    PRECISION = "bf16"


class OpenvinoF16Backend(OpenvinoBackend):
    name = "openvino-f16"
    PRECISION = "f16"
