"""A runtime's convention: where it rounds by design (Q to F16 before Q·K, the
probabilities to F16 before P·V, an F16 accumulator for P·V), judged as such.

A backend that declares one (`convention(case)`, returning a Convention or None) and
fails a case on tolerance alone is judged a second time, with the same tolerance,
against a float64 reference that rounds where the convention says. Passing that, the
case passes *under its convention*: the record says so, and keeps the float64
oracle's figures and verdict beside it. Failing that too, it fails, with both
verdicts: a design choice is not reported as a bug, and a bug is not hidden as a
design choice. NaN, poison, guards, inputs written and caller state are never
judged under a convention (rounding explains none of them)."""

from __future__ import annotations

import dataclasses
import math

import torch

from ..reference import bias_matrix, gqa_kv_head
from .verdict import Verdict, judge

ROUNDED = {"f16": torch.float16, "bf16": torch.bfloat16}
TOLERANCE_FAILURE = "error above tolerance"  # (verdict.judge's layer-3 reason)


@dataclasses.dataclass(frozen=True)
class Convention:
    name: str               # one line, for records: "Q rounded to F16 before Q·K"
    q: str | None = None    # the dtype Q is rounded to before Q·K
    p: str | None = None    # the dtype the (unnormalised) probabilities are rounded to
    acc: str | None = None  # the dtype of an online-softmax P·V accumulator, rounded at
    #                         every key (keys in order, as a single-threaded loop adds them)
    mask: str | None = None  # the dtype the additive mask is stored in
    p_normalised: bool = False  # p rounds the normalised probabilities (P·V then is
    #                             the output, no division after it), not the unnormalised


def _round(x: torch.Tensor, dtype: str | None) -> torch.Tensor:
    return x if dtype is None else x.to(ROUNDED[dtype]).to(torch.float64)


def conventional_reference(data, conv: Convention):
    """The case's output, float64 but for the convention's roundings: [B, Lq, H, D]."""
    c = data.case
    q = _round(data.q.to(torch.float64), conv.q)
    k, v = data.k.to(torch.float64), data.v.to(torch.float64)
    B, Lq, H, D = q.shape
    scale = c.scale if c.scale > 0 else 1.0 / math.sqrt(D)
    g = gqa_kv_head(H, k.shape[2])
    kk, vv = k[:, :, g, :], v[:, :, g, :]                                  # [B, Lkv, H, D]
    s = torch.einsum("bihd,bjhd->bhij", q, kk) * scale
    mask = data.mask_t
    if mask is not None and conv.mask is not None:
        mask = mask.to(ROUNDED[conv.mask])  # (out of range: ±inf, as the stored mask is)
    s = s + bias_matrix(Lq, k.shape[1], mask=mask, is_causal=c.causal, start_pos=c.start_pos)
    if conv.acc is not None:
        return _online(s, vv, conv).permute(0, 2, 1, 3).contiguous()
    m = s.amax(dim=-1, keepdim=True)
    dead = torch.isneginf(m)
    p = torch.exp(s - torch.where(dead, torch.zeros_like(m), m))
    den = torch.where(dead, torch.ones_like(m), p.sum(dim=-1, keepdim=True))
    if conv.p_normalised:
        o = torch.einsum("bhij,bjhd->bhid", _round(p / den, conv.p), vv)
    else:
        p = _round(p, conv.p)
        o = torch.einsum("bhij,bjhd->bhid", p, vv) / torch.where(
            dead, torch.ones_like(den), p.sum(dim=-1, keepdim=True))
    return torch.where(dead, torch.zeros_like(o), o).permute(0, 2, 1, 3).contiguous()


def _online(s: torch.Tensor, vv: torch.Tensor, conv: Convention) -> torch.Tensor:
    """Keys one at a time, as an online softmax with the accumulator in conv.acc does:
    rescaled (and rounded) when the running max grows, then acc += p * v (rounded)."""
    B, H, Lq, Lkv = s.shape
    acc = torch.zeros(B, H, Lq, vv.shape[-1], dtype=torch.float64)
    m = torch.full((B, H, Lq, 1), -math.inf, dtype=torch.float64)
    total = torch.zeros(B, H, Lq, 1, dtype=torch.float64)
    for j in range(Lkv):
        sj = s[..., j:j + 1]
        seen = ~torch.isneginf(sj)                  # (a hidden key is skipped)
        new_m = torch.where(seen, torch.maximum(m, sj), m)
        grow = seen & (sj > m)
        ms = torch.where(grow & ~torch.isneginf(m), torch.exp(m - new_m),
                         torch.where(grow, torch.zeros_like(m), torch.ones_like(m)))
        ps = torch.where(seen, torch.exp(torch.where(seen, sj, new_m) - new_m),
                         torch.zeros_like(sj))
        vj = vv[:, j][:, :, None, :]                # [B, H, 1, D]
        acc = _round(acc * ms, conv.acc)
        acc = _round(acc + ps * vj, conv.acc)
        total = total * ms + ps
        m = new_m
    # (a row that saw no key is zeros; a NaN score leaves its row NaN, as in the oracle)
    return torch.where(total == 0, torch.zeros_like(acc),
                       acc / torch.where(total == 0, torch.ones_like(total), total))


def convention_of(backend, case) -> Convention | None:
    """The backend's convention for this case, if it declares one."""
    declared = getattr(backend, "convention", None)
    return declared(case) if declared is not None else None


def rejudge(case, data, out, oracle: Verdict, conv: Convention,
            torch_err: float | None) -> Verdict:
    """A verdict failed on tolerance alone, judged again under the convention; the
    float64 oracle's figures and reason are kept (verdict.convention names it)."""
    if oracle.status != "fail" or not oracle.reason.startswith(TOLERANCE_FAILURE):
        return oracle
    ref = conventional_reference(data, conv).numpy()
    again = judge(case, ref, out, torch_err)
    if again.status == "pass":
        figures = {f: getattr(oracle, f) for f in ("max_abs_err", "max_rel_err", "nmse",
                                                   "worst", "atol", "rtol", "torch_err")}
        return Verdict("pass", f"passes under its convention ({conv.name}); against the "
                       f"float64 oracle: {oracle.reason}", convention=conv.name, **figures)
    again.reason = (f"{again.reason}, even under its convention ({conv.name}); against the "
                    f"float64 oracle: {oracle.reason}")
    again.convention = conv.name
    return again
