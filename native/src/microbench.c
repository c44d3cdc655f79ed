/* Machine micro-benchmarks for `probe info`: streaming read bandwidth and
 * peak F32 FMA throughput. See include/sdpa_probe_machine.h. */
#define _POSIX_C_SOURCE 200809L
#include <time.h>

#include "common.h"
#include "sdpa_probe_machine.h"

#if defined(SDPA_HAVE_AVX512)
/* the width the AVX-512 kernels (flash_x512_block.h) compute in */
typedef __m512 mb_vec;
#define MB_LANES 16
#define MB_CHAINS 24 /* 32 zmm registers: 24 accumulators + multiplier + addend */
#define MB_FUSED 1
#define MB_FMA(a, m, k) _mm512_fmadd_ps((a), (m), (k))
#define MB_SET1(x) _mm512_set1_ps(x)
#elif defined(__FMA__) && defined(__AVX__)
#include <immintrin.h>
typedef __m256 mb_vec;
#define MB_LANES 8
#define MB_CHAINS 12 /* 16 ymm registers: 12 accumulators + multiplier + addend */
#define MB_FUSED 1
#define MB_FMA(a, m, k) _mm256_fmadd_ps((a), (m), (k))
#define MB_SET1(x) _mm256_set1_ps(x)
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
typedef float32x4_t mb_vec;
#define MB_LANES 4
#define MB_CHAINS 24 /* 32 q registers */
#define MB_FUSED 1
#define MB_FMA(a, m, k) vfmaq_f32((k), (a), (m))
#define MB_SET1(x) vdupq_n_f32(x)
#else
/* No fused multiply-add the compiler is sure to emit under -std=c11 (which
 * turns off contraction): a separate multiply and add, still 2 flops. */
typedef v8f mb_vec;
#define MB_LANES 8
#define MB_CHAINS 12
#define MB_FUSED 0
#define MB_FMA(a, m, k) ((a) * (m) + (k))
#define MB_SET1(x) v8f_set1(x)
#endif

#define MB_FMA_TASKS_PER_THREAD 8
#define MB_CHUNK_BYTES ((int64_t)1 << 20)
#define MB_AUTO_PASS_BYTES ((int64_t)64 << 20)
#define MB_LINE_FLOATS 64 /* floats per inner-loop step: 256 bytes, 8 vectors */

/* Per-thread result sinks, padded to a cache line, so that no load or FMA
 * can be dropped and threads do not share a line. */
typedef struct {
  double v;
  char pad[56];
} mb_sink;

static volatile double g_mb_sink;

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs fn over n_tasks once untimed (wakes the pool, clocks, vector unit), then
 * reps timed times into times[]; returns the wall time of the whole. */
static double time_reps(int nt, int64_t n_tasks, sdpa_probe_task_fn fn, void *ctx, int64_t reps,
                        double *times) {
  double t_start = now_seconds();
  sdpa_probe_parallel_for(nt, n_tasks, fn, ctx);
  for (int64_t r = 0; r < reps; r++) {
    double t0 = now_seconds();
    sdpa_probe_parallel_for(nt, n_tasks, fn, ctx);
    times[r] = now_seconds() - t0;
  }
  return now_seconds() - t_start;
}

static int resolve_threads(int32_t n_threads) {
  int n = n_threads > 0 ? (int)n_threads : sdpa_probe_default_threads();
  if (n > SDPA_PROBE_MAX_THREADS) n = SDPA_PROBE_MAX_THREADS;
  return n < 1 ? 1 : n;
}

static void sort_doubles(double *x, int64_t n) { /* insertion sort: n <= 256 */
  for (int64_t i = 1; i < n; i++) {
    double v = x[i];
    int64_t j = i - 1;
    while (j >= 0 && x[j] > v) {
      x[j + 1] = x[j];
      j--;
    }
    x[j + 1] = v;
  }
}

/* Fill out from per-repetition times (sorted here). */
static void summarise(double *times, int64_t reps, double work, double total,
                      int n_threads, sdpa_probe_mb_result *out) {
  sort_doubles(times, reps);
  double best = times[0] > 0 ? times[0] : 1e-9;
  double worst = times[reps - 1] > 0 ? times[reps - 1] : 1e-9;
  double med = reps % 2 ? times[reps / 2] : 0.5 * (times[reps / 2 - 1] + times[reps / 2]);
  if (med <= 0) med = 1e-9;
  out->best = work / best;
  out->median = work / med;
  out->worst = work / worst;
  out->best_seconds = times[0];
  out->total_seconds = total;
  out->work = (int64_t)work;
  out->reps = reps;
  out->n_threads = n_threads;
}

