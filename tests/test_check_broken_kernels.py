"""The example kernels and the built-in backends pass; deliberately broken copies of the
example kernel fail the way they should, each for its reason."""

import json

import pytest
from conftest import EXAMPLE_KERNEL, needs_cxx
from kernels_for_tests import BUGS, SRC
from typer.testing import CliRunner

from sdpa_probe.backends import NativeBackend
from sdpa_probe.cases import Case, suite
from sdpa_probe.check.calls import run_one
from sdpa_probe.check.pool import WorkerPool
from sdpa_probe.cli import app
from sdpa_probe.native import load_user_kernel
from sdpa_probe.oracle import prepare_case

runner = CliRunner()


# (bug, case, expected status, reason fragment)
EXPECT = [
    ("ignore-start-pos", Case("bug", q_len=3, kv_len=40, causal=True, start_pos=37), "fail",
     "error above tolerance"),
    ("gqa-modulo", Case("bug", n_heads=8, n_kv_heads=2, kv_len=20), "fail", "error above"),
    ("gqa-shift", Case("bug", n_heads=14, n_kv_heads=2, kv_len=20), "fail", "NaN in"),
    ("max-over-hidden-keys", Case("bug", q_len=6, kv_len=140, mask="random", magnitude=100.0,
                                  n_heads=4, n_kv_heads=2), "fail", "NaN in"),
    ("group-tile-16", Case("bug", n_heads=20, n_kv_heads=1, kv_len=20), "fail", "error above"),
    ("start-pos-implies-causal", Case("bug", q_len=4, kv_len=100, start_pos=40), "fail",
     "error above tolerance"),
    ("q-read-as-kv-dtype", Case("bug", kv_len=20, dtype="f16", q_dtype="f32"), "fail", ""),
    ("q-rounded-to-kv-dtype", Case("bug", kv_len=129, dtype="f16", q_dtype="f32"), "fail",
     "error above tolerance"),
    ("drop-partial-block", Case("bug", kv_len=129), "fail", "error above tolerance"),
    ("f16-accumulation", Case("bug", kv_len=2049, dtype="f16", n_heads=4, n_kv_heads=1), "fail",
     "error above tolerance"),
    ("last-head-unwritten", Case("bug", kv_len=20), "fail", "never written"),
    ("write-past-end", Case("bug", kv_len=20), "fail", "out-of-bounds write"),
    ("nan-masked-rows", Case("bug", q_len=3, kv_len=20, mask="rows:first"), "fail",
     "fully masked rows"),
    ("no-write", Case("bug", kv_len=20), "fail", "never written"),
    ("over-read", Case("bug", kv_len=20), "fail", "NaN"),
    ("unit-dim-stride", Case("bug", kv_len=20, layout="dmajor"), "fail", "NaN in"),
    ("additive-causal", Case("bug", q_len=3, kv_len=60, causal=True, start_pos=20), "fail",
     "NaN in"),
    ("mask-stride-is-kv", Case("bug", q_len=3, kv_len=20, mask="random"), "fail", "NaN in"),
    ("int8-batch-params", Case("bug", batch=2, kv_len=20, dtype="i8"), "fail", "error above"),
    ("v-with-k-strides", Case("bug", q_len=2, kv_len=20, layout="vdmajor"), "fail", "NaN in"),
    ("q-scaled-in-place", Case("bug", kv_len=20), "fail", "wrote into its inputs"),
    ("f16-flush-out", Case("bug", kv_len=20, dtype="f16", v_magnitude=1e-5), "fail",
     "error above tolerance"),
    ("f16-flush-in", Case("bug", kv_len=20, dtype="f16", v_magnitude=1e-5), "fail",
     "error above tolerance"),
    ("fp-rounding-left-up", Case("bug", kv_len=20), "fail", "floating-point environment"),
    ("nan-row-unseen", Case("bug", q_len=3, kv_len=100, causal=True, start_pos=97,
                            mask="nan-inputs", n_heads=6, n_kv_heads=3), "fail",
     "finite output where the reference is NaN"),
]


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    d = tmp_path_factory.mktemp("bugs")
    out = {}
    for name, (old, new) in BUGS.items():
        assert SRC.count(old) == 1, name
        p = d / f"{name}.c"
        src = SRC.replace(old, new)
        if name == "q-scaled-in-place":
            add = "float *acc = malloc((size_t)D * sizeof(float));"
            src = src.replace(add, add + "\n  if (a->q.dtype == SDPA_F32)"
                              " for (int64_t b = 0; b < a->batch; b++)"
                              " for (int64_t i = 0; i < a->q_len; i++)"
                              " for (int64_t h = 0; h < a->n_heads; h++)"
                              " for (int64_t d = 0; d < D; d++)"
                              " store(&a->q, b, i, h, d, load(&a->q, b, i, h, d) * scale);")
        if name == "max-over-hidden-keys":
            src = src.replace("float mx = -INFINITY;",
                              "float mx = -INFINITY;\n        int seen_ = 0;")
            src = src.replace("if (mx != -INFINITY) {", "if (seen_) {")
        if name.startswith("fp-"):
            src = "#include <fenv.h>\n" + src
        if name == "additive-causal":  # hidden slots' scores get -inf instead of being skipped
            add = "if (a->mask) s += a->mask[i * a->mask_row_stride + j];"
            src = src.replace(add, add + "\n          if (j >= lim_) s += -INFINITY;")
        p.write_text(src)
        out[name] = p
    return out


