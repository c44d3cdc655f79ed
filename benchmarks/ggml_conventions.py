"""Which of the ggml backends' failures are ggml's conventions: each failing case's
output judged, with the case's own tolerance, against references that round as ggml
does -- Q to the cache's type before K.Q (its vector paths), the KQ mask to F16
(flash attention), P to the cache's type before V.P (flash attention off) -- and, for
flash attention over an F16 / BF16 cache, against a float32 emulation of its vector
loop, which keeps the V accumulator in F16 when V is F16.

    probe check -b ggml,ggml-nofa --json check.json
    python benchmarks/ggml_conventions.py check.json

One line per failing case: its error over the tolerance against the oracle, then
against each rounding reference; a case that passes against one fails only because
of that convention. Needs ggml built (probe build --ggml)."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import torch

from sdpa_probe.backends import make
from sdpa_probe.cases.suites import all_cases
from sdpa_probe.cases.tolerance import judged_tolerance
from sdpa_probe.inputs import out_buffer
from sdpa_probe.oracle import prepare_case
from sdpa_probe.reference import bias_matrix, gqa_kv_head

ROUNDED = {"f16": torch.float16, "bf16": torch.bfloat16}
TILE_Q = 64  # ggml's flash attention takes its tiled path (F32 Q, F32 sums) from here


def rounded(x: torch.Tensor, dtype: str | None) -> torch.Tensor:
    return x if dtype is None else x.to(ROUNDED[dtype]).to(torch.float64)


def reference(data, q_to=None, mask_f16=False, p_to=None) -> np.ndarray:
    """The float64 oracle with Q, the mask and P rounded as asked."""
    c = data.case
    bias = bias_matrix(c.q_len, c.kv_len, mask=data.mask_t, is_causal=c.causal,
                       start_pos=c.start_pos)
    if mask_f16:
        bias = bias.to(torch.float16).to(torch.float64)
    scale = c.scale if c.scale > 0 else 1 / math.sqrt(c.head_dim)
    g = gqa_kv_head(c.n_heads, c.n_kv_heads)
    k, v = data.k[:, :, g, :], data.v[:, :, g, :]
    s = torch.einsum("bihd,bjhd->bhij", rounded(data.q, q_to), k) * scale + bias
    seen = torch.isfinite(bias)[None, None]
    e = torch.where(seen, torch.exp(s - s.amax(-1, keepdim=True).nan_to_num(neginf=0)), 0)
    p = rounded(e / e.sum(-1, keepdim=True).clamp_min(1e-300), p_to)
    return torch.einsum("bhij,bjhd->bihd", p, v).numpy()


def vector_loop(data) -> np.ndarray:
    """ggml_compute_forward_flash_attn_ext_f16_one_chunk in float32, one key at a
    time: Q rounded to the cache's type, the F16 mask, VKQ kept in F16 when V is F16."""
    c = data.case
    q = rounded(data.q, c.dtype).float().numpy()
    k, v = data.k.float().numpy(), data.v.float().numpy()
    bias = bias_matrix(c.q_len, c.kv_len, mask=data.mask_t, is_causal=c.causal,
                       start_pos=c.start_pos).to(torch.float16).float().numpy()
    scale = np.float32(c.scale if c.scale > 0 else 1 / math.sqrt(c.head_dim))
    acc_t = np.float16 if c.dtype == "f16" else np.float32
    group = c.n_heads // c.n_kv_heads
    out = np.zeros((c.batch, c.q_len, c.n_heads, c.head_dim))
    for b, i, h in np.ndindex(c.batch, c.q_len, c.n_heads):
        m, total, acc = -np.inf, np.float32(0), np.zeros(c.head_dim, acc_t)
        for j in np.flatnonzero(bias[i] != -np.inf):
            s = np.float32(np.dot(q[b, i, h], k[b, j, h // group])) * scale + bias[i, j]
            ms = vs = np.float32(1)
            if s > m:
                ms, m = np.float32(np.exp(np.float32(m - s))), s
                acc = (acc.astype(np.float32) * ms).astype(acc_t)
            else:
                vs = np.float32(np.exp(np.float32(s - m)))
            acc = (acc.astype(np.float32) + v[b, j, h // group] * vs).astype(acc_t)
            total = total * ms + vs
        out[b, i, h] = acc.astype(np.float32) * (1 / total if total else 0)
    return out


def over_tolerance(vals: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> float:
    """The largest error as a multiple of its element's tolerance."""
    ok = np.isfinite(vals) & np.isfinite(ref)
    err = np.abs(vals - ref)[ok]
    return float((err / (atol + rtol * np.abs(ref[ok]))).max()) if err.size else 0.0


def explain(backend: str, case) -> str:
    prep = prepare_case(case)
    buf = out_buffer(case)
    make(backend).run(prep.data, buf)
    vals = buf.values()
    atol, rtol = judged_tolerance(case, prep.torch_err)
    flash = backend == "ggml"
    cache = case.dtype if case.dtype in ROUNDED else None
    tiled = flash and case.q_len >= TILE_Q and case.dtype in ("f32", "f16")
    q_to = None if tiled else cache
    parts = [f"oracle {over_tolerance(vals, prep.ref, atol, rtol):.1f}x",
             f"Q->{q_to}: {over_tolerance(vals, reference(prep.data, q_to), atol, rtol):.1f}x"]
    if flash:
        ref = reference(prep.data, q_to, mask_f16=True)
        parts.append(f"+ F16 mask: {over_tolerance(vals, ref, atol, rtol):.1f}x")
        if cache and not tiled:
            loop = vector_loop(prep.data)
            parts.append(f"its vector loop errs "
                         f"{over_tolerance(loop, prep.ref, atol, rtol):.1f}x, ggml vs the loop "
                         f"{np.nanmax(np.abs(vals - loop)):.2g}")
    else:
        ref = reference(prep.data, q_to, p_to=cache)
        parts.append(f"+ P->{cache}: {over_tolerance(vals, ref, atol, rtol):.1f}x")
    return f"{backend} {case.id}: " + "; ".join(parts)


def main(path: str) -> None:
    cases = all_cases()
    for r in json.load(open(path))["records"]:
        if r["status"] == "fail" and "above tolerance" in r["reason"]:
            print(explain(r["backend"], cases[r["case"]]), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
