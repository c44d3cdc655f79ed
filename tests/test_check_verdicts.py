"""The oracle `probe check` compares against, and the order of its verdict's reasons (NaN,
unwritten output, out-of-bounds and late writes, error above tolerance)."""

import json

import numpy as np
import pytest
import torch
from kernels_for_tests import SRC
from typer.testing import CliRunner

from sdpa_probe.cases import Case
from sdpa_probe.cli import app
from sdpa_probe.inputs import out_buffer
from sdpa_probe.judge.verdict import judge
from sdpa_probe.oracle import prepare_case
from sdpa_probe.reference import sdpa_reference

runner = CliRunner()


def test_oracle_matches_torch_sdpa_on_plain_attention():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 5, 4, 16, generator=g, dtype=torch.float64)
    k = torch.randn(2, 9, 4, 16, generator=g, dtype=torch.float64)
    v = torch.randn(2, 9, 4, 16, generator=g, dtype=torch.float64)
    ref = sdpa_reference(q, k, v)
    t = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(ref, t)


def test_oracle_causal_is_bottom_right_and_gqa_maps_by_division():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 3, 4, 8, generator=g, dtype=torch.float64)
    k = torch.randn(1, 7, 2, 8, generator=g, dtype=torch.float64)
    v = torch.randn(1, 7, 2, 8, generator=g, dtype=torch.float64)
    ref = sdpa_reference(q, k, v, is_causal=True, start_pos=4)
    for i in range(3):
        for h in range(4):
            n = 4 + i + 1  # keys 0..start_pos+i
            kk, vv = k[0, :n, h // 2], v[0, :n, h // 2]
            p = torch.softmax(kk @ q[0, i, h] / 8 ** 0.5, dim=0)
            torch.testing.assert_close(ref[0, i, h], p @ vv)


def test_oracle_fully_masked_row_is_zero():
    q = torch.randn(1, 2, 1, 4, dtype=torch.float64)
    k = torch.randn(1, 3, 1, 4, dtype=torch.float64)
    mask = torch.tensor([[0.0, 0.0, 0.0], [-np.inf] * 3])
    ref = sdpa_reference(q, k, k, mask=mask)
    assert torch.all(ref[0, 1] == 0) and torch.isfinite(ref).all()


def _case_and_ref():
    case = Case("verdict", q_len=2, kv_len=20, n_heads=2, n_kv_heads=1, head_dim=8)
    prep = prepare_case(case)
    return case, prep.ref


def _filled(case, values):
    buf = out_buffer(case)
    buf.view[...] = values.astype(buf.view.dtype)
    return buf


def test_verdict_nan_comes_before_poison_and_error():
    case, ref = _case_and_ref()
    vals = ref.copy()
    vals[0, 1, 0, :] = np.nan
    buf = _filled(case, vals)
    buf.view[0, 0, 1, 0] = np.float32(7.0)         # also a plain error
    from sdpa_probe.inputs import POISON
    bits_t, poison = POISON[buf.view.dtype]
    buf.view.view(bits_t)[0, 0, 0, 0] = poison      # and an unwritten element
    v = judge(case, ref, buf)
    assert v.status == "fail" and v.reason.startswith("NaN in 1 of")


def test_verdict_poison_then_guard_then_error():
    case, ref = _case_and_ref()
    buf = _filled(case, ref)
    from sdpa_probe.inputs import POISON
    bits_t, poison = POISON[buf.view.dtype]
    buf.view.view(bits_t)[0, 1, 1, 3] = poison
    buf.arena[-1] = 1.0
    v = judge(case, ref, buf)
    assert "never written" in v.reason and "q=1 h=1 d=3" in v.reason
    buf = _filled(case, ref)
    buf.arena[-1] = 1.0
    buf.view[0, 0, 0, 0] += 1.0
    assert "out-of-bounds write" in judge(case, ref, buf).reason
    buf = _filled(case, ref)
    buf.view[0, 0, 0, 0] += 1e-3
    v = judge(case, ref, buf)
    assert v.status == "fail" and "error above tolerance" in v.reason
    assert v.worst == (0, 0, 0, 0)
    assert judge(case, ref, _filled(case, ref)).status == "pass"


def test_verdict_a_write_after_the_call_returned_comes_first():
    case, ref = _case_and_ref()
    buf = _filled(case, ref)
    from sdpa_probe.inputs import POISON
    bits_t, poison = POISON[buf.view.dtype]
    buf.view.view(bits_t)[0, 1, 1, 3] = poison
    buf.at_return = buf.arena.copy()                   # the call returned with poison there
    assert "never written" in judge(case, ref, buf).reason
    buf.view[0, 1, 1, 3] = ref[0, 1, 1, 3]              # ... and a thread wrote it since
    v = judge(case, ref, buf)
    assert v.status == "fail" and v.reason.startswith("1 output elements written after "
                                                      "sdpa_forward had returned")
    assert "q=1 h=1 d=3" in v.reason
    buf = _filled(case, ref)
    buf.at_return = buf.arena.copy()
    buf.arena[-1] = 1.0                                 # late, and out of bounds
    assert "in the guard region" in judge(case, ref, buf).reason
    buf.at_return = buf.arena.copy()
    assert judge(case, ref, buf).reason.startswith("out-of-bounds write")
    # a strided output (heads before positions in memory): the place is the view's
    for layout in ("bhsd", "dmajor"):
        c = Case("verdict", q_len=3, kv_len=20, n_heads=2, n_kv_heads=1, head_dim=8,
                 layout=layout)
        buf = out_buffer(c)
        buf.view[...] = 0.5
        assert not buf.view.flags.c_contiguous
        buf.at_return = buf.arena.copy()
        buf.view[0, 2, 1, 5] = 0.25
        assert buf.written_after_return() == (1, (0, 2, 1, 5))


LATE_STORE = """
#include <pthread.h>
#include <time.h>
static struct { sdpa_tensor t; int64_t b, i, h, d; float x; } late;
static void *late_store(void *arg) {
  (void)arg;
  struct timespec ts = {0, DELAY_NS};
  nanosleep(&ts, NULL);
  store(&late.t, late.b, late.i, late.h, late.d, late.x);
  return NULL;
}
"""


@pytest.mark.parametrize("delay_ns", [2_000_000, 50_000_000])
def test_a_kernel_whose_thread_stores_after_it_returned_is_caught(tmp_path, delay_ns):
    """The last element stored by a detached thread 2 ms or 50 ms after the call
    returned (the judge watches unwritten output up to 0.2 s). Before the output was
    copied as the call returned, this read as 'never written' or, the store done by the
    time Python looked, a pass. (A store at once is not a case a test can make: on a
    loaded machine the thread may store before the call's return is seen, and the
    output is then whole.)"""
    last = "for (int64_t d = 0; d < D; d++) store(&a->out, b, i, h, d, acc[d]);"
    src = SRC.replace("int sdpa_forward(", f"#define DELAY_NS {delay_ns}\n{LATE_STORE}\n"
                      "int sdpa_forward(", 1)
    assert src.count(last) == 1 and src.count("  free(acc);\n  return SDPA_OK;") == 1
    src = src.replace(last, """for (int64_t d = 0; d < D; d++) {
          if (b == a->batch - 1 && i == a->q_len - 1 && h == a->n_heads - 1 && d == D - 1) {
            late.t = a->out; late.b = b; late.i = i; late.h = h; late.d = d; late.x = acc[d];
          } else {
            store(&a->out, b, i, h, d, acc[d]);
          }
        }""").replace("  free(acc);\n  return SDPA_OK;", """  free(acc);
  pthread_t th;
  if (pthread_create(&th, NULL, late_store, NULL) == 0) pthread_detach(th);
  return SDPA_OK;""")
    k = tmp_path / "late.c"
    k.write_text(src)
    res = runner.invoke(app, ["check", "--kernel", str(k), "--suite", "smoke", "--json", "-"])
    assert res.exit_code == 1, res.output
    recs = json.loads(res.stdout)["records"]
    assert recs and all(r["status"] == "fail" and "written after sdpa_forward had returned"
                        in r["reason"] for r in recs), [r["reason"] for r in recs]
