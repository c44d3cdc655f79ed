"""The SDPA paths under test: native kernels (ours and a user's), torch's
scaled_dot_product_attention in the working dtype, and ExecuTorch's custom ops.
Each backend writes a case's output into an OutBuffer or raises Unsupported."""

from __future__ import annotations

import functools
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

from . import native
from .errors import KernelError, ProbeError, SdpaInvalid, SdpaUnsupported
from .inputs import CaseData, OutBuffer, fenced_tensor
from .reference import bias_matrix

TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


class Unsupported(Exception):
    """The backend does not implement this case (not a failure)."""


class Nondeterministic(KernelError):
    """Two identical calls gave different bits: the op returned memory it never wrote."""


def _write(out: OutBuffer, t: torch.Tensor) -> None:
    """Copy a [B, Lq, H, D] torch result into the output view, in its dtype."""
    if out.view.dtype == np.uint16:
        out.view[...] = t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    else:
        out.view[...] = t.to(torch.float32).numpy().astype(out.view.dtype)


class NativeBackend:
    def __init__(self, name: str, kernel: native.Kernel | None = None):
        self.name = name
        self._kernel = kernel

    @property
    def kernel(self) -> native.Kernel:
        if self._kernel is None:
            self._kernel = native.get_kernel(self.name)
        return self._kernel

    def prepare(self, data: CaseData, out: OutBuffer):
        c = data.case
        return native.prepare(self.kernel.ffi, data.q_store, data.k_store, data.v_store, out.view,
                              mask=data.mask, is_causal=c.causal, start_pos=c.start_pos,
                              scale=c.scale, n_threads=c.n_threads)

    def run(self, data: CaseData, out: OutBuffer, call=None) -> None:
        call = call or self.prepare(data, out)
        # (the output copied as the call returns: verdict's written-after-return layer)
        out.at_return = np.empty_like(out.arena)
        status = self.kernel.forward_watched(call.args, out.arena, out.at_return)
        if status == 1:
            raise Unsupported("kernel returned SDPA_UNSUPPORTED")
        native.raise_for_status(status, self.name)


def _three_kv_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, S, Hkv, D] with one more head (a copy of the first): 3 kv heads, which do
    not divide the default cases' 8 query heads."""
    return torch.cat([x, x[:, :, :1]], dim=2)


class TorchBackend:
    """torch.nn.functional.scaled_dot_product_attention in the working dtype, with
    the causal edge and mask given as one explicit additive mask. torch has no int8
    SDPA: int8 cases go through its F32 one on the dequantised values, as a runtime
    without a fused quantized op does (and as `probe bench` times torch there)."""

    name = "torch"
    # the invalid calls (invalid_args) its own API can express; the others are C ABI calls
    INVALID = ("heads-not-multiple",)

    def run_invalid(self, data: CaseData, name: str) -> None:
        """Make the invalid call; an exception is its refusal."""
        q, k, v = (x.to(torch.float32) for x in (data.q, data.k, data.v))
        k, v = _three_kv_heads(k), _three_kv_heads(v)
        with torch.no_grad():
            torch.nn.functional.scaled_dot_product_attention(
                q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3),
                enable_gqa=True)

    def run(self, data: CaseData, out: OutBuffer) -> None:
        c = data.case
        if c.dtype not in TORCH_DTYPES and c.dtype != "i8":
            raise Unsupported(f"torch SDPA has no {c.dtype} path")
        # (a float query over an F16 cache: K and V cast up to Q's dtype, as a caller must;
        # an int8 query's output is F32)
        dt = TORCH_DTYPES.get(c.out_dtype, torch.float32)
        if data.mask is not None and dt != torch.float32:
            finite = data.mask[np.isfinite(data.mask)]
            lim = torch.finfo(dt).max
            if finite.size and np.abs(finite).max() > lim:
                raise Unsupported(f"mask values beyond the {c.dtype} range")
        q, k, v = (fenced_tensor(x.to(dt), c.layout, n).permute(0, 2, 1, 3)
                   for x, n in ((data.q, "Q"), (data.k, "K"), (data.v, "V")))
        bias = fenced_tensor(bias_matrix(c.q_len, c.kv_len, mask=data.mask_t, is_causal=c.causal,
                                         start_pos=c.start_pos).to(dt), c.layout, "the mask")
        kw = {"scale": c.scale} if c.scale > 0 else {}
        with torch.no_grad():
            o = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=bias, enable_gqa=c.n_heads != c.n_kv_heads, **kw)
        _write(out, o.permute(0, 2, 1, 3))


def executorch_library() -> Path | None:
    """The installed ExecuTorch custom-ops library, found through the distribution's
    files (the executorch package itself is never imported)."""
    try:
        dist = metadata.distribution("executorch")
    except metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.name == "libcustom_ops_aot_lib.so":
            return Path(dist.locate_file(f)).resolve()
    return None


