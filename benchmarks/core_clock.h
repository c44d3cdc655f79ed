/* Wall time and the core clock for the cycle-counting benchmarks in this directory
 * (block_cycles.c, amx_tile_costs.c). Needs _POSIX_C_SOURCE 200809L or _GNU_SOURCE. */
#ifndef SDPA_PROBE_BENCH_CORE_CLOCK_H
#define SDPA_PROBE_BENCH_CORE_CLOCK_H

#include <stdint.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The core clock: a dependent chain of imul, 3 cycles each on x86 cores. */
static double clock_hz(void) {
  uint64_t x = 12345;
  const long n = 30000000;
  const double t0 = now();
  for (long i = 0; i < n; i++) __asm__ volatile("imul %0, %0" : "+r"(x));
  return 3.0 * (double)n / (now() - t0);
}

#endif
