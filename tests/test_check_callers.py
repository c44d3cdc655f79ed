"""What a kernel owes its callers: concurrent calls, a small caller stack, the threads it
was given and no more, and the floating-point environment left as it was found."""

import platform

import pytest
from conftest import EXAMPLE_KERNEL
from kernels_for_tests import SRC, cli_records

from sdpa_probe import native
from sdpa_probe.backends import NativeBackend
from sdpa_probe.cases import Case, suite
from sdpa_probe.check.calls import run_one
from sdpa_probe.inputs import out_buffer
from sdpa_probe.native import load_user_kernel
from sdpa_probe.oracle import prepare_case


def test_static_scratch_is_caught_by_concurrent_callers(tmp_path):
    """The example with its score buffer static (one per process, not per call): right
    whenever it is called from one thread, wrong when two callers share it."""
    old = "float *p = malloc((size_t)(kv > 0 ? kv : 1) * sizeof(float));"
    assert SRC.count(old) == 1 and SRC.count("free(p);") == 2
    src = SRC.replace(old, "static float p_[1 << 16];\n  float *p = kv <= (1 << 16) ? p_ : NULL;")
    path = tmp_path / "static_scratch.c"
    path.write_text(src.replace("free(p);", ""))
    backend = NativeBackend("static", load_user_kernel(path))
    for case in suite("default"):
        if case.family == "threads" and case.dtype == "f32" and not case.stack_kib:
            rec = run_one(backend, case, prepare_case(case))
            if case.callers == 1:
                assert rec["status"] == "pass", rec
            else:
                assert rec["status"] == "fail", rec
                assert "with 2 concurrent calls" in rec["reason"], rec["reason"]


def test_concurrent_callers_each_get_their_own_inputs():
    case = next(c for c in suite("default") if c.callers > 1 and c.dtype == "f32")
    assert case.id.endswith("-c2")
    rec = run_one(NativeBackend("flash"), case, prepare_case(case))
    assert rec["status"] == "pass", rec
    with pytest.raises(ValueError, match="callers"):
        Case("x", callers=0)


def test_stack_array_of_kv_len_is_caught_by_a_small_caller_stack(tmp_path):
    """The example with its scores in a VLA (kv_len floats on the stack): fine on a
    main thread's 8 MiB, an overflow on a 256 KiB worker thread (a crash, in its
    worker process) with 100,000 keys."""
    old = "float *p = malloc((size_t)(kv > 0 ? kv : 1) * sizeof(float));"
    src = SRC.replace(old, "float p_[kv > 0 ? kv : 1];\n  float *p = p_;").replace("free(p);", "")
    recs = cli_records(tmp_path, "vla.c", src, "threads-")
    small = [c for c in recs if c.endswith("-stack256k")]
    assert small and all(recs[c]["status"] == "crash" for c in small), recs
    assert all(r["status"] == "pass" for c, r in recs.items() if c not in small), recs


def test_a_fixed_array_of_per_thread_states_is_caught_by_a_server_thread_count(tmp_path):
    """online_sdpa.c with a key split per thread (flash-decoding over n_threads) and the
    partial states in a 16-entry array: right up to 16 threads, every case before the
    server thread counts asked for at most 3, and the 64-thread cases overflow it."""
    src = EXAMPLE_KERNEL.with_name("online_sdpa.c").read_text()
    for old, new in (
            ("#define SPLITS 2", "#define MAX_SPLITS 16"),
            ("  float *buf = malloc(", "  const int SPLITS = a->n_threads > 1 ? a->n_threads : 2;"
                                     "\n  float *buf = malloc("),
            ("  row_state part[SPLITS];", "  row_state part[MAX_SPLITS];")):
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    recs = cli_records(tmp_path, "splits16.c", src, "threads-")
    bad = {c for c, r in recs.items() if r["status"] != "pass"}
    assert bad == {c for c in recs if c.endswith("-t64")} and len(bad) == 3, recs


SPINNING_HELPER = """#include <pthread.h>
#include <stdatomic.h>
static atomic_int stop_;
static void *spin_(void *x) { while (!atomic_load(&stop_)) { } return x; }
static int forward_(const sdpa_args *a);
int sdpa_forward(const sdpa_args *a) {  /* a worker that spins while the caller computes */
  pthread_t th;
  atomic_store(&stop_, 0);
  if (pthread_create(&th, NULL, spin_, NULL)) return SDPA_INVALID;
  int r = forward_(a);
  atomic_store(&stop_, 1);
  pthread_join(th, NULL);
  return r;
}
static int forward_("""


