/* Timing loops for `probe bench`: a kernel called back to back from C, each
 * call timed on its own, so small shapes are not measured through Python's
 * per-call overhead. */
#define _POSIX_C_SOURCE 200809L
#include <time.h>

#include "common.h"

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* fn when it is not NULL, else registered kernel kernel_index */
static int bench_loop(int64_t kernel_index, sdpa_probe_forward_fn fn, const sdpa_args *args,
                      int64_t n_args, int64_t iters, double *seconds_out) {
  if (args == NULL || n_args <= 0 || iters < 0) return SDPA_INVALID;
  for (int64_t i = 0; i < iters; i++) {
    const sdpa_args *a = &args[i % n_args];
    double t0 = now_seconds();
    int st = fn ? fn(a) : sdpa_probe_kernel_forward(kernel_index, a);
    double t1 = now_seconds();
    if (st != SDPA_OK) return st;
    if (seconds_out != NULL) seconds_out[i] = t1 - t0;
  }
  return SDPA_OK;
}

int sdpa_probe_bench_loop(int64_t kernel_index, const sdpa_args *args, int64_t n_args,
                          int64_t iters, double *seconds_out) {
  if (sdpa_probe_kernel_get(kernel_index) == NULL) return SDPA_INVALID;
  return bench_loop(kernel_index, NULL, args, n_args, iters, seconds_out);
}

int sdpa_probe_bench_loop_fn(sdpa_probe_forward_fn fn, const sdpa_args *args, int64_t n_args,
                             int64_t iters, double *seconds_out) {
  if (fn == NULL) return SDPA_INVALID;
  return bench_loop(-1, fn, args, n_args, iters, seconds_out);
}
