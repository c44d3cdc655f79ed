"""ONNX Runtime's CPU attention ops as backends: each call is a one-node ONNX graph
(onnx.helper) run by an InferenceSession on the CPU execution provider.

  onnxruntime      the standard ONNX `Attention` op, opset 23 (this module)
  onnxruntime-gqa  com.microsoft `GroupQueryAttention`, what LLM exports use
  onnxruntime-mha  com.microsoft `MultiHeadAttention`   (both onnxruntime_contrib.py)

How a case becomes an `Attention` call: Q, K and V as [B, S, H * D] (the 3D form,
`q_num_heads` / `kv_num_heads` giving the heads: GQA needs no copy), the mask as a
dense additive `attn_mask` [Lq, keys passed] in Q's dtype, `scale` when the case sets
one. Causal: ORT 1.32's `is_causal` without `past_key` is top-left aligned (query i
sees keys j <= i, whatever kv_len is) and with `past_key` it is offset by the past's
length (j <= past + i): measured, and the opset 23 text's rule (which it calls
bottom-right alignment). So a causal case passes the cache's first start_pos keys as
`past_key` / `past_value` (ORT's [B, Hkv, S, D] cache form: a transposed copy; none
at start_pos 0) and the next Lq as K and V, the new tokens' keys, as a caller holding
a past and new keys has them: query i then sees j <= start_pos + i, the oracle's
edge, with no explicit mask. The slots past start_pos + Lq, which no row sees, are
left out: given them as more new keys, ORT breaks its own rule with one query (it
sees every key: measured) and a NaN in one turns the rows NaN (docs/runtimes/onnxruntime.md).

Sessions: one per op, input shapes, dtypes, attributes and thread count, built once
and kept on the backend object (a check worker reuses it across cases); options as
a user sets them for one op on a shared machine: `intra_op_num_threads` the case's
n_threads, `inter_op_num_threads` 1, `session.intra_op.allow_spinning` "0" (an idle
session does not spin on a core), graph optimisation at ORT's default,
ORT_ENABLE_ALL. Inputs are bound through an IOBinding as OrtValues over the case's own
arrays (no copy) wherever ORT's dense form is the case's memory: Q, K and V of a
bshd / offset / fenced case with batch 1 (K and V of batch > 1 lie in a cache with
slack between batches, copied dense). The output is ORT's, copied into out.view.
`probe bench` times the op as models run it: Attention in its 4D form ([B, H, S, D]
copies of the inputs, made before the timed region; OnnxRuntimeBackend.timed_plan).

Unsupported: layouts ORT cannot see without a copy that would be the thing tested
(strided, padded, transposed, far-apart batches: ORT takes dense tensors, no strides);
int8 (no int8 Q/K/V in the op's types); BF16 (no CPU kernel: building the session
fails, see BF16_REFUSAL; an F32 query over a BF16 cache gets K and V cast up); kv_len
0 (ORT: "KV sequence length must be greater than 0"); F16 masks with values beyond
the F16 range. A fully masked row gives zeros, as the opset 23 text says and the
oracle does."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
import threading

import numpy as np

from ..party import Party, PyParty
from .base import Unsupported

INSTALL = "pip install onnxruntime==1.32.0 onnx==1.23.2"
# layouts whose Q, K and V are dense in ORT's [B, S, H * D] order (but for the slack
# between K's and V's batches); the rest reach ORT only as a copy
DENSE_LAYOUTS = ("bshd", "offset", "fenced", "fenced-start")
FLOAT_NP = {"f32": np.float32, "f16": np.float16}
SESSIONS_KEPT = 64  # per backend object: every shape of a check suite, a bounded memory
# what ORT 1.32 says building a BF16 session (every op has no BF16 CPU kernel)
BF16_REFUSAL = "onnxruntime has no BF16 CPU kernel for {op} (building the session: {said})"


@dataclasses.dataclass(frozen=True)
class Geometry:
    """One call's sizes and flags, from a case or a bench shape (an invalid call's
    are broken on purpose: zero heads, a NaN scale)."""

    batch: int
    q_len: int
    kv_len: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    causal: bool
    start_pos: int
    scale: float  # <= 0: the op's default, 1/sqrt(head_dim)

    @classmethod
    def of(cls, c) -> Geometry:
        return cls(c.batch, c.q_len, c.kv_len, c.n_heads, c.n_kv_heads, c.head_dim,
                   c.causal, c.start_pos, getattr(c, "scale", 0.0))

    @property
    def scale_attr(self) -> dict:
        """The op's `scale` attribute, when the call sets one (NaN and inf do)."""
        return {} if self.scale <= 0 else {"scale": float(self.scale)}


