"""Tolerances: err_i <= atol + rtol * |ref_i| elementwise, per case, at least a multiple
of torch's own error where torch runs the case."""

from __future__ import annotations

import math

from .case import Case

# err_i <= atol + rtol * |ref_i| elementwise. The atol grows slowly with the
# reduction length: the rounding of an F32 sum of kv_len terms grows like
# sqrt(kv_len), by ACCUM_ATOL a step of sqrt(kv_len / 64); the F16 / BF16 output's
# own rounding, most of their base atol, does not grow (grown with it, the F16 atol
# at 70,001 keys was 1.3e-2, above the output's own size there).
# Where torch runs the case, atol is also at least TORCH_MULT times torch's own
# max abs error on the same stored inputs (see verdict.py): cases whose
# conditioning amplifies rounding (large logits, an explicit scale, low
# precision) get the slack torch itself needs, and no more.
BASE_TOL = {"f32": (2e-6, 2e-5), "i8": (2e-6, 2e-5), "f16": (4e-4, 1e-3), "bf16": (3e-3, 8e-3)}
TORCH_MULT = 3.0
# ... and 16 times it for the random suite's cases: they draw conditioning the matrix
# does not (x10 logits over head_dim 48 in a batch of 2, say), where the plain F32
# kernels of docs/examples err 4x (sequential sums) to 10x (exp2 of a product with
# log2 e) as much as torch; a slice is there for structural bugs (indexing, masking,
# strides), which err by orders of magnitude more, while the matrix's own cases keep
# 3x for low-precision accumulation. The `pairs` family (cases/pairs.py) is there for the
# same structural bugs and combines conditioning the same way (x10 logits with an F32
# query over an F16 cache at head_dim 20: our flash kernel and ExecuTorch err 6x torch).
RANDOM_TORCH_MULT = 16.0
# (and `probe fuzz`'s cases, drawn from the same space with x100 logits among them)
GENERATED_FAMILIES = ("random", "pairs", "fuzz")


def torch_mult(case: Case) -> float:
    """How many times torch's own error a case's atol is at least."""
    return RANDOM_TORCH_MULT if case.family in GENERATED_FAMILIES else TORCH_MULT


ACCUM_ATOL = 2e-6


# The output is a weighted mean of V, so the absolute tolerance scales with V; but not
# below one unit in the last place of the output dtype's subnormals, the error of a
# correctly rounded result there (F16: 2^-24, 6e-8; a kernel that flushes F16
# subnormals to zero errs by up to 6.1e-5).
SUBNORMAL_ULP = {"f32": 2.0 ** -149, "i8": 2.0 ** -149, "f16": 2.0 ** -24, "bf16": 2.0 ** -133}


def tolerance(case: Case, products: str | None = None) -> tuple[float, float]:
    # (by Q's and the output's dtype: the cache's rounding is in the oracle's inputs, and
    # a float query over an F16 cache is computed and returned in F32, as torch would
    # after casting K and V up; a kernel whose products round Q, K, P and V to a
    # narrower dtype (`products`, flash_bf16's "bf16") gets at least that dtype's)
    atol, rtol = BASE_TOL[case.out_dtype]
    if products is not None:
        atol, rtol = max(atol, BASE_TOL[products][0]), max(rtol, BASE_TOL[products][1])
    atol += ACCUM_ATOL * (math.sqrt(max(1.0, case.kv_len / 64.0)) - 1.0)
    if case.v_magnitude != 1.0:
        atol = max(atol * case.v_magnitude, SUBNORMAL_ULP[case.out_dtype])
    return atol, rtol


def judged_tolerance(case: Case, torch_err: float | None,
                     products: str | None = None) -> tuple[float, float]:
    """(atol, rtol) a verdict applies: the case's tolerance, its atol at least
    torch_mult(case) times torch's own error on the case where torch has one (with
    `products`, torch's error computing in that dtype)."""
    atol, rtol = tolerance(case, products)
    if torch_err is not None:
        atol = max(atol, torch_mult(case) * torch_err)
    return atol, rtol