/* ---- read bandwidth --------------------------------------------------- */

struct sdpa_probe_mb_buffer {
  float *data;
  int64_t n_floats; /* a multiple of MB_LINE_FLOATS */
};

typedef struct {
  float *data;
  int64_t n_floats;
  int64_t chunk_floats; /* a multiple of MB_LINE_FLOATS */
  int64_t n_chunks;
  mb_sink sink[SDPA_PROBE_MAX_THREADS];
} read_ctx;

static void chunk_range(const read_ctx *c, int64_t chunk, int64_t *lo, int64_t *n) {
  *lo = chunk * c->chunk_floats;
  int64_t left = c->n_floats - *lo;
  *n = left < c->chunk_floats ? left : c->chunk_floats;
}

static void touch_task(void *vctx, int64_t task, int thread) {
  (void)thread;
  read_ctx *c = vctx;
  int64_t lo, n;
  chunk_range(c, task, &lo, &n);
  /* a non-zero pattern, so no page stays a shared zero page */
  const v8f pat = {1.0f, 0.5f, 0.25f, 0.125f, 1.0f, 0.5f, 0.25f, 0.125f};
  for (int64_t i = 0; i < n; i += 8) *(v8f *)(c->data + lo + i) = pat;
}

static void read_task(void *vctx, int64_t task, int thread) {
  read_ctx *c = vctx;
  int64_t lo, n;
  chunk_range(c, task % c->n_chunks, &lo, &n);
  const float *p = c->data + lo;
  v8f s0 = v8f_set1(0.0f), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
  for (int64_t i = 0; i < n; i += MB_LINE_FLOATS) {
    const v8f *q = (const v8f *)(p + i);
    s0 += q[0];
    s1 += q[1];
    s2 += q[2];
    s3 += q[3];
    s4 += q[4];
    s5 += q[5];
    s6 += q[6];
    s7 += q[7];
  }
  v8f s = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));
  c->sink[thread].v += (double)v8f_hsum(s);
}

static void read_ctx_init(read_ctx *c, const sdpa_probe_mb_buffer *b, int n_threads) {
  memset(c, 0, sizeof *c);
  c->data = b->data;
  c->n_floats = b->n_floats;
  int64_t chunk = MB_CHUNK_BYTES / (int64_t)sizeof(float);
  int64_t per_thread = b->n_floats / n_threads;
  if (per_thread < chunk) chunk = per_thread;
  chunk -= chunk % MB_LINE_FLOATS;
  if (chunk < MB_LINE_FLOATS) chunk = MB_LINE_FLOATS;
  c->chunk_floats = chunk;
  c->n_chunks = (b->n_floats + chunk - 1) / chunk;
}

int sdpa_probe_mb_buffer_new(int64_t bytes, int32_t n_threads, sdpa_probe_mb_buffer **out) {
  if (out == NULL) return SDPA_PROBE_MB_EINVAL;
  *out = NULL;
  if (bytes < 4096 || bytes > ((int64_t)1 << 46)) return SDPA_PROBE_MB_EINVAL;
  int64_t rounded = sdpa_probe_align_up(bytes, MB_LINE_FLOATS * (int64_t)sizeof(float));
  if (rounded < 0) return SDPA_PROBE_MB_EINVAL;
  sdpa_probe_mb_buffer *b = sdpa_probe_malloc((int64_t)sizeof *b);
  if (b == NULL) return SDPA_PROBE_MB_ENOMEM;
  b->data = sdpa_probe_malloc(rounded);
  if (b->data == NULL) {
    sdpa_probe_free(b);
    return SDPA_PROBE_MB_ENOMEM;
  }
  b->n_floats = rounded / (int64_t)sizeof(float);
  int nt = resolve_threads(n_threads);
  read_ctx *c = sdpa_probe_malloc((int64_t)sizeof *c);
  if (c == NULL) {
    sdpa_probe_free(b->data);
    sdpa_probe_free(b);
    return SDPA_PROBE_MB_ENOMEM;
  }
  read_ctx_init(c, b, nt);
  sdpa_probe_parallel_for(nt, c->n_chunks, touch_task, c);
  sdpa_probe_free(c);
  *out = b;
  return SDPA_PROBE_MB_OK;
}

