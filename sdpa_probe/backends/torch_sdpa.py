"""torch.nn.functional.scaled_dot_product_attention in the working dtype, with the
causal edge and mask given as one explicit additive mask. torch has no int8 SDPA:
int8 cases go through its F32 one on the dequantised values, as a runtime without a
fused quantized op does (and as `probe bench` times torch there)."""

from __future__ import annotations

import numpy as np
import torch

from ..inputs import fenced_tensor, out_buffer
from ..party import Party, PyParty
from ..reference import bias_matrix
from .base import Unsupported, write_bshd

TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def three_kv_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, S, Hkv, D] with one more head (a copy of the first): 3 kv heads, which do
    not divide the default cases' 8 query heads."""
    return torch.cat([x, x[:, :, :1]], dim=2)


class TorchBackend:
    name = "torch"
    INVALID = ("heads-not-multiple",)
    TIMES_INT8_AS_F32 = True  # (its timer's int8 inputs are the dequantised float32 values)

    @classmethod
    def why_unavailable(cls) -> str | None:
        return None

    def version(self) -> str:
        return f"torch {torch.__version__}"

    def supports(self, case) -> str | None:
        if case.dtype not in TORCH_DTYPES and case.dtype != "i8":
            return f"torch SDPA has no {case.dtype} path"
        return None

    def run_invalid(self, data, name: str) -> None:
        """Make the invalid call; an exception is its refusal."""
        q, k, v = (x.to(torch.float32) for x in (data.q, data.k, data.v))
        k, v = three_kv_heads(k), three_kv_heads(v)
        with torch.no_grad():
            torch.nn.functional.scaled_dot_product_attention(
                q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3),
                enable_gqa=True)

    def run(self, data, out, compute: str | None = None) -> None:
        """compute: the dtype torch computes in (default the case's output dtype)."""
        c = data.case
        why = self.supports(c)
        if why:
            raise Unsupported(why)
        # (a float query over an F16 cache: K and V cast up to Q's dtype, as a caller must;
        # an int8 query's output is F32)
        dt = TORCH_DTYPES[compute] if compute else TORCH_DTYPES.get(c.out_dtype, torch.float32)
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
        write_bshd(out, o.permute(0, 2, 1, 3))

    def timer(self, shape, sets, threads: int) -> Party:
        """SDPA on contiguous [B, H, L, D] tensors in the shape's dtype (float32 on the
        dequantised values for int8), a copy per input set, as its users call it."""
        dt = TORCH_DTYPES.get(shape.dtype, torch.float32)
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
                return torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=gqa)
            fns.append(call)
        return PyParty("torch", fns)


def torch_error(data, ref: np.ndarray, compute: str | None = None) -> float | None:
    """torch's own max abs error on this case, the yardstick for low precision and
    ill-conditioned cases (int8: its F32 SDPA on the dequantised values, as it runs
    them; large logits over an int8 cache had no slack before). compute: computing in
    that dtype instead (the inputs rounded to it), the yardstick of a kernel whose
    products round so."""
    if TorchBackend().supports(data.case):
        return None
    buf = out_buffer(data.case)
    try:
        TorchBackend().run(data, buf, compute)
    except Unsupported:
        return None
    err = np.abs(buf.values() - ref)
    err = err[np.isfinite(err)]
    return float(err.max()) if err.size else None