def test_a_kernel_that_keeps_a_second_thread_at_work_with_one_thread_given(tmp_path):
    """n_threads = 1 and a worker spinning beside the computing caller (threads started
    regardless of n_threads, a pool that spins): right answers, two threads at work. The
    same kernel given 2 passes, with two such workers it does not, and the built-in
    kernels pass."""
    import os

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: a second thread cannot be at work beside the caller")
    k = tmp_path / "spin.c"
    k.write_text(SRC.replace("int sdpa_forward(", SPINNING_HELPER, 1))
    backend = NativeBackend("spin", load_user_kernel(k))
    case = Case("bug", kv_len=2100, n_heads=8, n_kv_heads=2)
    rec = run_one(backend, case, prepare_case(case))
    assert rec["status"] == "fail" and "kept more than the one thread it was given" in \
        rec["reason"], rec
    two = Case("bug", kv_len=2100, n_heads=8, n_kv_heads=2, n_threads=2)
    assert run_one(backend, two, prepare_case(two))["status"] == "pass"  # (2 at work)
    k3 = tmp_path / "spin2.c"  # two spinning workers beside the caller: 3 given 2
    k3.write_text(SRC.replace("int sdpa_forward(", SPINNING_HELPER.replace(
        "pthread_t th;", "pthread_t th, th2;").replace(
        "if (pthread_create(&th, NULL, spin_, NULL)) return SDPA_INVALID;",
        "if (pthread_create(&th, NULL, spin_, NULL)) return SDPA_INVALID;\n"
        "  if (pthread_create(&th2, NULL, spin_, NULL)) return SDPA_INVALID;").replace(
        "pthread_join(th, NULL);", "pthread_join(th, NULL);\n  pthread_join(th2, NULL);"), 1))
    rec = run_one(NativeBackend("spin2", load_user_kernel(k3)), two, prepare_case(two))
    assert rec["status"] == "fail" and "more than the 2 threads it was given" in rec["reason"]
    for name in ("flash", "decomposed"):
        assert run_one(NativeBackend(name), case, prepare_case(case))["status"] == "pass"


def test_the_pool_wakes_only_the_workers_a_call_was_given():
    """One 64-thread call grew the pool to its full size; every later 2-thread call then
    woke all its workers, each spinning a while: up to 15 threads runnable, the call 3.8x
    slower (310 -> 1,178 us at 32 heads, kv 4097, here), and probe check failed 6 cases of
    the full suite by its thread sampling."""
    import os

    from sdpa_probe.judge.probes import thread_use

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: a second thread cannot be at work beside the caller")
    wide = Case("threads", q_len=1, kv_len=1030, n_heads=8, n_kv_heads=2, n_threads=64)
    assert run_one(NativeBackend("flash"), wide, prepare_case(wide))["status"] == "pass"
    two = Case("threads", q_len=1, kv_len=4097, n_heads=32, n_kv_heads=8, n_threads=2)
    prep = prepare_case(two)
    use = thread_use(NativeBackend("flash"), prep.data, out_buffer(two), limit=2)
    assert use is None or use["busy"] < 0.5, use


FTZ_ON = "_mm_setcsr(_mm_getcsr() | 0x8040); /* FTZ + DAZ */\n  int st = sdpa_validate_args(a);"


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="MXCSR is x86's")
@pytest.mark.parametrize("restore", [False, True], ids=["left-on", "restored"])
def test_flush_to_zero_must_be_restored(tmp_path, restore):
    """FTZ / DAZ switched on for speed: an error only if the caller gets it back so.
    Either way the harness puts the environment back for the cases after."""
    src = "#include <xmmintrin.h>\n" + SRC.replace("int st = sdpa_validate_args(a);", FTZ_ON)
    if restore:
        src = src.replace("int sdpa_forward(const sdpa_args *a) {",
                          "static int forward_(const sdpa_args *a);\n"
                          "int sdpa_forward(const sdpa_args *a) {\n"
                          "  unsigned csr = _mm_getcsr();\n  int r = forward_(a);\n"
                          "  _mm_setcsr(csr);\n  return r;\n}\n"
                          "static int forward_(const sdpa_args *a) {")
    path = tmp_path / f"ftz_{restore}.c"
    path.write_text(src)
    case = Case("bug", kv_len=20)
    before = native.fp_control()
    rec = run_one(NativeBackend("ftz", load_user_kernel(path)), case, prepare_case(case))
    assert native.fp_control() == before
    if restore:
        assert rec["status"] == "pass", rec
    else:
        assert rec["status"] == "fail"
        assert "flush-to-zero on" in rec["reason"] and "denormals-are-zero on" in rec["reason"]


def test_fp_change_is_described_in_words():
    msg = native.describe_fp_change(0x037F << 32 | 0x1F80, 0x037F << 32 | 0x5F80)
    if platform.machine() in ("x86_64", "AMD64"):
        assert "rounding to nearest -> up" in msg and "0x1f80 -> 0x5f80" in msg
