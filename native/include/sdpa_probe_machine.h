/*
 * sdpa_probe_machine.h -- machine micro-benchmarks behind `probe info`:
 * streaming read bandwidth (DRAM- or cache-resident buffer) and peak F32 FMA
 * throughput, single- or multi-threaded on the library's thread pool.
 *
 * Every function returns a status (0 ok, SDPA_PROBE_MB_EINVAL for bad
 * arguments, SDPA_PROBE_MB_ENOMEM when memory cannot be had) and never aborts.
 * Rates are per second, of the whole machine (not per thread): bytes/s for
 * reads, flop/s for FMA (2 flops per FMA lane). The Python cdef in
 * sdpa_probe/_cdef_machine.py mirrors this file.
 */
#ifndef SDPA_PROBE_MACHINE_H
#define SDPA_PROBE_MACHINE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SDPA_PROBE_MB_OK 0
#define SDPA_PROBE_MB_EINVAL 2
#define SDPA_PROBE_MB_ENOMEM 3
#define SDPA_PROBE_MB_MAX_REPS 256

typedef struct sdpa_probe_mb_result {
  double best;          /* rate of the fastest timed repetition */
  double median;        /* rate of the median repetition */
  double worst;         /* rate of the slowest repetition */
  double best_seconds;  /* wall time of the fastest repetition */
  double total_seconds; /* wall time of the whole call, warm-up included */
  int64_t work;         /* bytes read or flops done per repetition */
  int64_t reps;         /* timed repetitions (one untimed warm-up precedes them) */
  int32_t n_threads;    /* threads asked of the pool */
} sdpa_probe_mb_result;

/* A read buffer, allocated and first-touched (by n_threads threads) once, then
 * read by any number of sdpa_probe_mb_read calls. bytes is rounded up to a
 * multiple of 256; bytes < 4096 is EINVAL. n_threads <= 0: the default. */
typedef struct sdpa_probe_mb_buffer sdpa_probe_mb_buffer;
int sdpa_probe_mb_buffer_new(int64_t bytes, int32_t n_threads, sdpa_probe_mb_buffer **out);
void sdpa_probe_mb_buffer_free(sdpa_probe_mb_buffer *buf);
int64_t sdpa_probe_mb_buffer_bytes(const sdpa_probe_mb_buffer *buf); /* -1 for NULL */

/* Stream-reads the buffer `passes` times per repetition (passes <= 0: enough
 * passes for at least 64 MiB per repetition) with 256-bit loads into eight
 * accumulators; the work is cut into chunks of at most 1 MiB handed out by
 * the pool. out->best is bytes/s. reps in 1..SDPA_PROBE_MB_MAX_REPS. */
int sdpa_probe_mb_read(sdpa_probe_mb_buffer *buf, int32_t n_threads, int64_t passes,
                       int64_t reps, sdpa_probe_mb_result *out);

/* Runs `iters_per_thread` iterations of SDPA_PROBE_MB_FMA chains independent
 * FMA chains per thread (cut into 8 tasks per thread), repeated `reps` times.
 * out->best is flop/s. */
int sdpa_probe_mb_fma(int32_t n_threads, int64_t iters_per_thread, int64_t reps,
                      sdpa_probe_mb_result *out);

/* Converts an L1-resident buffer of dtype (SDPA_F16, SDPA_BF16 or SDPA_I8,
 * the latter as x - zero_point) to F32 8 elements at a time, with the same
 * conversion the kernels' inner loops use, each result FMA'd into an
 * accumulator: `iters_per_thread` steps of 64 elements per thread. out->best
 * is elements/s. It bounds kernels that convert every K and V element once. */
int sdpa_probe_mb_convert(int32_t dtype, int32_t n_threads, int64_t iters_per_thread,
                          int64_t reps, sdpa_probe_mb_result *out);

/* How the FMA benchmark was compiled: independent chains, lanes per chain
 * (vector width in floats) and whether the multiply-add is a fused
 * instruction (1) or a separate multiply and add (0). */
int sdpa_probe_mb_fma_config(int32_t *chains, int32_t *lanes, int32_t *fused);

#ifdef __cplusplus
}
#endif
#endif
