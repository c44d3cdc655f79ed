"""OpenVINO's stateful LLM path as a backend (`openvino-stateful`): the KV cache in
ReadValue / Assign variables, reordered by a beam index (Gather) and extended by the new
keys (Concat), feeding ScaledDotProductAttention: the pattern the CPU plugin fuses into
its own SDPA kernel (layer type ScaledDotProductAttention, the one OpenVINO's LLM
pipelines run), checked after every compile. Inference precision and KV_CACHE_PRECISION
f32 (the cache's default here is u8, which errs by ~1e-3).

How a case is put to it: the fused node's keys are the past (the state) plus as many new
keys as there are queries, and its causal edge is bottom-right (row i sees keys j <=
past + i). A causal case gives keys [0, start_pos + q_len), the first start_pos as the
past, so the node's own edge is the oracle's; a mask is added (with the edge, in one
float32 mask of ours) where the case has one or the cache is shorter; a non-causal case
gives all kv_len keys, the last q_len as the new ones. Inputs are copied: the past into
the state (as setting a state does), the new rows as float32 arrays of their values (F16
and BF16 widen exactly)."""

from __future__ import annotations

import time

import numpy as np

from ..party import Party
from .base import Unsupported
from .openvino_sdpa import OpenvinoBackend, attention_mask, openvino_version, ov_modules

FUSED = "ScaledDotProductAttention"  # the fused node's runtime layer type


def stateful_model(ov, ops, batch: int, n_heads: int, n_kv_heads: int, head_dim: int, *,
                   causal: bool, masked: bool, scale: float | None):
    """Inputs q [B, L, H, D], k and v [B, L, Hkv, D] (the new rows), beam_idx [B], and
    with `masked` an additive [L, past + L] mask; variables past_k and past_v [B, Hkv, P,
    D]; output [B, L, H, D]."""
    from openvino.op.util import Variable, VariableInfo  # deferred: with openvino

    def const(v):
        return ops.constant(np.array(v, np.int64))

    def bhsd(x):
        return ops.transpose(x, const([0, 2, 1, 3]))

    q = ops.parameter([batch, -1, n_heads, head_dim], ov.Type.f32, name="q")
    beam = ops.parameter([batch], ov.Type.i32, name="beam_idx")
    params, sinks, variables, kv = [q], [], [], []
    for name in ("k", "v"):
        new = ops.parameter([batch, -1, n_kv_heads, head_dim], ov.Type.f32, name=name)
        params.append(new)
        info = VariableInfo()
        info.data_shape = ov.PartialShape([batch, n_kv_heads, -1, head_dim])
        info.data_type = ov.Type.f32
        info.variable_id = f"past_{name}"
        var = Variable(info)
        variables.append(var)
        empty = ops.broadcast(ops.constant(np.float32(0)), const([batch, n_kv_heads, 0,
                                                                  head_dim]))
        past = ops.gather(ops.read_value(empty, var), beam, const(0))
        cat = ops.concat([past, bhsd(new)], 2)
        sinks.append(ops.assign(cat, var))
        if n_kv_heads != n_heads:  # query head h reads kv head h // (H / Hkv)
            s = ops.gather(ops.shape_of(cat), const([2, 3]), const(0))
            cat = ops.broadcast(ops.unsqueeze(cat, const([2])),
                                ops.concat([const([batch, n_kv_heads, n_heads // n_kv_heads]),
                                            s], 0), broadcast_spec="bidirectional")
            cat = ops.reshape(cat, ops.concat([const([batch, n_heads]), s], 0), False)
        kv.append(cat)
    params.append(beam)
    args = [bhsd(q), *kv]
    if masked:
        m = ops.parameter([-1, -1], ov.Type.f32, name="mask")
        params.append(m)
        args.append(m)
    elif scale is not None:
        # (the op's spec puts a scalar zero in the 4th input; the fused node refuses it:
        # "attention_mask do not match q and k", or an empty output after a past)
        raise ValueError("a scale needs a mask here")
    if scale is not None:
        args.append(ops.constant(np.float32(scale)))
    out = ops.scaled_dot_product_attention(*args, causal=causal)
    return ov.Model([bhsd(out).output(0)], sinks, params, variables, "sdpa_stateful")


def as_bhsd(x: np.ndarray) -> np.ndarray:
    """[B, S, H, D] values -> a C-contiguous float32 [B, H, S, D] array: a state's."""
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3), dtype=np.float32)