@dataclasses.dataclass
class Call:
    """One op call: the node's inputs in order (None: an optional input left out),
    its outputs (the first is the attention output), and the outputs bound to an
    input's own buffer (a KV cache shared by past and present)."""

    op: str
    domain: str
    attrs: dict
    inputs: list[tuple[str, np.ndarray | None]]
    outputs: list[str]
    shared: dict[str, str] = dataclasses.field(default_factory=dict)

    def key(self, threads: int) -> tuple:
        shapes = tuple((n, None if a is None else (a.shape, a.dtype.str))
                       for n, a in self.inputs)
        return (self.op, self.domain, repr(sorted(self.attrs.items())), shapes,
                tuple(self.outputs), threads)


def onnxruntime_version() -> str | None:
    if importlib.util.find_spec("onnxruntime") is None:
        return None
    import onnxruntime  # deferred: optional, and slow to import

    return onnxruntime.__version__


def rows(x: np.ndarray) -> np.ndarray:
    """[B, S, H, D] as ORT's [B, S, H * D]: the array itself when it is dense."""
    x = np.ascontiguousarray(x)
    return x.reshape(x.shape[0], x.shape[1], x.shape[2] * x.shape[3])


def as_float32(x: np.ndarray) -> np.ndarray:
    """F16 values, or BF16 bit patterns (uint16), as float32."""
    if x.dtype == np.uint16:
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float32)


def heads_first(x: np.ndarray) -> np.ndarray:
    """[B, S, H, D] as a dense [B, H, S, D] (ORT's KV cache form): a copy."""
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3))


def build_session(call: Call, threads: int):
    """An InferenceSession on the CPU provider for the one-node graph of `call`."""
    import onnxruntime as ort  # deferred: optional (why_unavailable)
    from onnx import helper  # deferred: optional too

    names = [n if a is not None else "" for n, a in call.inputs]
    while names and not names[-1]:
        names.pop()
    node = helper.make_node(call.op, names, call.outputs, domain=call.domain, **call.attrs)
    elem = helper.np_dtype_to_tensor_dtype(call.inputs[0][1].dtype)
    graph = helper.make_graph(
        [node], call.op,
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in call.inputs if a is not None],
        [helper.make_tensor_value_info(o, elem, None) for o in call.outputs])
    opsets = [helper.make_opsetid("", 23)]
    if call.domain:
        opsets.append(helper.make_opsetid(call.domain, 1))
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL  # (the default)
    so.log_severity_level = 4  # a refused call is an exception, not also a log line
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


class OrtRefusal(RuntimeError):
    """ONNX Runtime refused a call: the op's name and ORT's own words."""


def ort_message(exc: BaseException) -> str:
    """ORT's own words from one of its exceptions: without its status prefix, the
    source location and the failed condition."""
    text = " ".join(str(exc).split())
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    text = text.split("Status Message: ", 1)[-1]
    return text.split(" was false. ", 1)[-1][:200]


def bind(session, call: Call):
    """An IOBinding of `call`'s inputs as OrtValues over their arrays (no copy), the
    shared outputs onto their inputs' buffers, other outputs into ORT's memory.
    Returns (binding, the OrtValues it holds)."""
    import onnxruntime as ort  # deferred: optional (why_unavailable)

    b = session.io_binding()
    held = {n: ort.OrtValue.ortvalue_from_numpy(a) for n, a in call.inputs if a is not None}
    for n, v in held.items():
        b.bind_ortvalue_input(n, v)
    for o in call.outputs:
        if o in call.shared:
            b.bind_ortvalue_output(o, held[call.shared[o]])
        else:
            b.bind_output(o, "cpu")
    return b, held


