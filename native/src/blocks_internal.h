/* Helpers shared by blocks*.c and decode_step.c (not part of any ABI). */
#ifndef SDPA_PROBE_BLOCKS_INTERNAL_H
#define SDPA_PROBE_BLOCKS_INTERNAL_H

#include "common.h"
#include "sdpa_probe_blocks.h"

#if defined(__FMA__) || defined(__F16C__)
#include <immintrin.h>
#endif

/* a * b + c, fused when the target has FMA (-std=c11 turns contraction off). */
SDPA_INLINE v8f blk_fma(v8f a, v8f b, v8f c) {
#ifdef __FMA__
  return (v8f)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  return a * b + c;
#endif
}

/* 8 binary16 values at p as floats. */
SDPA_INLINE v8f blk_load_f16(const uint16_t *p) {
#ifdef SDPA_HAVE_F16C
  return (v8f)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
  v8f r;
  for (int i = 0; i < 8; i++) r[i] = sdpa_f16_to_f32(p[i]);
  return r;
#endif
}

SDPA_INLINE void blk_store_f16(uint16_t *p, v8f x) {
#ifdef SDPA_HAVE_F16C
  _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph((__m256)x, _MM_FROUND_TO_NEAREST_INT));
#else
  for (int i = 0; i < 8; i++) p[i] = sdpa_f32_to_f16(x[i]);
#endif
}

SDPA_INLINE int blk_threads(int32_t n) {
  if (n <= 0) n = sdpa_probe_default_threads();
  if (n > SDPA_PROBE_MAX_THREADS) n = SDPA_PROBE_MAX_THREADS;
  return n;
}

/* Below this many elements of work an op runs on the calling thread. */
#define BLK_PAR_MIN 16384

/* Tasks [0, n_tasks) of fn: on the pool, or one after another on the calling
 * thread when one thread is asked for or `work` (elements) is under `min_work`. */
SDPA_INLINE void blk_run(int nt, int64_t work, int64_t min_work, int64_t n_tasks,
                         sdpa_probe_task_fn fn, void *ctx) {
  if (nt == 1 || work < min_work) {
    for (int64_t t = 0; t < n_tasks; t++) fn(ctx, t, 0);
  } else {
    sdpa_probe_parallel_for(nt, n_tasks, fn, ctx);
  }
}

/* Size checks: n >= 0 and a * b fits. */
SDPA_INLINE int blk_mul_ok(int64_t a, int64_t b) {
  return a >= 0 && b >= 0 && (a == 0 || b <= INT64_MAX / a);
}

#endif
