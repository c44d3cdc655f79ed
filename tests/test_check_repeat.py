"""A call's answer depending on calls before it: bits that change from call to call, state
left behind, caches keyed by a buffer's address, a wrong first call, and --repro --after."""

import json

import numpy as np
import pytest
from kernels_for_tests import SRC, cli_records
from typer.testing import CliRunner

from sdpa_probe.backends import NativeBackend
from sdpa_probe.cases import Case, suite
from sdpa_probe.check.calls import run_one
from sdpa_probe.cli import app
from sdpa_probe.native import load_user_kernel
from sdpa_probe.oracle import prepare_case

runner = CliRunner()


def test_a_kernel_whose_bits_change_from_call_to_call_passes_with_a_note(tmp_path):
    """Every other call a rounding different by an ulp (as a merge order that follows
    thread timing gives): within tolerance both times, so a pass, but not repeatable."""
    last = "for (int64_t d = 0; d < D; d++) store(&a->out, b, i, h, d, acc[d]);"
    src = SRC.replace("int sdpa_forward(", "static int calls;\nint sdpa_forward(", 1)
    src = src.replace("  free(acc);\n  return SDPA_OK;", "  free(acc);\n  calls++;\n"
                      "  return SDPA_OK;").replace(last, last.replace(
                          "acc[d])", "(calls & 1) ? nextafterf(acc[d], INFINITY) : acc[d])"))
    k = tmp_path / "wobbly.c"
    k.write_text(src)
    res = runner.invoke(app, ["check", "--kernel", str(k), "-k", "decode-h8gqa4-q1-kv1"])
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    assert "gave another answer, bit for bit, when the same call was repeated" in flat
    out = tmp_path / "r.json"
    runner.invoke(app, ["check", "--kernel", str(k), "-k", "decode-h8gqa4-q1-kv1", "--json",
                        str(out)])
    recs = json.loads(out.read_text())["records"]
    assert recs and all(r["status"] == "pass" and r["repeatable"] is False for r in recs)
    res = runner.invoke(app, ["check", "-b", "flash", "-k", "decode-h8gqa4-q1-kv1", "--json",
                              str(out)])
    ran = [r for r in json.loads(out.read_text())["records"] if r["status"] == "pass"]
    assert ran and all(r["repeatable"] is True for r in ran)


def test_state_a_call_leaves_behind_is_caught_by_the_repeated_call(tmp_path):
    """The rows staged in F32 in a per-thread buffer zeroed only when (re)allocated: the
    first call of a size is right, a second of the same size adds onto the first. The
    repeat layer makes that second call on every case; before it, only cases that
    happened to follow a case of the same size in their worker caught it."""
    loop = ("  for (int64_t b = 0; b < a->batch; b++)\n"
            "    for (int64_t i = 0; i < a->q_len; i++)\n"
            "      for (int64_t h = 0; h < a->n_heads; h++) {")
    staging = ("  static _Thread_local struct { float *p; int64_t n; } st_;\n"
               "  const int64_t n_ = a->batch * a->q_len * a->n_heads * D;\n"
               "  if (st_.n != n_) {\n    free(st_.p);\n"
               "    st_.p = calloc((size_t)(n_ > 0 ? n_ : 1), sizeof(float));\n"
               "    st_.n = n_;\n  }\n")
    put = "        for (int64_t d = 0; d < D; d++) store(&a->out, b, i, h, d, acc[d]);"
    staged = ("        float *stage_ = st_.p + ((b * a->q_len + i) * a->n_heads + h) * D;\n"
              "        for (int64_t d = 0; d < D; d++) {\n"
              "          stage_[d] += acc[d];\n"
              "          store(&a->out, b, i, h, d, stage_[d]);\n        }")
    assert SRC.count(loop) == SRC.count(put) == 1
    path = tmp_path / "staging.c"
    path.write_text(SRC.replace(loop, staging + loop).replace(put, staged))
    backend = NativeBackend("staging", load_user_kernel(path))
    case = Case("bug", kv_len=20)
    rec = run_one(backend, case, prepare_case(case))
    assert rec["status"] == "fail" and "the same call made again" in rec["reason"], rec
    assert rec["max_abs_err"] <= rec["atol"], rec  # the first call itself was right


# what a kernel derives from a buffer, kept by the buffer's address (and shape) in a
# thread-local cache: right on every call but one after its buffer was rewritten in place
MASK_RANGE_CACHE = """
        if (a->mask && a->q_len <= 64) { /* each row's masked tail skipped: its last visible key */
          static _Thread_local struct {
            const float *mask; int64_t q_len, kv, stride, last[64];
          } mc_;
          if (mc_.mask != a->mask || mc_.q_len != a->q_len || mc_.kv != kv ||
              mc_.stride != a->mask_row_stride) {
            mc_.mask = a->mask; mc_.q_len = a->q_len; mc_.kv = kv; mc_.stride = a->mask_row_stride;
            for (int64_t r = 0; r < a->q_len; r++) {
              mc_.last[r] = 0;
              for (int64_t j = 0; j < kv; j++)
                if (a->mask[r * a->mask_row_stride + j] != -INFINITY) mc_.last[r] = j + 1;
            }
          }
          if (mc_.last[i] < n) n = mc_.last[i];
        }"""


