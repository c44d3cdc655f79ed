"""ExecuTorch PR 15610's arithmetic: align_up, the guarded allocator, per-kernel scratch sizing."""

from __future__ import annotations

import numpy as np
import pytest

from sdpa_probe import native, sizing


def test_native_align_up_matches_exact_arithmetic():
    rep = sizing.check_align_up()
    assert rep.checked > 20000
    assert rep.mismatches == []
    assert rep.rejects_ok, rep.reject_failures


def test_wrong_mask_expression_is_wrong():
    # the exact result plus one for every even x (a >= 2): bit 0 survives the mask
    for a in (2, 4, 8, 32, 1024):
        for x in range(0, 3 * a + 5):
            assert sizing.align_up_wrong_mask(x, a) == sizing.align_up_exact(x, a) + (x % 2 == 0)
    assert sizing.align_up_wrong_mask(2, 32) == 33
    assert sizing.align_up_wrong_mask(0, 32) == 1
    assert all(sizing.align_up_wrong_mask(x, 1) == 0 for x in range(100))  # a = 1: -(a - 1) == 0
    rep = sizing.check_align_up()
    assert all(s["wrong"] > 0 for s in rep.wrong_mask)
    assert all(s["smaller_than_x"] == 0 for s in rep.wrong_mask if s["align"] >= 2)
    _, lib, _ = native.native_lib()
    assert lib.sdpa_probe_align_up(2, 32) == 32


def test_guard_detects_overrun_underrun_and_high_water():
    results = sizing.guard_selftest()
    assert [w for w, _, ok in results if not ok] == []
    by = {w: r for w, r, _ in results}
    assert by["1 byte past the end"].overrun == 1 and not by["in bounds"].damaged
    assert by["1 byte before the start"].underrun == 1
    assert by["half written"].high_water == 128 and by["half written"].waste == 0.5
    assert by["untouched"].high_water == 0 and by["untouched"].touched == 0


def test_guard_refuses_out_of_range_test_writes_and_needs_guard_on():
    _, lib, _ = native.native_lib()
    assert lib.sdpa_probe_alloc_guard_test(64, 0, 10) == 2  # guard off
    with sizing.guarded() as recs:
        assert lib.sdpa_probe_alloc_guard_test(64, 0, 64 + 257) == 2
        assert lib.sdpa_probe_alloc_guard_test(64, -49, 0) == 2
    assert recs == []


def test_guard_does_not_change_kernel_output():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 20, 4, 32)).astype(np.float32)
    k = rng.standard_normal((1, 50, 2, 32)).astype(np.float16)
    v = rng.standard_normal((1, 50, 2, 32)).astype(np.float16)
    kern = native.get_kernel("flash")
    plain, guarded = np.zeros_like(q), np.zeros_like(q)
    kern(q, k, v, plain, is_causal=True, start_pos=30, n_threads=1)
    with sizing.guarded() as recs:
        kern(q, k, v, guarded, is_causal=True, start_pos=30, n_threads=1)
    np.testing.assert_array_equal(plain, guarded)
    assert recs and not any(r.damaged for r in recs)
    # after the guard is off, allocations are plain again (no records)
    with sizing.guarded() as recs2:
        pass
    kern(q, k, v, plain, is_causal=True, start_pos=30, n_threads=1)
    assert recs2 == []


@pytest.mark.parametrize("kernel", ["decomposed", "flash", "flash_maskskip", "quant_int8",
                                    "quant_int8_alloc"])
def test_kernel_scratch_is_what_it_asks_for(kernel):
    for sh in (sizing.SHAPES[1], sizing.SHAPES[3]):
        rep = sizing.measure_scratch(kernel, sh)
        assert rep.ok, rep.problems
        assert rep.allocated == rep.asked > 0
        sc = next(b for b in rep.blocks if b.kind == "per-thread scratch")
        assert sc.overrun == 0 and sc.underrun == 0
        assert 0 < sc.high_water <= rep.asked
        assert rep.max_abs_err < 1e-3


def test_two_threads_allocate_two_slices_without_overrun():
    sh = sizing.ScratchShape("two-threads", 64, 200, kv_dtype="f16", causal=True, start_pos=136,
                             n_threads=2)
    rep = sizing.measure_scratch("flash", sh)
    assert rep.ok, rep.problems
    assert rep.allocated == rep.asked


def test_per_block_dequant_sizing_is_flagged_and_the_fix_is_exact():
    pb = sizing.per_block_dequant_sizing()
    assert pb["dequant_blocks"] > 0 and pb["overrun"] == 0
    assert pb["touched"] == 128 * 64 * 4
    assert pb["per_block_bytes"] == 32 * pb["fixed_bytes"]
    assert pb["per_block_waste"] > sizing.WASTE_LIMIT
    assert pb["fixed_waste"] == 0.0


def test_scratch_suite_cases():
    cases = sizing.scratch_cases(["flash", "quant_int8_alloc"])
    ids = [c["case"] for c in cases]
    assert len(ids) == len(set(ids))
    assert {"align-up-native-grid", "align-up-wrong-mask-expression",
            "scratch-guard-selftest", "per-block-dequant-buffer-sizing"} <= set(ids)
    for c in cases:
        assert {"case", "status", "reason", "max_abs_err", "seconds"} <= set(c)
        assert c["status"] == "pass", c
