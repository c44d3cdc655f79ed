"""ONNX Runtime's attention ops as backends (onnxruntime, onnxruntime-gqa,
onnxruntime-mha): for each, a case it passes, one it cannot express (and why), and
one where the runtime is known to differ from the oracle, judged as every backend is;
its invalid calls, its bench party, and the install hint when it is missing."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from sdpa_probe import backends  # noqa: E402
from sdpa_probe.backends import Unsupported  # noqa: E402
from sdpa_probe.backends import onnxruntime_attention as ort_attention  # noqa: E402
from sdpa_probe.bench.inputs import make_inputs  # noqa: E402
from sdpa_probe.bench.shapes import parse_shape  # noqa: E402
from sdpa_probe.cases import Case, find_case  # noqa: E402
from sdpa_probe.check.calls import run_one  # noqa: E402
from sdpa_probe.oracle import prepare_case  # noqa: E402

VARIANTS = ("onnxruntime", "onnxruntime-gqa", "onnxruntime-mha")

# a static cache longer than the causal edge, its stale slots NaN (the smoke suite's
# "runtime's most common call")
STALE_SLOTS = Case("decode", kv_len=300, causal=True, start_pos=200)
MASKED_ROW = Case("masked-rows", q_len=4, kv_len=40, mask="rows:first")
PASSING = {
    "onnxruntime": Case("causal", q_len=4, kv_len=100, causal=True, start_pos=96,
                        mask="random", dtype="f16"),
    "onnxruntime-gqa": STALE_SLOTS,
    "onnxruntime-mha": Case("causal", q_len=5, kv_len=80, causal=True, start_pos=40),
}
UNSUPPORTED = {
    "onnxruntime": (Case("dtype", kv_len=65, dtype="bf16"), "no BF16 CPU kernel for Attention"),
    "onnxruntime-gqa": (Case("hdim", q_len=2, kv_len=70, head_dim=67),
                        "head_size must be a multiple of 8"),
    "onnxruntime-mha": (Case("layout", q_len=3, kv_len=65, layout="padded"),
                        "dense tensors only"),
}
# (variant, case, status, words of its reason): where ORT differs from the oracle
DIFFERS = [
    # a row masked with float32's lowest value (not -inf) taken for a fully masked one
    ("onnxruntime", find_case("masked-rows-h4gqa2-q4-kv140-d64-f32-rowsnegfinite"), "fail",
     "(out 0, ref 0.221738"),
    # a row whose every score is -inf: NaN, where the oracle (and Attention) give zeros
    ("onnxruntime-gqa", MASKED_ROW, "fail", "fully masked rows: reference is zeros"),
    ("onnxruntime-mha", MASKED_ROW, "fail", "fully masked rows: reference is zeros"),
]


def check(name: str, case: Case):
    return run_one(backends.make(name), case, prepare_case(case))


def test_the_variants_are_registered_and_name_their_op():
    for name, op in zip(VARIANTS, ("Attention opset 23", "GroupQueryAttention",
                                   "MultiHeadAttention"), strict=True):
        spec = backends.parse(name)
        assert spec.kind == "registered" and spec.why_unavailable() is None
        version = backends.make(spec).version()
        assert version.startswith("onnxruntime 1.") and op in version


@pytest.mark.parametrize("name", VARIANTS)
def test_a_case_it_expresses_passes(name):
    rec = check(name, PASSING[name])
    assert rec["status"] == "pass", rec["reason"]


@pytest.mark.parametrize("name", VARIANTS)
def test_a_case_it_cannot_express_is_unsupported_with_the_reason(name):
    case, words = UNSUPPORTED[name]
    rec = check(name, case)
    assert rec["status"] == "unsupported" and words in rec["reason"], rec["reason"]


@pytest.mark.parametrize("name, case, status, words", DIFFERS)
def test_where_the_runtime_differs_from_the_oracle_the_verdict_says_so(name, case, status,
                                                                       words):
    rec = check(name, case)
    assert rec["status"] == status and words in rec["reason"], rec["reason"]


# a fully masked row (zeros), no stale slot read, a BF16 cache under an F32 query (cast up)
@pytest.mark.parametrize("case", [MASKED_ROW, STALE_SLOTS,
                                  Case("dtype", kv_len=65, dtype="bf16", q_dtype="f32")],
                         ids=lambda c: c.id)
def test_attention_passes_where_the_contrib_ops_differ_or_bf16_is_cast_up(case):
    rec = check("onnxruntime", case)
    assert rec["status"] == "pass", rec["reason"]


@pytest.mark.parametrize("name", VARIANTS)
def test_bf16_is_refused_by_onnxruntime_itself(name):
    """The BF16 reasons are measured: building the op's BF16 session fails (if ORT
    gains a BF16 CPU kernel, this fails, and the reason is stale)."""
    import ml_dtypes  # (onnx's own dependency)
    import onnxruntime

    case = Case("dtype", kv_len=16)
    b = backends.make(name)
    q, k, v = (np.zeros(s, ml_dtypes.bfloat16) for s in ((1, 1, 8, 64), (1, 16, 2, 64),
                                                          (1, 16, 2, 64)))
    call = b.plan(ort_attention.Geometry.of(case), q, k, v, None)
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.NotImplemented,
                       match="Could not find an implementation"):
        ort_attention.build_session(call, 1)


def test_invalid_calls_are_made_through_the_op_and_judged():
    refused = check("onnxruntime", find_case(
        "args-h8gqa4-q2-kv70-d64-f32-random-invalid-heads-not-multiple"))
    assert refused["status"] == "pass"
    assert ("raised OrtRefusal" in refused["reason"]
            and "Attention: q_num_heads must be a multiple of kv_num_heads" in refused["reason"])
    # a NaN scale: Attention takes it for the default scale and answers
    answered = check("onnxruntime", find_case(
        "args-h8gqa4-q2-kv70-d64-f32-random-invalid-nan-scale"))
    assert answered["status"] == "fail" and "raising nothing" in answered["reason"]
    # MultiHeadAttention has no kv head count to break
    rec = check("onnxruntime-mha", find_case(
        "args-h8gqa4-q2-kv70-d64-f32-random-invalid-heads-not-multiple"))
    assert rec["status"] == "unsupported"


TIMED_SHAPES = ("decode-h8kv2d64-kv128-causal-f32", "decode-h8kv2d64-kv128-f16")


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("shape_name", TIMED_SHAPES)
def test_its_bench_party_times_the_op_on_each_input_set(name, shape_name):
    shape = parse_shape(shape_name)
    party = backends.make(name).timer(shape, make_inputs(shape, n_sets=2), 1)
    seconds = party.run(3)
    assert len(seconds) == 3 and all(s > 0 for s in seconds)
    with pytest.raises(Unsupported, match="int8"):
        backends.make(name).timer(parse_shape("decode-h8kv2d64-kv128-i8"),
                                  make_inputs(parse_shape("decode-h8kv2d64-kv128-i8")), 1)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("shape_name", TIMED_SHAPES)
def test_the_timed_call_computes_what_the_checked_call_does(name, shape_name):
    """bench times the op in its cache form where that differs from check's call."""
    shape = parse_shape(shape_name)
    s = make_inputs(shape)[0]
    b, g = backends.make(name), ort_attention.Geometry.of(shape)
    checked = b.execute(b.plan(g, s.q, s.k, s.v, None), 1)
    timed = b.execute(b.timed_plan(g, s.q, s.k, s.v), 1)
    if timed.ndim == 4:  # (Attention's 4D form: [B, H, Lq, D])
        timed = timed.transpose(0, 2, 1, 3)
    np.testing.assert_allclose(timed.reshape(checked.shape), checked, rtol=1e-3, atol=1e-3)


def test_without_onnxruntime_it_says_how_to_install_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    why = backends.parse("onnxruntime-gqa").why_unavailable()
    assert why == "onnxruntime is not installed: pip install onnxruntime==1.32.0 onnx==1.23.2"
