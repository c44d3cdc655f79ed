"""flash_bf16: prefill's Q.K^T and P.V as BF16 products on the AMX tiles, judged at BF16
precision (its error stated next to torch's own BF16 error on the same case)."""

import numpy as np
import pytest

from sdpa_probe import native
from sdpa_probe.backends import NativeBackend, registry
from sdpa_probe.cases import suite, tolerance
from sdpa_probe.check.calls import run_one
from sdpa_probe.oracle import prepare_case

# prefill tiles (F32, a mask's fully masked rows, a BF16 cache over three threads)
CASE_IDS = ["prefill-h4gqa2-q33-kv33-d64-f32-causal",
            "masked-rows-h4gqa2-q40-kv150-d64-f32-rowsblock",
            "threads-b2-h4gqa2-q33-kv100-d64-bf16-causal67-t3"]
CASES = {c.id: c for c in suite("default") if c.id in CASE_IDS}
WHY = native.flash_bf16_why()


def test_registered_with_its_precision_and_left_out_of_the_default_check():
    info = native.get_kernel("flash_bf16").info
    assert "bf16-products" in info.features and "i8" not in info.dtypes
    assert NativeBackend("flash_bf16").products == "bf16"
    assert NativeBackend("flash").products is None
    assert "flash_bf16" not in [s.name for s in registry.default_specs()]
    assert "flash" in [s.name for s in registry.default_specs()]


def test_bf16_products_get_at_least_the_bf16_tolerance():
    case = CASES[CASE_IDS[0]]
    assert tolerance(case, "bf16") > tolerance(case)
    assert tolerance(case, "bf16")[0] >= 3e-3


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_judged_against_torch_at_bf16(case_id):
    case = CASES[case_id]
    prep = prepare_case(case)
    rec = run_one(NativeBackend("flash_bf16"), case, prep)
    if WHY is not None:  # no AMX-BF16 tiles here: every call refused, saying why
        assert rec["status"] == "unsupported" and WHY in rec["reason"], rec
        return
    assert rec["status"] == "pass", rec["reason"]
    assert rec["products"] == "bf16"
    assert rec["torch_err"] is not None and prep.torch_err is not None
    if case.dtype == "bf16":  # (torch computes a BF16 case in BF16 already)
        assert rec["torch_err"] == prep.torch_err
        return
    # torch_err is torch computing in BF16, well above its F32 error on the same case
    assert rec["torch_err"] > 10 * prep.torch_err
    f32 = run_one(NativeBackend("flash"), case, prep)
    assert f32["status"] == "pass" and f32["products"] is None
    # the tiles ran: BF16 rounding, within a few times torch's BF16 error
    assert rec["max_abs_err"] > 10 * f32["max_abs_err"]
    assert rec["max_abs_err"] < 3 * rec["torch_err"]


def test_decode_runs_the_f32_path():
    """Decode (few rows a kv head) is not on the tiles: flash_bf16 answers as flash."""
    if WHY is not None:
        pytest.skip(WHY)
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 1, 8, 64)).astype(np.float32)
    k = rng.standard_normal((1, 100, 2, 64)).astype(np.float32)
    v = rng.standard_normal((1, 100, 2, 64)).astype(np.float32)
    outs = []
    for name in ("flash", "flash_bf16"):
        out = np.zeros_like(q)
        native.get_kernel(name)(q, k, v, out, n_threads=1)
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
