"""ExecuTorch's CPU SDPA ops, llama.custom_sdpa (float) and
llama.custom_quantized_sdpa (int8 per token), from its op library: the executorch
Python package itself is never imported. Layout [B, S, H, D]; mask and is_causal are
exclusive, so a case with both gets them merged into one additive mask."""

from __future__ import annotations

import functools
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

from .. import native
from ..errors import ProbeError
from ..inputs import fenced_tensor
from ..party import Party, PyParty
from ..reference import bias_matrix
from .base import Nondeterministic, Unsupported, write_bshd
from .torch_sdpa import TORCH_DTYPES, three_kv_heads

INSTALL = "pip install --no-deps executorch==1.5.1"


def executorch_library() -> Path | None:
    """The installed ExecuTorch custom-ops library, found through the distribution's
    files."""
    try:
        dist = metadata.distribution("executorch")
    except metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.name == "libcustom_ops_aot_lib.so":
            return Path(dist.locate_file(f)).resolve()
    return None


def executorch_version() -> str | None:
    try:
        return metadata.version("executorch")
    except metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def load_executorch() -> None:
    lib = executorch_library()
    if lib is None:
        raise ProbeError(f"executorch is not installed: {INSTALL}")
    torch.ops.load_library(str(lib))


def check_repeatable(call) -> torch.Tensor:
    """call() twice: the op allocates its output, so poison cannot show an unwritten
    element; a second identical call that disagrees beyond rounding can (threaded ops
    may differ in the last bits, which is not a bug)."""
    o, o2 = call(), call()
    a, b = o.double(), o2.double()
    gap = (a - b).abs()
    gap = torch.where(torch.isnan(a) & torch.isnan(b), torch.zeros_like(gap), gap)
    gap = gap.nan_to_num(nan=float("inf"))
    bound = 1e-3 * (1.0 + float(a.abs().nan_to_num(nan=0.0, posinf=0.0).max()))
    if bool((gap > bound).any()):
        bad = gap > bound
        idx = [int(x) for x in torch.nonzero(bad)[0]]
        raise Nondeterministic(
            f"two identical calls disagree in {int(bad.sum())} of {bad.numel()} "
            f"elements, by up to {float(gap.max()):.3g}, first at b={idx[0]} q={idx[1]} "
            f"h={idx[2]} d={idx[3]} (output memory the op did not write)")
    return o


def quantized_parts(st: native.QuantTensor):
    """An int8 store as custom_quantized_sdpa takes it: values, zero points, scales."""
    q = torch.from_numpy(np.ascontiguousarray(st.data))
    s = torch.from_numpy(np.ascontiguousarray(st.scale))[..., None]
    z = (torch.zeros_like(s, dtype=torch.int8) if st.zero_point is None  # symmetric
         else torch.from_numpy(np.ascontiguousarray(st.zero_point))[..., None])
    return q, z, s


