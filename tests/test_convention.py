"""A runtime's convention (where it rounds by design) judged as such: a case failed on
tolerance alone passes under the convention the backend declares, with the float64
oracle's verdict kept; a bug still fails under it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from toy_backend import ToyBackend

from sdpa_probe.cases import Case
from sdpa_probe.check.calls import run_one
from sdpa_probe.inputs import materialise
from sdpa_probe.judge.convention import Convention, conventional_reference
from sdpa_probe.oracle import prepare_case
from sdpa_probe.reference import sdpa_reference

Q_F16 = Convention("Q rounded to F16 before Q·K", q="f16")
# an F32 query over an F16 cache, output F32: held to F32's tolerance
CASE = Case("dtype", n_heads=4, n_kv_heads=2, q_len=3, kv_len=300, dtype="f16",
            q_dtype="f32", magnitude=4.0, causal=True, start_pos=297)


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float64)


class RoundsQ(ToyBackend):
    """Q rounded to F16 before the dot product, as a runtime that converts Q to its
    cache's type does; the rest in float64."""
    name = "rounds-q"
    declares = Q_F16

    def supports(self, case) -> str | None:
        return None

    def convention(self, case):
        return self.declares

    def run(self, data, out) -> None:
        super().run(type(data)(**{**data.__dict__, "q": torch.from_numpy(_f16(data.q.numpy()))}),
                    out)


class RoundsQAndIgnoresMask(RoundsQ):
    name = "rounds-q-nomask"
    ignore_mask = True


class RoundsQUndeclared(RoundsQ):
    name = "rounds-q-undeclared"
    declares = None


def test_a_rounding_by_design_passes_under_its_convention_and_says_so():
    prep = prepare_case(CASE)
    rec = run_one(RoundsQ(), CASE, prep)
    assert rec["status"] == "pass" and rec["convention"] == Q_F16.name, rec
    # the float64 oracle's verdict is kept, with its figures
    assert "passes under its convention" in rec["reason"]
    assert "error above tolerance" in rec["reason"] and rec["max_abs_err"] > rec["atol"]


def test_the_same_rounding_undeclared_fails():
    rec = run_one(RoundsQUndeclared(), CASE, prepare_case(CASE))
    assert rec["status"] == "fail" and rec["convention"] is None
    assert rec["reason"].startswith("error above tolerance")


def test_a_bug_is_not_hidden_by_a_convention():
    case = Case("mask", n_heads=4, n_kv_heads=2, q_len=4, kv_len=64, dtype="f16",
                q_dtype="f32", mask="rows:middle")
    rec = run_one(RoundsQAndIgnoresMask(), case, prepare_case(case))
    assert rec["status"] == "fail", rec
    assert rec["convention"] is None or "even under its convention" in rec["reason"]


@pytest.mark.parametrize("case", [CASE, Case("masked-rows", q_len=8, kv_len=64,
                                              mask="rows:middle", scale=0.3)])
def test_a_convention_that_rounds_nothing_is_the_oracle(case):
    data = materialise(case)
    ref = sdpa_reference(data.q, data.k, data.v, mask=data.mask_t, is_causal=case.causal,
                         start_pos=case.start_pos, scale=case.scale)
    for conv in (Convention("none"), Convention("online, float64", acc=None)):
        np.testing.assert_allclose(conventional_reference(data, conv), ref, atol=1e-12)
    # the online loop in float64 (acc rounding off: round to float64 is identity)
    online = Convention("online", acc="f16")
    got = conventional_reference(data, online)
    assert torch.isfinite(got).all()
    assert float((got - ref).abs().max()) < 5e-3  # (F16 accumulator error, not a bug's)


def test_an_f16_accumulator_is_emulated_key_by_key():
    """A sum in an F16 accumulator, rounded at every key, differs from float64 by far
    more than the reference of that convention does."""
    case = Case("decode", n_heads=2, n_kv_heads=1, kv_len=2048, dtype="f16", q_dtype="f32")
    data = materialise(case)
    exact = sdpa_reference(data.q, data.k, data.v).numpy()
    conv = Convention("F16 accumulator", acc="f16")
    emulated = conventional_reference(data, conv).numpy()
    s = np.einsum("bihd,bjhd->bhij", data.q.numpy(),
                  np.repeat(data.k.numpy(), 2, axis=2)) / np.sqrt(case.head_dim)
    p = np.exp(s - s.max(-1, keepdims=True))
    acc = np.zeros((1, 2, 1, case.head_dim))
    v = np.repeat(data.v.numpy(), 2, axis=2)
    for j in range(case.kv_len):  # (max first: no rescale, the order of keys kept)
        acc = _f16(acc + p[..., j:j + 1] * v[:, j][:, :, None, :])
    mine = (acc / p.sum(-1, keepdims=True)).transpose(0, 2, 1, 3)
    assert np.abs(mine - emulated).max() < np.abs(mine - exact).max() / 4