void sdpa_probe_mb_buffer_free(sdpa_probe_mb_buffer *buf) {
  if (buf == NULL) return;
  sdpa_probe_free(buf->data);
  sdpa_probe_free(buf);
}

int64_t sdpa_probe_mb_buffer_bytes(const sdpa_probe_mb_buffer *buf) {
  return buf == NULL ? -1 : buf->n_floats * (int64_t)sizeof(float);
}

int sdpa_probe_mb_read(sdpa_probe_mb_buffer *buf, int32_t n_threads, int64_t passes,
                       int64_t reps, sdpa_probe_mb_result *out) {
  if (buf == NULL || out == NULL || buf->data == NULL) return SDPA_PROBE_MB_EINVAL;
  if (reps < 1 || reps > SDPA_PROBE_MB_MAX_REPS) return SDPA_PROBE_MB_EINVAL;
  memset(out, 0, sizeof *out);
  int64_t bytes = buf->n_floats * (int64_t)sizeof(float);
  if (passes <= 0) passes = (MB_AUTO_PASS_BYTES + bytes - 1) / bytes;
  if (passes > ((int64_t)1 << 40) / bytes + 1) return SDPA_PROBE_MB_EINVAL; /* > 1 TiB per rep */
  int nt = resolve_threads(n_threads);
  read_ctx *c = sdpa_probe_malloc((int64_t)sizeof *c);
  if (c == NULL) return SDPA_PROBE_MB_ENOMEM;
  read_ctx_init(c, buf, nt);
  int64_t n_tasks = passes * c->n_chunks;
  double times[SDPA_PROBE_MB_MAX_REPS];
  double total = time_reps(nt, n_tasks, read_task, c, reps, times);
  double sink = 0;
  for (int i = 0; i < SDPA_PROBE_MAX_THREADS; i++) sink += c->sink[i].v;
  g_mb_sink = sink;
  sdpa_probe_free(c);
  summarise(times, reps, (double)bytes * (double)passes, total, nt, out);
  return SDPA_PROBE_MB_OK;
}

/* ---- FMA throughput --------------------------------------------------- */

typedef struct {
  int64_t iters;
  float init, step, mul, add;
  mb_sink sink[SDPA_PROBE_MAX_THREADS];
} fma_ctx;

#define MB_REPEAT12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

static void fma_task(void *vctx, int64_t task, int thread) {
  fma_ctx *c = vctx;
  const mb_vec m = MB_SET1(c->mul), k = MB_SET1(c->add);
  const float base = c->init + (float)(task & 15) * c->step;
  /* chains start apart (runtime values), so none can be merged with another */
#define DECL(j) mb_vec a##j = MB_SET1(base + (float)(j) * c->step);
#define STEP(j) a##j = MB_FMA(a##j, m, k);
  /* sum the chains in registers (taking their addresses would spill them) */
#define ADD(j) t = t + a##j;
#if MB_CHAINS == 12
  MB_REPEAT12(DECL)
  for (int64_t i = 0; i < c->iters; i++) {
    MB_REPEAT12(STEP)
  }
  mb_vec t = MB_SET1(0.0f);
  MB_REPEAT12(ADD)
#elif MB_CHAINS == 24
#define DECL2(j) DECL(j) mb_vec a##j##_b = MB_SET1(base + (float)((j) + 12) * c->step);
#define STEP2(j) STEP(j) a##j##_b = MB_FMA(a##j##_b, m, k);
#define ADD2(j) ADD(j) t = t + a##j##_b;
  MB_REPEAT12(DECL2)
  for (int64_t i = 0; i < c->iters; i++) {
    MB_REPEAT12(STEP2)
  }
  mb_vec t = MB_SET1(0.0f);
  MB_REPEAT12(ADD2)
#else
#error "MB_CHAINS must be 12 or 24"
#endif
  float lanes[MB_LANES];
  memcpy(lanes, &t, sizeof lanes);
  double s = 0;
  for (int i = 0; i < MB_LANES; i++) s += lanes[i];
  c->sink[thread].v += s;
}

