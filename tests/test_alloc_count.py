"""Heap allocations per call (sdpa_probe/alloc_count.py): counted in a worker with a
counting malloc preloaded, for any party, exactly."""

from __future__ import annotations

import json

import pytest
from conftest import needs_cxx
from typer.testing import CliRunner

from sdpa_probe import alloc_count, bench
from sdpa_probe.cli import app, bench_cmd

# Every allocation entry point once per (kv head, 32-key block), each written (an unused
# malloc / free pair is the compiler's to drop) and freed; the output zeroed (what is
# counted here is the heap, not the answer).
PER_BLOCK = r"""
#include <stdlib.h>
#include <string.h>
#include "sdpa_probe.h"
int sdpa_forward(const sdpa_args *a) {
  for (int64_t h = 0; h < a->n_kv_heads; h++)
    for (int64_t j = 0; j < a->kv_len; j += 32) {
      void *p = malloc(1000), *c = calloc(10, 100), *m = NULL, *al = aligned_alloc(64, 1024);
      if (posix_memalign(&m, 64, 1000)) return SDPA_INVALID;
      void *all[4] = {p, c, m, al};
      for (int i = 0; i < 4; i++) { /* used, or the compiler drops the pair */
        ((volatile char *)all[i])[0] = 1;
        free(all[i]);
      }
    }
  float *o = (float *)a->out.data;
  for (int64_t i = 0; i < a->batch * a->q_len * a->n_heads * a->head_dim; i++) o[i] = 0.0f;
  return SDPA_OK;
}
"""

# C++: a std::vector per (kv head, 64-key block), as ExecuTorch PR 15610's quantized SDPA had it
PER_BLOCK_CXX = r"""
#include <cstring>
#include <vector>
#include "sdpa_probe.h"
extern "C" int sdpa_forward(const sdpa_args *a) {
  for (int64_t h = 0; h < a->n_kv_heads; h++)
    for (int64_t j = 0; j < a->kv_len; j += 64) {
      std::vector<float> buf(64 * a->head_dim);
      buf[3] = 1.0f;
      asm volatile("" : : "r"(buf.data()) : "memory");
    }
  std::memset(a->out.data, 0, a->batch * a->q_len * a->n_heads * a->head_dim * 4);
  return SDPA_OK;
}
"""

CRASHER = r"""
#include "sdpa_probe.h"
int sdpa_forward(const sdpa_args *a) { (void)a; *(volatile int *)0 = 1; return SDPA_OK; }
"""


def _count(jobs, threads=1):
    counts, why = alloc_count.count(jobs, threads)
    assert why is None, why
    return counts


def test_every_allocation_entry_point_of_a_user_kernel_is_counted_exactly(tmp_path):
    src = tmp_path / "per_block.c"
    src.write_text(PER_BLOCK)
    short, long = (_count([{"shape": f"decode-h4kv2d64-kv{kv}-f32", "party": str(src)}])[0]
                   for kv in (256, 512))
    # 2 kv heads x kv / 32 blocks x 4 allocations, each freed; the bytes asked for
    assert short == {"allocs": 2 * 8 * 4, "bytes": 2 * 8 * 4024, "frees": 2 * 8 * 4,
                     "threads": 0}
    assert long == {"allocs": 2 * 16 * 4, "bytes": 2 * 16 * 4024, "frees": 2 * 16 * 4,
                    "threads": 0}


@needs_cxx
def test_operator_new_of_a_cxx_kernel_is_counted(tmp_path):
    src = tmp_path / "per_block.cpp"
    src.write_text(PER_BLOCK_CXX)
    (r,) = _count([{"shape": "decode-h8kv4d64-kv512-f32", "party": str(src)}])
    assert r == {"allocs": 4 * 8, "bytes": 4 * 8 * 64 * 64 * 4, "frees": 4 * 8, "threads": 0}


def test_per_block_allocation_grows_with_the_context_and_ours_does_not():
    jobs = [{"shape": f"decode-h8kv2d64-kv{kv}-i8", "party": k}
            for k in ("quant_int8_alloc", "quant_int8") for kv in (512, 1024)]
    alloc512, alloc1024, q512, q1024 = _count(jobs, threads=2)
    # ExecuTorch PR 15610's pattern: K and V buffers per kv head and 64-key block
    assert alloc1024["allocs"] - alloc512["allocs"] == 2 * 2 * (1024 - 512) // 64
    assert q512 == q1024 and q512["allocs"] <= 3
    assert q512["frees"] == q512["allocs"]
    assert q512["threads"] == 0  # (its pool is started once, not per call)