K_DEQUANT_CACHE = """/* int8 K dequantised once per K buffer (its address and shape) */
static float k_dequant(const sdpa_tensor *t, int64_t B, int64_t S, int64_t H, int64_t D,
                       int64_t b, int64_t s, int64_t h, int64_t d) {
  static _Thread_local struct { const void *data; int64_t B, S, H, D; float *vals; } kc_;
  if (kc_.data != t->data || kc_.B != B || kc_.S != S || kc_.H != H || kc_.D != D) {
    free(kc_.vals);
    kc_.vals = malloc((size_t)(B * S * H * D > 0 ? B * S * H * D : 1) * sizeof(float));
    kc_.data = t->data; kc_.B = B; kc_.S = S; kc_.H = H; kc_.D = D;
    for (int64_t b_ = 0; b_ < B; b_++)
      for (int64_t s_ = 0; s_ < S; s_++)
        for (int64_t h_ = 0; h_ < H; h_++)
          for (int64_t d_ = 0; d_ < D; d_++)
            kc_.vals[((b_ * S + s_) * H + h_) * D + d_] = load(t, b_, s_, h_, d_);
  }
  return kc_.vals[((b * S + s) * H + h) * D + d];
}

"""


def _pointer_cache_kernels() -> dict[str, str]:
    causal = ("if (a->is_causal && a->start_pos + i + 1 < n) n = a->start_pos + i + 1;")
    entry = "int sdpa_forward(const sdpa_args *a) {"
    dot = "s += load(&a->q, b, i, h, d) * load(&a->k, b, j, hk, d);"
    assert SRC.count(causal) == SRC.count(entry) == SRC.count(dot) == 1
    return {
        "mask_ranges.c": SRC.replace(causal, causal + MASK_RANGE_CACHE),
        "k_dequant.c": SRC.replace(entry, K_DEQUANT_CACHE + entry).replace(dot, (
            "s += load(&a->q, b, i, h, d) * (a->k.dtype == SDPA_I8 ? k_dequant(&a->k, "
            "a->batch, kv, a->n_kv_heads, D, b, j, hk, d) : load(&a->k, b, j, hk, d));")),
    }


@pytest.mark.parametrize("name,reuse,twin", [
    ("mask_ranges.c", "reuse-h8gqa4-q1-kv300-d64-f32-random-reuse",
     "mask-h8gqa4-q1-kv300-d64-f32-random"),
    ("k_dequant.c", "reuse-h8gqa4-q1-kv129-d64-i8-reuse", "dtype-h8gqa4-q1-kv129-d64-i8")])
def test_a_cache_by_buffer_address_is_caught_by_rewriting_the_buffers(tmp_path, name, reuse, twin):
    """A mask's visible ranges, or int8 K dequantised, kept by the buffer's address: a
    case called once on fresh buffers passes (every case before `reuse` was called once),
    and the `reuse` case's second call, the same buffers rewritten with new values as a
    static KV cache and mask are between decode steps, gets the first call's answer.
    Each case runs alone, in a fresh worker: run together, a freed buffer's address handed
    to the next case of the same shape makes either's first call stale (a real catch too,
    but one that depends on the allocator, and it made this test flaky)."""
    src = _pointer_cache_kernels()[name]
    recs = cli_records(tmp_path, name, src, reuse)
    assert list(recs) == [reuse] and recs[reuse]["status"] == "fail", recs
    assert "rewritten in place" in recs[reuse]["reason"]
    recs = cli_records(tmp_path, name, src, twin, args=("--skip", "-sym", "--skip", "-x100"),
                        exit_code=0)
    assert list(recs) == [twin] and recs[twin]["status"] == "pass", recs


def test_a_failure_right_on_fresh_copies_names_the_case_run_before_it(tmp_path):
    """A CI flake, made on purpose: int8 K dequantised by K's address, and
    the next case's K given the freed buffer's address (here: written into the same
    buffers). Its call is wrong, the same call on fresh copies of its inputs is right:
    the record says the failure depends on the case before it, and its repro replays
    that case first."""
    import dataclasses

    from sdpa_probe.inputs import input_buffers
    from sdpa_probe.judge.fresh_inputs import retry_on_fresh_inputs
    from sdpa_probe.oracle import Prepared

    path = tmp_path / "k_dequant.c"
    path.write_text(_pointer_cache_kernels()["k_dequant.c"])
    backend = NativeBackend(str(path), load_user_kernel(path))
    first = next(c for c in suite("default") if c.id == "dtype-h8gqa4-q1-kv129-d64-i8")
    then = dataclasses.replace(first, seed=first.seed + 1)
    prep = prepare_case(first)
    assert run_one(backend, first, prep)["status"] == "pass"
    new = prepare_case(then)
    for name, a in input_buffers(prep.data).items():
        np.copyto(a, input_buffers(new.data)[name])
    d = prep.data
    recycled = Prepared(dataclasses.replace(new.data, q_store=d.q_store, k_store=d.k_store,
                                            v_store=d.v_store, mask=d.mask),
                        new.ref, new.torch_err)
    rec = run_one(backend, then, recycled)
    assert rec["status"] == "fail"
    retry_on_fresh_inputs(rec, backend, then, recycled, first)
    assert rec["status"] == "fail" and rec["fresh_retry"] == "pass", rec
    assert rec["after_case"] == first.id and f"wrong after {first.id}" in rec["reason"]
    assert rec["repro"].endswith(f"--repro {then.id} --after {first.id}"), rec["repro"]