/* Arguments of the per-thread compute benchmarks (FMA, conversion). */
static int per_thread_args_ok(int64_t iters_per_thread, int64_t reps,
                              const sdpa_probe_mb_result *out) {
  return out != NULL && reps >= 1 && reps <= SDPA_PROBE_MB_MAX_REPS &&
         iters_per_thread >= MB_FMA_TASKS_PER_THREAD && iters_per_thread <= ((int64_t)1 << 40);
}

/* Runs MB_FMA_TASKS_PER_THREAD tasks of `iters` steps per thread, `reps` times;
 * work per step `per_step` (flops, elements); the sinks keep the results live. */
static void run_per_thread(int nt, sdpa_probe_task_fn fn, void *ctx, const mb_sink *sink,
                           int64_t iters, double per_step, int64_t reps,
                           sdpa_probe_mb_result *out) {
  int64_t n_tasks = (int64_t)nt * MB_FMA_TASKS_PER_THREAD;
  double times[SDPA_PROBE_MB_MAX_REPS];
  double total = time_reps(nt, n_tasks, fn, ctx, reps, times);
  double s = 0;
  for (int i = 0; i < SDPA_PROBE_MAX_THREADS; i++) s += sink[i].v;
  g_mb_sink = s;
  summarise(times, reps, (double)n_tasks * (double)iters * per_step, total, nt, out);
}

int sdpa_probe_mb_fma(int32_t n_threads, int64_t iters_per_thread, int64_t reps,
                      sdpa_probe_mb_result *out) {
  if (!per_thread_args_ok(iters_per_thread, reps, out)) return SDPA_PROBE_MB_EINVAL;
  memset(out, 0, sizeof *out);
  int nt = resolve_threads(n_threads);
  fma_ctx *c = sdpa_probe_malloc((int64_t)sizeof *c);
  if (c == NULL) return SDPA_PROBE_MB_ENOMEM;
  memset(c, 0, sizeof *c);
  c->iters = iters_per_thread / MB_FMA_TASKS_PER_THREAD;
  /* fixed point add / (1 - mul) = 1: values stay normal, never denormal or inf */
  c->init = 0.5f;
  c->step = 1.0f / 64.0f;
  c->mul = 0.999f;
  c->add = 0.001f;
  run_per_thread(nt, fma_task, c, c->sink, c->iters, MB_CHAINS * MB_LANES * 2.0, reps, out);
  sdpa_probe_free(c);
  return SDPA_PROBE_MB_OK;
}

/* ---- conversion throughput -------------------------------------------- */

/* An L1-resident source of every dtype: 4 KiB, walked 256 bytes at a time. */
#define MB_CVT_SRC_BYTES 4096

typedef struct {
  int32_t dtype;
  int64_t iters; /* inner steps per task: 8 vectors of 8 elements each */
  mb_sink sink[SDPA_PROBE_MAX_THREADS];
} cvt_ctx;

/* The kernels' 8-element conversion (sdpa_ld8) of one dtype, each result
 * FMA'd into its own accumulator as a kernel would use it. */
#define MB_CVT_LOOP(DT, ISZ)                                                          \
  for (int64_t i = 0; i < c->iters; i++) {                                            \
    const char *p = src + (i & (MB_CVT_SRC_BYTES / (64 * (ISZ)) - 1)) * 64 * (ISZ);   \
    a0 = sdpa_ld8(p + 0 * 8 * (ISZ), DT, zp) * w + a0;                                \
    a1 = sdpa_ld8(p + 1 * 8 * (ISZ), DT, zp) * w + a1;                                \
    a2 = sdpa_ld8(p + 2 * 8 * (ISZ), DT, zp) * w + a2;                                \
    a3 = sdpa_ld8(p + 3 * 8 * (ISZ), DT, zp) * w + a3;                                \
    a4 = sdpa_ld8(p + 4 * 8 * (ISZ), DT, zp) * w + a4;                                \
    a5 = sdpa_ld8(p + 5 * 8 * (ISZ), DT, zp) * w + a5;                                \
    a6 = sdpa_ld8(p + 6 * 8 * (ISZ), DT, zp) * w + a6;                                \
    a7 = sdpa_ld8(p + 7 * 8 * (ISZ), DT, zp) * w + a7;                                \
  }