class OnnxRuntimeBackend:
    """The standard ONNX Attention op (opset 23)."""

    name = "onnxruntime"
    OP = "Attention opset 23"
    # the invalid calls the op's attributes and shapes can make (cases.INVALID_CALLS)
    INVALID = ("heads-not-multiple", "zero-kv-heads", "zero-heads", "zero-head-dim",
               "nan-scale", "inf-scale")

    def __init__(self):
        self._sessions: dict[tuple, object] = {}
        self._lock = threading.Lock()

    @classmethod
    def why_unavailable(cls) -> str | None:
        for module in ("onnxruntime", "onnx"):
            if importlib.util.find_spec(module) is None:
                return f"onnxruntime is not installed: {INSTALL}"
        return None

    def version(self) -> str:
        return f"onnxruntime {onnxruntime_version() or 'not installed'}, {self.OP}"

    def supports(self, case) -> str | None:
        if case.layout not in DENSE_LAYOUTS:
            return (f"ORT takes dense tensors only (no strides): the {case.layout} layout's "
                    "views would reach it as a copy")
        if case.dtype == "i8":
            return self.INT8_REASON
        if case.dtype == "bf16" and case.out_dtype == "bf16":
            return self.BF16_REASON
        return self.limits(Geometry.of(case))

    INT8_REASON = "Attention (opset 23) takes float Q, K and V only: no int8"
    BF16_REASON = BF16_REFUSAL.format(
        op="Attention", said="Could not find an implementation for Expand(13), a node of "
        "the op's function body, which ORT falls back to")

    def limits(self, g: Geometry) -> str | None:
        """What the op refuses among valid calls, or None."""
        if g.kv_len == 0:
            return "Attention refuses kv_len 0 (ORT: KV sequence length must be greater than 0)"
        return None

    def plan(self, g: Geometry, q, k, v, mask, bnsh: bool = False) -> Call:
        """The op call for [B, S, H, D] arrays q, k, v and a dense [Lq, Lkv] mask: Q, K
        and V as [B, S, H * D] (the arrays themselves when dense), or with `bnsh` as
        [B, H, S, D] copies (the form an exported model's op gets)."""
        form = heads_first if bnsh else rows
        attrs = dict(g.scale_attr)
        if not bnsh:  # (the 4D form's shapes say the heads)
            attrs.update(q_num_heads=g.n_heads, kv_num_heads=g.n_kv_heads)
        # (causal at start_pos >= kv_len: every row sees every key, a plain call)
        causal = g.causal and g.start_pos < g.kv_len
        past = g.start_pos if causal else 0
        end = min(g.kv_len, g.start_pos + g.q_len) if causal else g.kv_len
        if causal:
            attrs["is_causal"] = 1
        if mask is not None:
            mask = np.ascontiguousarray(mask[:, :end])
        inputs = [("Q", form(q)), ("K", form(k[:, past:end])), ("V", form(v[:, past:end])),
                  ("attn_mask", mask)]
        outputs = ["Y"]
        if past:
            inputs += [("past_key", heads_first(k[:, :past])),
                       ("past_value", heads_first(v[:, :past]))]
            outputs += ["present_key", "present_value"]  # (ORT requires them with a past)
        return Call("Attention", "", attrs, inputs, outputs)

    def timed_plan(self, g: Geometry, q, k, v) -> Call:
        """The call bench times: the 4D form, [B, H, S, D] as torch's SDPA takes it and
        as the op's own past / present are (the 3D form's K and V cost ORT a transpose
        of the whole cache in every call: docs/runtimes/onnxruntime.md)."""
        return self.plan(g, q, k, v, None, bnsh=True)

    # -- the call, for check ---------------------------------------------------------

    def session(self, call: Call, threads: int):
        key = call.key(threads)
        with self._lock:
            if key not in self._sessions:
                if len(self._sessions) >= SESSIONS_KEPT:
                    self._sessions.pop(next(iter(self._sessions)))
                self._sessions[key] = build_session(call, threads)
            return self._sessions[key]

    def execute(self, call: Call, threads: int) -> np.ndarray:
        """Run `call`; its first output, in ORT's memory. OrtRefusal if ORT refuses to
        build or run it."""
        try:
            s = self.session(call, threads)
            b, _held = bind(s, call)
            s.run_with_iobinding(b)
        except Exception as exc:
            # (ORT's own exceptions, and the RuntimeError its IOBinding run raises)
            if not (isinstance(exc, RuntimeError) or type(exc).__module__.startswith("onnx")):
                raise
            raise OrtRefusal(f"{call.op}: {ort_message(exc)}") from None
        return b.get_outputs()[0].numpy()

    def inputs(self, data) -> tuple:
        """The case's Q, K, V as stored (F16 / BF16 K and V cast up to an F32 Q, as a
        caller must) and its mask dense in Q's dtype; Unsupported for what cannot be."""
        c = data.case
        why = self.supports(c)
        if why:
            raise Unsupported(why)
        dt = FLOAT_NP[c.out_dtype]
        q, k, v = (x if x.dtype == dt else as_float32(x)
                   for x in (data.q_store, data.k_store, data.v_store))
        mask = None
        if data.mask is not None:
            finite = data.mask[np.isfinite(data.mask)]
            if finite.size and np.abs(finite).max() > np.finfo(dt).max:
                raise Unsupported(f"mask values beyond the {c.out_dtype} range")
            mask = np.ascontiguousarray(data.mask, dtype=dt)
        return q, k, v, mask

    def run(self, data, out) -> None:
        c = data.case
        q, k, v, mask = self.inputs(data)
        y = self.execute(self.plan(Geometry.of(c), q, k, v, mask), c.n_threads)
        out.view[...] = y.reshape(out.view.shape).astype(out.view.dtype)

    def run_invalid(self, data, name: str) -> None:
        """Make the invalid call through the op's attributes and shapes; an exception
        is its refusal."""
        q, k, v, mask = self.inputs(data)
        g = Geometry.of(data.case)
        if name == "heads-not-multiple":  # (3 kv heads: a copy of the first appended)
            k, v = (np.concatenate([x, x[:, :, :1]], axis=2) for x in (k, v))
            g = dataclasses.replace(g, n_kv_heads=3)
        elif name in ("zero-kv-heads", "zero-heads"):
            field = "n_kv_heads" if name == "zero-kv-heads" else "n_heads"
            g = dataclasses.replace(g, **{field: 0})
            if name == "zero-heads":
                q = q[:, :, :0]
            else:
                k, v = k[:, :, :0], v[:, :, :0]
        elif name == "zero-head-dim":
            q, k, v = (x[..., :0] for x in (q, k, v))
            g = dataclasses.replace(g, head_dim=0)
        else:  # nan-scale, inf-scale
            g = dataclasses.replace(g, scale=math.nan if name == "nan-scale" else math.inf)
        self.execute(self.plan(g, q, k, v, mask), data.case.n_threads)

    # -- the timed call, for bench ---------------------------------------------------

    def timer(self, shape, sets, threads: int) -> Party:
        """The op on each input set's own values (f32 / f16 as stored; see timed_plan
        for their form), the session built and every input and output bound (IOBinding:
        the inputs over their arrays, the outputs into arrays of ours) before the timed
        region, which is run_with_iobinding alone. One warm-up call per set, untimed,
        learns the outputs' shapes."""
        if shape.dtype not in FLOAT_NP:
            raise Unsupported(self.INT8_REASON if shape.dtype == "i8" else self.BF16_REASON)
        g = Geometry.of(shape)
        why = self.limits(g)
        if why:
            raise Unsupported(why)
        import onnxruntime as ort  # deferred: optional (why_unavailable)

        fns = []
        for s in sets:
            call = self.timed_plan(g, s.q, s.k, s.v)
            sess = self.session(call, threads)
            b, held = bind(sess, call)
            sess.run_with_iobinding(b)
            for o, got in zip(call.outputs, b.get_outputs(), strict=True):
                if o not in call.shared:  # (ORT's memory, allocated per call: ours instead)
                    held[o] = ort.OrtValue.ortvalue_from_numpy(np.empty(got.shape(),
                                                                        s.q.dtype))
                    b.bind_ortvalue_output(o, held[o])

            def call_op(sess=sess, b=b, keep=(held, call)):  # (keep: the bound arrays)
                sess.run_with_iobinding(b)
            fns.append(call_op)
        return PyParty(self.name, fns)