def _first_call_kernel(tag: str = "") -> str:
    """The example with its output halved on the process's first call (a lazily built
    table used before it is filled); `tag`, a comment, makes a source (and so a library
    loaded in this process) of its own, with its own call count."""
    entry = "int sdpa_forward(const sdpa_args *a) {"
    put = "        for (int64_t d = 0; d < D; d++) store(&a->out, b, i, h, d, acc[d]);"
    assert SRC.count(entry) == SRC.count(put) == 1
    return SRC.replace(entry, f"/* {tag} */ static int calls_;\n" + entry).replace(
        "int st = sdpa_validate_args(a);",
        "int st = sdpa_validate_args(a);\n  const int first_ = calls_++ == 0;").replace(
        put, "        for (int64_t d = 0; d < D; d++) "
             "store(&a->out, b, i, h, d, first_ ? 0.5f * acc[d] : acc[d]);")


def test_a_kernel_wrong_only_on_its_first_call_is_told_apart(tmp_path):
    """Wrong on the process's first call only: the check's record says the same inputs
    gave the right answer afterwards."""
    src = _first_call_kernel()
    recs = cli_records(tmp_path, "first_call.c", src, "gqa-h8gqa4-q1-kv129-d64-f32")
    (rec,) = recs.values()
    assert rec["status"] == "fail" and rec["fresh_retry"] == "pass", rec
    assert rec["reason"].startswith("wrong on the first call, right on fresh copies"), rec
    # one worker: only the case it runs first fails; --isolate: each case is a first call
    two = ("gqa-h8gqa4-q1-kv129-d64-f32", "gqa-h8gqa2-q1-kv129-d64-f32")
    for args, n_failed in ((("-j", "1"), 1), (("-j", "1", "--isolate"), 2)):
        recs = cli_records(tmp_path, "first_call.c", src, *two, args=args)
        assert sum(r["status"] == "fail" for r in recs.values()) == n_failed, (args, recs)


def test_a_two_caller_failure_right_on_retry_is_put_down_to_a_race(tmp_path):
    """With two callers, a failure that a retry on fresh copies does not repeat is most
    likely their race; the reason says so rather than blaming an earlier case."""
    from sdpa_probe.judge.fresh_inputs import retry_on_fresh_inputs

    path = tmp_path / "first_call_c2.c"
    path.write_text(_first_call_kernel("two callers"))
    backend = NativeBackend("first", load_user_kernel(path))
    case = next(c for c in suite("default") if c.callers > 1 and c.dtype == "f32")
    prep = prepare_case(case)
    rec = run_one(backend, case, prep)
    assert rec["status"] == "fail", rec
    retry_on_fresh_inputs(rec, backend, case, prep, earlier=None)
    assert rec["fresh_retry"] == "pass", rec
    assert rec["reason"].startswith("wrong in one run of 2 concurrent calls"), rec["reason"]


def test_repro_after_replays_the_case_a_failure_depends_on(tmp_path):
    """int8 K dequantised once per shape (no address in the key): the symmetric case is
    right alone and wrong after the asymmetric one of the same shape, in one process."""
    path = tmp_path / "k_shape.c"
    path.write_text(_pointer_cache_kernels()["k_dequant.c"].replace(
        "kc_.data != t->data || ", ""))
    case, before = "dtype-h8gqa4-q1-kv129-d64-i8-sym", "dtype-h8gqa4-q1-kv129-d64-i8"
    res = runner.invoke(app, ["check", "--kernel", str(path), "--repro", case])
    assert res.exit_code == 0 and f"on {case}: pass" in " ".join(res.output.split())
    res = runner.invoke(app, ["check", "--kernel", str(path), "--repro", case,
                              "--after", before])
    text = " ".join(res.output.split())
    assert res.exit_code == 1 and f"ran first: {path} on {before}: pass" in text, text
    assert f"on {case}: fail - error above tolerance" in text, text
    res = runner.invoke(app, ["check", "--kernel", str(path), "--after", before])
    assert res.exit_code == 2 and "--after needs --repro" in res.output