# Its workers started and joined on every call, one per kv head (the output zeroed)
THREAD_PER_CALL = r"""
#include <pthread.h>
#include <string.h>
#include "sdpa_probe.h"
static void *work(void *x) { return x; }
int sdpa_forward(const sdpa_args *a) {
  pthread_t th[64];
  int64_t n = a->n_kv_heads < 64 ? a->n_kv_heads : 64;
  for (int64_t h = 0; h < n; h++)
    if (pthread_create(&th[h], NULL, work, NULL)) return SDPA_INVALID;
  for (int64_t h = 0; h < n; h++) pthread_join(th[h], NULL);
  memset(a->out.data, 0, a->batch * a->q_len * a->n_heads * a->head_dim * 4);
  return SDPA_OK;
}
"""


def test_threads_started_per_call_are_counted_and_a_pool_is_not(tmp_path):
    src = tmp_path / "thread_per_call.c"
    src.write_text(THREAD_PER_CALL)
    per_call, pool = _count([{"shape": "decode-h8kv4d64-kv512-f32", "party": str(src)},
                             {"shape": "decode-h8kv4d64-kv512-f32", "party": "flash"}],
                            threads=2)
    assert per_call["threads"] == 4 and pool["threads"] == 0
    notes = bench._thread_start_notes([{"kernel": "t.c", "shape": "s",
                                        "allocs": per_call, "peers": {"flash": {"allocs": pool}}}])
    assert notes == ["t.c starts 4 threads on every call (e.g. s): a thread pool kept "
                     "between calls would not"]
    assert bench_cmd._allocs_cell(per_call).endswith("[yellow]4 threads[/]")


def test_a_crashing_party_is_reported_and_the_rest_still_counted(tmp_path):
    src = tmp_path / "crasher.c"
    src.write_text(CRASHER)
    shape = "decode-h4kv2d64-kv64-f32"
    crashed, after = _count([{"shape": shape, "party": str(src)},
                             {"shape": shape, "party": "flash"}])
    assert "died (SIGSEGV)" in crashed["error"]
    assert after["allocs"] == after["frees"] and after["allocs"] >= 0


def test_an_unsupported_shape_is_an_error_not_a_count():
    (r,) = _count([{"shape": "decode-h4kv2d64-kv64-i8", "party": "flash"}])
    assert "SDPA_UNSUPPORTED" in r["error"]


def test_nothing_is_counted_under_a_preload_of_the_users(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "libasan.so")
    counts, why = alloc_count.count([{"shape": "decode-h4kv2d64-kv64-f32", "party": "flash"}], 1)
    assert counts == [None] and "LD_PRELOAD is set (libasan.so)" in why


def test_bench_reports_allocations_per_call_in_json_and_table(tmp_path):
    args = ["bench", "--shape", "decode-h4kv2d64-kv256-i8", "--kernel", "quant_int8_alloc",
            "--vs", "torch,quant_int8", "--rounds", "1", "--min-time", "0"]
    res = CliRunner().invoke(app, args + ["--json", "-"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    (r,) = doc["results"]
    assert r["allocs"]["allocs"] >= 2 * 2 * 256 // 64      # per block, counted
    assert r["peers"]["quant_int8"]["allocs"]["allocs"] <= 3
    assert r["peers"]["torch"]["allocs"]["allocs"] >= 1     # its output tensor at least
    assert r["peers"][bench.F32_REFERENCE]["allocs"] is None  # (that is flash)
    table = bench_cmd._allocs_table(doc)
    assert [c.header for c in table.cols] == ["shape", "kernel", "kernel allocs",
                                                 "torch allocs", "quant_int8 allocs"]
    res = CliRunner().invoke(app, args + ["--no-allocs", "--json", "-"])
    assert res.exit_code == 0, res.output
    (r,) = json.loads(res.stdout)["results"]
    assert r["allocs"] is None and r["peers"]["torch"]["allocs"] is None


@pytest.mark.parametrize("n,text", [(0, "0"), (2, "2 (4 KiB)"), (1.5, "1.50 (3 KiB)"),
                                    (3, "3 (6 KiB)"), (1.25, "1.25 (2.5 KiB)")])
def test_allocation_cells(n, text):
    assert bench_cmd._allocs_cell({"allocs": n, "bytes": 2048 * n, "frees": n}) == text
