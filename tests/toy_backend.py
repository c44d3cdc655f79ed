"""A backend of a test's own, as a new runtime's would be: one module with one class
that follows sdpa_probe.backends.base.Backend. Registering it is one line
(REGISTERED["toy"] = ToyBackend). Its SDPA is numpy in float64, written apart from
the oracle; `ignore_mask` makes the bug a new backend most often has."""

from __future__ import annotations

import numpy as np

from sdpa_probe.backends import Unsupported


class ToyBackend:
    name = "toy"
    INVALID: tuple[str, ...] = ()
    ignore_mask = False

    @classmethod
    def why_unavailable(cls) -> str | None:
        return None

    def version(self) -> str:
        return "toy 1.0"

    def supports(self, case) -> str | None:
        if case.dtype != "f32" or case.q_dtype:
            return "the toy backend computes F32 only"
        return None

    def run(self, data, out) -> None:
        c = data.case
        why = self.supports(c)
        if why:
            raise Unsupported(why)
        q, k, v = (t.numpy() for t in (data.q, data.k, data.v))
        group = c.n_heads // c.n_kv_heads
        k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
        scale = c.scale if c.scale > 0 else 1.0 / np.sqrt(c.head_dim)
        s = np.einsum("bihd,bjhd->bhij", q, k) * scale
        if data.mask is not None and not self.ignore_mask:
            s = s + data.mask.astype(np.float64)
        if c.causal:
            i, j = np.arange(c.q_len)[:, None], np.arange(c.kv_len)[None, :]
            s = np.where(j > c.start_pos + i, -np.inf, s)
        top = s.max(axis=-1, keepdims=True)
        seen = np.isfinite(top)
        p = np.exp(s - np.where(seen, top, 0.0))
        o = np.einsum("bhij,bjhd->bihd", p, v) / np.where(seen, p.sum(-1, keepdims=True),
                                                           1.0).transpose(0, 2, 1, 3)
        out.view[...] = np.where(seen.transpose(0, 2, 1, 3), o, 0.0).astype(out.view.dtype)


class ToyBackendIgnoringMasks(ToyBackend):
    name = "toy-nomask"
    ignore_mask = True
