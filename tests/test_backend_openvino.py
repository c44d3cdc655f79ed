"""OpenVINO's CPU plugin as a backend (backends/openvino_sdpa.py): a few cases of the
default suite judged as `probe check` judges them, for the F32 and the BF16 inference
precision, and the views its inputs are cut from."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("openvino")

import torch  # noqa: E402

from sdpa_probe import backends  # noqa: E402 (after the skip: the backends need openvino)
from sdpa_probe.backends.openvino_graph import frame  # noqa: E402
from sdpa_probe.bench.inputs import make_inputs  # noqa: E402
from sdpa_probe.bench.shapes import parse_shape  # noqa: E402
from sdpa_probe.cases import find_case  # noqa: E402
from sdpa_probe.check.calls import run_one  # noqa: E402
from sdpa_probe.oracle import prepare_case  # noqa: E402
from sdpa_probe.reference import sdpa_reference  # noqa: E402


def verdict(backend: str, case_id: str):
    case = find_case(case_id)
    return run_one(backends.make(backend), case, prepare_case(case))


@pytest.mark.parametrize("backend,case_id", [
    ("openvino", "decode-h8gqa4-q1-kv129-d64-f32"),              # kv heads broadcast in the graph
    ("openvino", "causal-h4gqa2-q5-kv80-d64-f32-causal40"),      # the edge as a mask of ours
    # (views cut out of their blocks in the graph)
    ("openvino", "layout-b2-h4gqa2-q5-kv75-d64-f32-causal70-random-padded"),
    ("openvino-bf16", "dtype-h8gqa4-q1-kv129-d64-bf16"),
    ("openvino-stateful", "causal-h4gqa2-q5-kv80-d64-f32-causal40"),  # its own edge, a past of 40
    # (the fused node's rows that see no key are zeros, as the oracle's)
    ("openvino-stateful", "masked-rows-h4gqa2-q5-kv140-d64-f32-rowsfirst"),
])
def test_it_passes_where_the_op_computes_the_oracle(backend, case_id):
    rec = verdict(backend, case_id)
    assert rec.status == "pass", rec.reason


@pytest.mark.parametrize("backend,case_id,why", [
    ("openvino", "dtype-h8gqa4-q1-kv129-d64-i8", "has no int8 path"),
    ("openvino", "layout-b2-h4gqa2-q2-kv70-d64-f32-far", "no C-contiguous block"),
    ("openvino-bf16", "decode-h8gqa4-q1-kv129-d64-f32", "runs bf16 queries"),
    ("openvino-stateful", "prefill-h4mqa-q40-kv20-d64-f32-causal", "fewer keys than queries"),
])
def test_what_it_cannot_express_is_unsupported_with_the_reason(backend, case_id, why):
    rec = verdict(backend, case_id)
    assert rec.status == "unsupported" and why in rec.reason, rec.reason


def test_a_row_that_sees_no_key_is_nan_where_the_oracle_has_zeros():
    rec = verdict("openvino", "masked-rows-h4gqa2-q5-kv140-d64-f32-rowsfirst")
    assert rec.status == "fail"
    assert "NaN in 4 of 20 output rows" in rec.reason and "fully masked rows" in rec.reason


def test_bf16_precision_rounds_the_scores_of_large_logits():
    """x10 logits over head_dim 128: the scores rounded to BF16 before the softmax err
    by ~0.1, some 14 times torch's own error."""
    rec = verdict("openvino-bf16", "logits-h8gqa4-q1-kv130-d128-bf16-x10")
    assert rec.status == "fail" and "error above tolerance" in rec.reason, rec.reason
    assert rec.max_abs_err > 5 * rec.torch_err


def test_the_version_says_which_precision_the_compiled_model_reports():
    assert "compiled model reports" in backends.make("openvino-bf16").version()


@pytest.mark.parametrize("name", ["decode-h8kv2d64-kv64-f32",
                                  "prefill-h4kv2d64-q8-kv40-causal-f32"])
def test_the_timed_calls_compute_the_shapes_attention(name):
    """bench's parties: the plain op on the set's memory, and the stateful step after its
    warm ones, each attending over the shape's kv_len keys."""
    shape = parse_shape(name)
    sets = make_inputs(shape, 2)
    s = sets[1]
    ref = sdpa_reference(*(torch.from_numpy(x) for x in (s.q32, s.k32, s.v32)),
                         is_causal=shape.causal, start_pos=shape.start_pos).numpy()
    plain = backends.make("openvino").timer(shape, sets, 1)
    stateful = backends.make("openvino-stateful").timer(shape, sets, 1)
    for party, request in ((plain, plain._fns[1].request), (stateful, stateful._steps[1].request)):
        assert len(party.run(2)) == 2
        np.testing.assert_allclose(request.get_output_tensor(0).data, ref, atol=2e-5)


def _cut(block: np.ndarray, f) -> np.ndarray:
    """What openvino_graph.cut does in the graph, in numpy."""
    return block[tuple(slice(0, e) for e in f.extents)].reshape(f.sorted_shape).transpose(f.axes)


def test_a_strided_view_is_its_blocks_leading_corner():
    arena = np.arange(2 * 9 * 3 * 10, dtype=np.float32).reshape(2, 9, 3, 10)
    padded = arena[:, :7, :2, :8]
    bhsd = np.arange(2 * 3 * 9 * 8, dtype=np.float32).reshape(2, 3, 9, 8)[:, :, :7].transpose(
        0, 2, 1, 3)
    for view in (padded, bhsd, arena[:1, :4, :2]):
        block, f = frame(view)
        assert np.shares_memory(block, view) and block.flags.c_contiguous
        np.testing.assert_array_equal(_cut(block, f), view)
    # no block: batches that start past the memory's end, or rows walked backwards
    assert frame(arena[:, 2:]) is None and frame(arena[:, ::-1]) is None