/* LOOP for the benchmark's dtype, each instantiated with its element size. */
#define MB_CVT_DISPATCH(LOOP)       \
  do {                              \
    if (c->dtype == SDPA_F16)       \
      LOOP(SDPA_F16, 2)             \
    else if (c->dtype == SDPA_BF16) \
      LOOP(SDPA_BF16, 2)            \
    else                            \
      LOOP(SDPA_I8, 1)              \
  } while (0)

#ifdef SDPA_HAVE_AVX512
/* The AVX-512 kernels' 16-element conversion (sdpa_ld16), as MB_CVT_LOOP. */
#define MB_CVT_ELEMS 128 /* per step: 8 vectors of 16 */
#define MB_CVT16_LOOP(DT, ISZ)                                                        \
  for (int64_t i = 0; i < c->iters; i++) {                                            \
    const char *p = src + (i & (MB_CVT_SRC_BYTES / (128 * (ISZ)) - 1)) * 128 * (ISZ); \
    _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)                              \
      acc[k] = _mm512_fmadd_ps(sdpa_ld16(p + k * 16 * (ISZ), DT, zp), w, acc[k]);      \
  }
#else
#define MB_CVT_ELEMS 64 /* per step: 8 vectors of 8 */
#endif

static void cvt_task(void *vctx, int64_t task, int thread) {
  cvt_ctx *c = vctx;
  _Alignas(64) char src[MB_CVT_SRC_BYTES];
  for (int i = 0; i < MB_CVT_SRC_BYTES; i += 2) { /* small finite values in every dtype */
    uint16_t h = (uint16_t)(0x3c00u + (uint16_t)((i + task) & 63)); /* F16 in [1, 1.07) */
    memcpy(src + i, &h, 2);
  }
#ifdef SDPA_HAVE_AVX512
  {
    const __m512 w = _mm512_set1_ps(1e-6f);
    const __m512i zp = _mm512_set1_epi32(3);
    __m512 acc[8];
    for (int k = 0; k < 8; k++) acc[k] = _mm512_setzero_ps();
    MB_CVT_DISPATCH(MB_CVT16_LOOP);
    __m512 t = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])),
                             _mm512_add_ps(_mm512_add_ps(acc[4], acc[5]), _mm512_add_ps(acc[6], acc[7])));
    c->sink[thread].v += (double)_mm512_reduce_add_ps(t);
    return;
  }
#endif
  const v8f w = v8f_set1(1e-6f);
  const v8i zp = (v8i){3, 3, 3, 3, 3, 3, 3, 3};
  v8f a0 = v8f_set1(0.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  MB_CVT_DISPATCH(MB_CVT_LOOP);
  v8f t = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
  c->sink[thread].v += (double)v8f_hsum(t);
}

int sdpa_probe_mb_convert(int32_t dtype, int32_t n_threads, int64_t iters_per_thread,
                          int64_t reps, sdpa_probe_mb_result *out) {
  if (!per_thread_args_ok(iters_per_thread, reps, out)) return SDPA_PROBE_MB_EINVAL;
  if (dtype != SDPA_F16 && dtype != SDPA_BF16 && dtype != SDPA_I8) return SDPA_PROBE_MB_EINVAL;
  memset(out, 0, sizeof *out);
  int nt = resolve_threads(n_threads);
  cvt_ctx *c = sdpa_probe_malloc((int64_t)sizeof *c);
  if (c == NULL) return SDPA_PROBE_MB_ENOMEM;
  memset(c, 0, sizeof *c);
  c->dtype = dtype;
  c->iters = iters_per_thread / MB_FMA_TASKS_PER_THREAD;
  run_per_thread(nt, cvt_task, c, c->sink, c->iters, MB_CVT_ELEMS, reps, out);
  sdpa_probe_free(c);
  return SDPA_PROBE_MB_OK;
}

int sdpa_probe_mb_fma_config(int32_t *chains, int32_t *lanes, int32_t *fused) {
  if (chains) *chains = MB_CHAINS;
  if (lanes) *lanes = MB_LANES;
  if (fused) *fused = MB_FUSED;
  return SDPA_PROBE_MB_OK;
}