_PREPARED: dict = {}


def _prepared(case):
    """A default case's inputs and oracle, made once for every example kernel (they are
    read-only to a kernel: the verdict's input guard fails one that writes them)."""
    if case.id not in _PREPARED:
        _PREPARED[case.id] = prepare_case(case)
    return _PREPARED[case.id]


# (the README's example in every run; its twins, C++ and online softmax, opt in: slow)
@pytest.mark.parametrize("example", ["minimal_sdpa.c",
                                     pytest.param("online_sdpa.c", marks=pytest.mark.slow),
                                     pytest.param("minimal_sdpa.cpp",
                                                  marks=[needs_cxx, pytest.mark.slow])])
def test_example_kernel_passes_default_suite(example):
    backend = NativeBackend("user", load_user_kernel(EXAMPLE_KERNEL.with_name(example)))
    for case in suite("default"):
        rec = run_one(backend, case, _prepared(case))
        assert rec["status"] == "pass", (case.id, rec["reason"])


@pytest.mark.parametrize("bug,case,status,reason", EXPECT, ids=[e[0] for e in EXPECT])
def test_broken_kernel_is_caught(variants, bug, case, status, reason):
    backend = NativeBackend(bug, load_user_kernel(variants[bug]))
    rec = run_one(backend, case, prepare_case(case))
    assert rec["status"] == status, rec
    assert reason in rec["reason"], rec["reason"]


def test_a_kernel_that_writes_its_input_is_caught_though_its_output_is_right(variants):
    """Q scaled in place: every output element within tolerance, the verdict still fails
    (the input check is what catches it, not the error)."""
    backend = NativeBackend("q-scaled-in-place", load_user_kernel(variants["q-scaled-in-place"]))
    case = Case("bug", kv_len=20)
    rec = run_one(backend, case, prepare_case(case))
    assert rec["status"] == "fail" and "Q (" in rec["reason"], rec["reason"]
    assert rec["max_abs_err"] <= rec["atol"], rec  # the output itself is right


def test_f16_accumulation_bug_spares_f32():
    """The tolerance is tight for f16 yet the same kernel still passes in f32."""
    backend = NativeBackend("ok", load_user_kernel(EXAMPLE_KERNEL))
    case = Case("bug", kv_len=2049, dtype="f16", n_heads=4, n_kv_heads=1)
    assert run_one(backend, case, prepare_case(case))["status"] == "pass"


def test_torch_runs_int8_cases_on_the_dequantised_values(tmp_path):
    """torch has no int8 SDPA: its backend takes the int8 cases through its F32 one
    (dequantised values, an int8 query's output in F32) and they pass, where they were
    unsupported; the `args` calls its API cannot express stay unsupported."""
    out = tmp_path / "r.json"
    res = runner.invoke(app, ["check", "-b", "torch", "-k", "-i8", "--json", str(out)])
    assert res.exit_code == 0, res.output
    recs = json.loads(out.read_text())["records"]
    int8 = [r for r in recs if r["family"] != "args"]
    assert len(int8) >= 30 and all(r["status"] == "pass" for r in int8), \
        [(r["case"], r["status"], r["reason"]) for r in int8 if r["status"] != "pass"]
    assert any("-qf32" in r["case"] for r in int8) and any("-sym" in r["case"] for r in int8)


@pytest.mark.executorch
@pytest.mark.skipif(__import__("sdpa_probe.backends", fromlist=["x"]).executorch_library() is None,
                    reason="executorch not installed (pip install --no-deps executorch==1.5.1)")
def test_executorch_nan_on_fully_masked_rows_is_reported():
    records = []
    cases = [Case("et", q_len=3, kv_len=40, mask="rows:first"), Case("et", q_len=1, kv_len=40),
             Case("et", q_len=40, kv_len=20, causal=True, n_heads=4, n_kv_heads=1)]
    WorkerPool(jobs=1, timeout=60).run([(c, ["executorch"]) for c in cases], records.append)
    by_case = {r["case"]: r for r in records}
    masked, plain, over = (by_case[c.id] for c in cases)
    assert masked["status"] == "fail" and "fully masked rows" in masked["reason"]
    assert plain["status"] == "pass", plain
    assert over["status"] == "crash" and "SIGABRT" in over["reason"]