@functools.lru_cache(maxsize=1)
def _load_executorch() -> None:
    lib = executorch_library()
    if lib is None:
        raise ProbeError("executorch is not installed: pip install --no-deps executorch==1.5.1")
    torch.ops.load_library(str(lib))


class ExecutorchBackend:
    """llama.custom_sdpa (float) and llama.custom_quantized_sdpa (int8 per token).
    Layout [B, S, H, D]; mask and is_causal are exclusive, so a case with both gets
    them merged into one additive mask."""

    name = "executorch"
    INVALID = ("heads-not-multiple", "negative-start-pos")

    def run_invalid(self, data: CaseData, name: str) -> None:
        """Make the invalid call through custom_sdpa; an exception is its refusal (1.5.1
        aborts the process on the first, in an assert, and answers the second)."""
        _load_executorch()
        c = data.case
        q, k, v = (x.to(torch.float32).contiguous() for x in (data.q, data.k, data.v))
        start_pos = c.kv_len - c.q_len
        if name == "heads-not-multiple":
            k, v = _three_kv_heads(k), _three_kv_heads(v)
        else:
            start_pos = -1
        with torch.no_grad():
            torch.ops.llama.custom_sdpa(q, k, v, start_pos, None, 0.0, False, None)

    def run(self, data: CaseData, out: OutBuffer) -> None:
        _load_executorch()
        c = data.case
        mask = data.mask_t
        is_causal = c.causal
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
        if start_pos < 0:
            raise Unsupported("custom_sdpa cannot express q_len > kv_len without causal")
        with torch.no_grad():
            if c.dtype == "i8" and c.out_dtype != "i8":
                # (1.5.1 given a float Q logs "validate_flash_attention_args ... Invalid
                # arguments" and returns its output unwritten, raising nothing)
                raise Unsupported("custom_quantized_sdpa takes no float Q over an int8 cache")
            if c.dtype == "i8":
                def call():
                    return self._quantized(data, mask, is_causal, scale, start_pos)
            else:
                if c.dtype not in TORCH_DTYPES:
                    raise Unsupported(c.dtype)
                dt = TORCH_DTYPES[c.out_dtype]  # (K and V cast up to a float Q's dtype)
                q, k, v = (fenced_tensor(x.to(dt).contiguous(), c.layout, n)
                           for x, n in ((data.q, "Q"), (data.k, "K"), (data.v, "V")))

                def call():
                    return torch.ops.llama.custom_sdpa(q, k, v, start_pos, mask, 0.0, is_causal,
                                                       scale)
            o = call()
            # the op allocates its output, so poison cannot show an unwritten element;
            # a second identical call that disagrees beyond rounding can (threaded ops
            # may differ in the last bits, which is not a bug)
            o2 = call()
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
        _write(out, o)

    @staticmethod
    def _quantized(data: CaseData, mask, is_causal, scale, start_pos):

        def parts(st: native.QuantTensor):
            q = torch.from_numpy(np.ascontiguousarray(st.data))
            s = torch.from_numpy(np.ascontiguousarray(st.scale))[..., None]
            z = (torch.zeros_like(s, dtype=torch.int8) if st.zero_point is None  # symmetric
                 else torch.from_numpy(np.ascontiguousarray(st.zero_point))[..., None])
            return q, z, s

        (q, qz, qs), (k, kz, ks), (v, vz, vs) = (parts(x) for x in
                                                 (data.q_store, data.k_store, data.v_store))
        return torch.ops.llama.custom_quantized_sdpa(
            q, k, v, start_pos, mask, 0.0, is_causal, scale, qz, qs, kz, ks, vz, vs, False)


def torch_error(data: CaseData, ref: np.ndarray) -> float | None:
    """torch's own max abs error on this case, the yardstick for low precision and
    ill-conditioned cases (int8: its F32 SDPA on the dequantised values, as it runs
    them; large logits over an int8 cache had no slack before)."""
    if data.case.dtype not in TORCH_DTYPES and data.case.dtype != "i8":
        return None
    from .inputs import out_buffer

    buf = out_buffer(data.case)
    try:
        TorchBackend().run(data, buf)
    except Unsupported:
        return None
    err = np.abs(buf.values() - ref)
    err = err[np.isfinite(err)]
    return float(err.max()) if err.size else None


BUILTIN = ("torch", "executorch")


def make_backend(spec: str):
    """'torch', 'executorch', a native kernel name, or 'user:PATH' (.c, .cpp or .so)."""
    if spec == "torch":
        return TorchBackend()
    if spec == "executorch":
        return ExecutorchBackend()
    if spec.startswith("user:"):
        path = spec.split(":", 1)[1]
        return NativeBackend(spec, native.load_user_kernel(Path(path)))
    return NativeBackend(spec)


def describe_failure(exc: BaseException) -> str:
    if isinstance(exc, Nondeterministic):
        return str(exc)
    if isinstance(exc, SdpaInvalid):
        return "kernel returned SDPA_INVALID for valid arguments"
    if isinstance(exc, SdpaUnsupported):
        return "kernel returned SDPA_UNSUPPORTED"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]