class OpenvinoStatefulBackend(OpenvinoBackend):
    name = "openvino-stateful"
    PRECISION = "f32"

    def config(self, n_threads: int) -> dict:
        return {**super().config(n_threads), "KV_CACHE_PRECISION": "f32"}

    def version(self) -> str:
        return (f"openvino {openvino_version()} (CPU, stateful, INFERENCE_PRECISION_HINT f32, "
                f"KV_CACHE_PRECISION f32, compiled model reports {self.precision_ran()})")

    def supports(self, case) -> str | None:
        if case.dtype == "i8":
            return "no int8 store: its KV cache quantises itself (KV_CACHE_PRECISION)"
        if case.out_dtype != "f32":
            return f"{self.name} runs f32 queries (its inference and KV cache precision)"
        if case.q_len > case.keys_in_reach:
            return "the fused node takes q_len new keys after its past: fewer keys than queries"
        return None

    def run(self, data, out) -> None:
        c = data.case
        why = self.supports(c)
        if why:
            raise Unsupported(why)
        seen = c.keys_in_reach
        past = seen - c.q_len
        scale = c.scale if c.scale > 0 else None
        # a mask of ours: the case's, an edge other than the node's own, or a scale (which
        # the node takes only after a mask)
        own_edge = c.causal and past == c.start_pos and data.mask is None and scale is None
        mask = None
        if data.mask is not None or scale is not None or (c.causal and not own_edge):
            mask = (data.mask[:, :seen] if data.mask is not None
                    else np.zeros((c.q_len, seen), np.float32))
            if c.causal:
                mask = attention_mask(c.q_len, seen, True, c.start_pos, mask)[1]
        k, v = (x.numpy()[:, :seen] for x in (data.k, data.v))
        key = (c.batch, c.n_heads, c.n_kv_heads, c.head_dim, own_edge, mask is not None, scale,
               c.n_threads)
        request = self.request(key, lambda: self._stateful(c.batch, c.n_heads, c.n_kv_heads,
                                                           c.head_dim, own_edge, mask, scale),
                               c.n_threads)
        self.set_past(request, k[:, :past], v[:, :past])
        feed = {"q": np.ascontiguousarray(data.q.numpy(), dtype=np.float32),
                "k": np.ascontiguousarray(k[:, past:], dtype=np.float32),
                "v": np.ascontiguousarray(v[:, past:], dtype=np.float32),
                "beam_idx": np.arange(c.batch, dtype=np.int32)}
        if mask is not None:
            feed["mask"] = np.ascontiguousarray(mask, dtype=np.float32)
        request.infer(feed)
        out.view[...] = request.get_output_tensor(0).data

    def _stateful(self, batch, n_heads, n_kv_heads, head_dim, causal, mask, scale):
        ov, ops = ov_modules()
        return stateful_model(ov, ops, batch, n_heads, n_kv_heads, head_dim, causal=causal,
                              masked=mask is not None, scale=scale)

    def request(self, key, build, n_threads: int):
        """The InferRequest of the model `key` names, for the calling thread; Unsupported
        when the CPU plugin compiled it without its fused SDPA node."""
        with self._lock:
            fresh = key not in self._compiled
        request = super().request(key, build, n_threads)
        if fresh:
            layers = {n.get_rt_info()["layerType"].astype(str)
                      for n in request.get_compiled_model().get_runtime_model().get_ops()}
            if FUSED not in layers:
                raise Unsupported("the CPU plugin did not fuse the stateful pattern into its "
                                  "SDPA node")
        return request

    @staticmethod
    def set_past(request, k: np.ndarray, v: np.ndarray) -> None:
        """The states to these [B, P, Hkv, D] keys and values (copied in)."""
        ov = ov_modules()[0]
        for state in request.query_state():
            x = k if state.name == "past_k" else v
            if x.shape[1]:
                state.state = ov.Tensor(as_bhsd(x))
            else:
                state.reset()

    def timer(self, shape, sets, threads: int) -> Party:
        """One decode or prefill step over a cache of kv_len - q_len keys, q_len new. Before
        each timed step, untimed, the states are set (or reset) and up to WARM_STEPS steps
        of q_len keys bring the cache to kv_len - q_len: the first step after setting a
        state converts it (5-10x slower here), the second is still ~1.5x slower than the
        steady steps after it. The timed step is infer() alone. One compiled model, a
        request per set."""
        if shape.dtype != "f32":
            raise Unsupported(f"{self.name} times f32 shapes")
        if shape.n_heads % shape.n_kv_heads:
            raise Unsupported("n_heads not a multiple of n_kv_heads")
        if shape.causal and shape.start_pos != shape.kv_len - shape.q_len:
            raise Unsupported("a causal edge other than the fused node's")
        key = (shape.batch, shape.n_heads, shape.n_kv_heads, shape.head_dim, shape.causal,
               False, None, threads)
        first = self.request(key, lambda: self._stateful(
            shape.batch, shape.n_heads, shape.n_kv_heads, shape.head_dim, shape.causal, None,
            None), threads)
        compiled = first.get_compiled_model()
        steps = [StatefulStep(first if i == 0 else compiled.create_infer_request(), s,
                              shape.q_len) for i, s in enumerate(sets)]
        return StatefulParty(self.name, steps)


WARM_STEPS = 2


class StatefulStep:
    """One input set's request, the past its states are set to, and the feeds of its warm
    steps and its timed step."""

    def __init__(self, request, s, q_len: int):
        self.request = request
        kv = s.k32.shape[1]
        warm = min(WARM_STEPS, (kv - q_len) // q_len)
        cut = [kv - (warm + 1 - i) * q_len for i in range(warm + 1)] + [kv]
        self.k, self.v = s.k32[:, :cut[0]], s.v32[:, :cut[0]]
        beam = np.arange(s.q32.shape[0], dtype=np.int32)
        self.feeds = [{"q": np.ascontiguousarray(s.q32), "k": np.ascontiguousarray(s.k32[:, a:b]),
                       "v": np.ascontiguousarray(s.v32[:, a:b]), "beam_idx": beam}
                      for a, b in zip(cut, cut[1:], strict=False)]

    def seconds(self) -> float:
        OpenvinoStatefulBackend.set_past(self.request, self.k, self.v)
        for feed in self.feeds[:-1]:
            self.request.infer(feed)
        t0 = time.perf_counter()
        self.request.infer(self.feeds[-1])
        return time.perf_counter() - t0


class StatefulParty(Party):
    """The timed steps of a set after another, each after its untimed preparation."""

    def __init__(self, name: str, steps: list[StatefulStep]):
        self.name = name
        self._steps = steps
        self._next = 0

    def run(self, n: int) -> list[float]:
        out = []
        for _ in range(n):
            step = self._steps[self._next]
            self._next = (self._next + 1) % len(self._steps)
            out.append(step.seconds())
        return out