class ExecutorchBackend:
    name = "executorch"
    INVALID = ("heads-not-multiple", "negative-start-pos")

    @classmethod
    def why_unavailable(cls) -> str | None:
        if executorch_library() is None:
            return f"executorch is not installed ({INSTALL})"
        return None

    def version(self) -> str:
        return f"executorch {executorch_version() or 'not installed'}"

    def supports(self, case) -> str | None:
        if case.dtype == "i8" and case.out_dtype != "i8":
            # (1.5.1 given a float Q logs "validate_flash_attention_args ... Invalid
            # arguments" and returns its output unwritten, raising nothing)
            return "custom_quantized_sdpa takes no float Q over an int8 cache"
        if case.dtype != "i8" and case.dtype not in TORCH_DTYPES:
            return f"custom_sdpa has no {case.dtype} path"
        if not case.causal and case.q_len > case.kv_len:
            return "custom_sdpa cannot express q_len > kv_len without causal"
        return None

    def run_invalid(self, data, name: str) -> None:
        """Make the invalid call through custom_sdpa; an exception is its refusal (1.5.1
        aborts the process on the first, in an assert, and answers the second)."""
        load_executorch()
        c = data.case
        q, k, v = (x.to(torch.float32).contiguous() for x in (data.q, data.k, data.v))
        start_pos = c.kv_len - c.q_len
        if name == "heads-not-multiple":
            k, v = three_kv_heads(k), three_kv_heads(v)
        else:
            start_pos = -1
        with torch.no_grad():
            torch.ops.llama.custom_sdpa(q, k, v, start_pos, None, 0.0, False, None)

    def run(self, data, out) -> None:
        load_executorch()
        c = data.case
        mask, is_causal = data.mask_t, c.causal
        if mask is not None and is_causal:
            mask = bias_matrix(c.q_len, c.kv_len, mask=mask, is_causal=True,
                               start_pos=c.start_pos).to(torch.float32)
            is_causal = False
        if mask is not None:
            mask = fenced_tensor(mask.to(torch.float32).contiguous(), c.layout, "the mask")
        scale = c.scale if c.scale > 0 else None
        # custom_sdpa reads keys [0, start_pos + q_len): for a non-causal case that
        # must be the whole cache, so start_pos is where the queries would sit
        start_pos = c.start_pos if is_causal else c.kv_len - c.q_len
        why = self.supports(c) or (start_pos < 0 and  # (a mask merged with the causal edge)
                                   "custom_sdpa cannot express q_len > kv_len without causal")
        if why:
            raise Unsupported(why)
        with torch.no_grad():
            if c.dtype == "i8":
                def call():
                    return self._quantized(data, mask, is_causal, scale, start_pos)
            else:
                dt = TORCH_DTYPES[c.out_dtype]  # (K and V cast up to a float Q's dtype)
                q, k, v = (fenced_tensor(x.to(dt).contiguous(), c.layout, n)
                           for x, n in ((data.q, "Q"), (data.k, "K"), (data.v, "V")))

                def call():
                    return torch.ops.llama.custom_sdpa(q, k, v, start_pos, mask, 0.0, is_causal,
                                                       scale)
            o = check_repeatable(call)
        write_bshd(out, o)

    def timer(self, shape, sets, threads: int) -> Party:
        """custom_sdpa (float) / custom_quantized_sdpa (int8 per token) on [B, S, H, D];
        start_pos makes the op read keys [0, kv_len). Its own memory per input set, so
        that a cold rotation reads what it says."""
        why = timing_unsupported(shape)
        if why:
            raise Unsupported(why)
        load_executorch()
        start_pos = shape.kv_len - shape.q_len
        fns = []
        for s in sets:
            t = _timed_inputs(shape, s)
            if shape.dtype == "i8":
                def call(t=t):
                    q, k, v, qz, qs, kz, ks, vz, vs = t
                    return torch.ops.llama.custom_quantized_sdpa(
                        q, k, v, start_pos, None, 0.0, shape.causal, None, qz, qs, kz, ks, vz,
                        vs, False)
            else:
                def call(t=t):
                    return torch.ops.llama.custom_sdpa(*t, start_pos, None, 0.0, shape.causal,
                                                       None)
            fns.append(call)
        return PyParty("executorch", fns, quiet=True)

    @staticmethod
    def _quantized(data, mask, is_causal, scale, start_pos):
        (q, qz, qs), (k, kz, ks), (v, vz, vs) = (quantized_parts(x) for x in
                                                 (data.q_store, data.k_store, data.v_store))
        return torch.ops.llama.custom_quantized_sdpa(
            q, k, v, start_pos, mask, 0.0, is_causal, scale, qz, qs, kz, ks, vz, vs, False)


def timing_unsupported(shape) -> str | None:
    """Why the ops cannot take a bench shape (they abort instead of returning an
    error), or None."""
    if shape.q_len > shape.kv_len:
        return "q_len > kv_len"
    if shape.n_heads % shape.n_kv_heads:
        return "n_heads not a multiple of n_kv_heads"
    if shape.dtype not in ("f32", "f16", "bf16", "i8"):
        return f"no {shape.dtype} path"
    return None


def _timed_inputs(shape, s) -> tuple:
    """One bench input set as the op's tensors: (q, k, v) for float shapes, (q, k, v,
    qz, qs, kz, ks, vz, vs) for int8."""
    if shape.dtype == "i8":  # (a set's arrays are contiguous: its own memory, not a copy)
        (q, qz, qs), (k, kz, ks), (v, vz, vs) = (quantized_parts(x) for x in (s.q, s.k, s.v))
        return q, k, v, qz, qs, kz, ks, vz, vs
    # a copy: the sets share their float32 values, and .to(float32) of them is none
    # (else every cold F32 call would read the one same buffer)
    return tuple(torch.from_numpy(x).to(TORCH_DTYPES[shape.dtype], copy=True)
                 for x in (s.q32, s.k32, s.v32))
