/* Decode building blocks, part 1: RMSNorm, GEMV (F32 / F16 weights), residual
 * add, SiLU-gate, F16 <-> F32 casts. See include/sdpa_probe_blocks.h. */
#include <math.h>

#include "blocks_internal.h"

/* ---- RMSNorm ----------------------------------------------------------- */

static void rmsnorm_row(const float *x, const float *w, float *y, int64_t n, float eps) {
  v8f s0 = v8f_set1(0.f), s1 = s0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    v8f a = v8f_load(x + i), b = v8f_load(x + i + 8);
    s0 = blk_fma(a, a, s0);
    s1 = blk_fma(b, b, s1);
  }
  for (; i + 8 <= n; i += 8) {
    v8f a = v8f_load(x + i);
    s0 = blk_fma(a, a, s0);
  }
  double ss = (double)v8f_hsum(s0 + s1);
  for (; i < n; i++) ss += (double)x[i] * x[i];
  float r = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
  v8f vr = v8f_set1(r);
  i = 0;
  for (; i + 8 <= n; i += 8) v8f_store(y + i, v8f_load(x + i) * vr * v8f_load(w + i));
  for (; i < n; i++) y[i] = x[i] * r * w[i];
}

int sdpa_probe_rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t n,
                       float eps) {
  if (rows < 0 || n < 0 || !blk_mul_ok(rows, n) || !(eps >= 0.0f) || isinf(eps))
    return SDPA_INVALID;
  if (rows == 0 || n == 0) return SDPA_OK;
  if (!x || !w || !y) return SDPA_INVALID;
  for (int64_t r = 0; r < rows; r++) rmsnorm_row(x + r * n, w, y + r * n, n, eps);
  return SDPA_OK;
}

/* ---- residual add, SiLU-gate ------------------------------------------- */

int sdpa_probe_residual_add(float *x, const float *r, int64_t n) {
  if (n < 0) return SDPA_INVALID;
  if (n == 0) return SDPA_OK;
  if (!x || !r) return SDPA_INVALID;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) v8f_store(x + i, v8f_load(x + i) + v8f_load(r + i));
  for (; i < n; i++) x[i] += r[i];
  return SDPA_OK;
}

typedef struct {
  const float *gate, *up;
  float *out;
  int64_t n, chunk;
} silu_ctx;

static void silu_range(const float *g, const float *u, float *o, int64_t n) {
  const v8f one = v8f_set1(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v8f x = v8f_load(g + i);
    v8f s = x / (one + v8f_exp(-x));
    v8f_store(o + i, s * v8f_load(u + i));
  }
  for (; i < n; i++) {
    float x = g[i];
    o[i] = x / (1.0f + expf(-x)) * u[i];
  }
}

static void silu_task(void *vc, int64_t t, int thread) {
  silu_ctx *c = (silu_ctx *)vc;
  (void)thread;
  int64_t i0 = t * c->chunk, i1 = i0 + c->chunk < c->n ? i0 + c->chunk : c->n;
  silu_range(c->gate + i0, c->up + i0, c->out + i0, i1 - i0);
}

int sdpa_probe_silu_gate(const float *gate, const float *up, float *out, int64_t n,
                         int32_t n_threads) {
  if (n < 0) return SDPA_INVALID;
  if (n == 0) return SDPA_OK;
  if (!gate || !up || !out) return SDPA_INVALID;
  int nt = blk_threads(n_threads);
  if (nt == 1 || n < BLK_PAR_MIN) {
    silu_range(gate, up, out, n);
    return SDPA_OK;
  }
  silu_ctx c = {gate, up, out, n, 0};
  c.chunk = ((n + 2 * nt - 1) / (2 * nt) + 7) & ~(int64_t)7;
  sdpa_probe_parallel_for(nt, (n + c.chunk - 1) / c.chunk, silu_task, &c);
  return SDPA_OK;
}

/* ---- casts ------------------------------------------------------------- */

typedef struct {
  const void *src;
  void *dst;
  int64_t n, chunk;
  int to_f16;
} cast_ctx;

static void cast_h2f(const uint16_t *s, float *d, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    v8f_store(d + i, blk_load_f16(s + i));
    v8f_store(d + i + 8, blk_load_f16(s + i + 8));
  }
  for (; i + 8 <= n; i += 8) v8f_store(d + i, blk_load_f16(s + i));
  for (; i < n; i++) d[i] = sdpa_f16_to_f32(s[i]);
}

static void cast_f2h(const float *s, uint16_t *d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) blk_store_f16(d + i, v8f_load(s + i));
  for (; i < n; i++) d[i] = sdpa_f32_to_f16(s[i]);
}

static void cast_task(void *vc, int64_t t, int thread) {
  cast_ctx *c = (cast_ctx *)vc;
  (void)thread;
  int64_t i0 = t * c->chunk, i1 = i0 + c->chunk < c->n ? i0 + c->chunk : c->n;
  if (c->to_f16) cast_f2h((const float *)c->src + i0, (uint16_t *)c->dst + i0, i1 - i0);
  else cast_h2f((const uint16_t *)c->src + i0, (float *)c->dst + i0, i1 - i0);
}

static int cast_run(const void *src, void *dst, int64_t n, int32_t n_threads, int to_f16) {
  if (n < 0) return SDPA_INVALID;
  if (n == 0) return SDPA_OK;
  if (!src || !dst) return SDPA_INVALID;
  cast_ctx c = {src, dst, n, n, to_f16};
  int nt = blk_threads(n_threads);
  if (nt == 1 || n < 4 * BLK_PAR_MIN) {
    cast_task(&c, 0, 0);
    return SDPA_OK;
  }
  c.chunk = ((n + 2 * nt - 1) / (2 * nt) + 15) & ~(int64_t)15;
  sdpa_probe_parallel_for(nt, (n + c.chunk - 1) / c.chunk, cast_task, &c);
  return SDPA_OK;
}

int sdpa_probe_cast_f16_f32(const uint16_t *src, float *dst, int64_t n, int32_t n_threads) {
  return cast_run(src, dst, n, n_threads, 0);
}

int sdpa_probe_cast_f32_f16(const float *src, uint16_t *dst, int64_t n, int32_t n_threads) {
  return cast_run(src, dst, n, n_threads, 1);
}

/* ---- GEMV ---------------------------------------------------------------
 * Four output rows at a time share each load of x; two accumulators per row
 * give eight independent FMA chains. Tasks are blocks of rows. */

#define GEMV_ROWS_PER_TASK 32

typedef struct {
  const void *w;
  const float *x;
  float *y;
  int64_t out, in;
} gemv_ctx;

/* Weight element i of a row as 8 floats / as one float: F32 or F16 storage.
 * `f16` is a compile-time constant in each caller, so the branch folds away. */
SDPA_INLINE v8f gemv_wload8(const void *w, int64_t i, int f16) {
  return f16 ? blk_load_f16((const uint16_t *)w + i) : v8f_load((const float *)w + i);
}
SDPA_INLINE float gemv_wload1(const void *w, int64_t i, int f16) {
  return f16 ? sdpa_f16_to_f32(((const uint16_t *)w)[i]) : ((const float *)w)[i];
}

/* y[r0:r1] = W[r0:r1] x, four rows at a time with two accumulators per row. */
SDPA_INLINE void gemv_rows(const void *w, int f16, const float *x, float *y, int64_t r0,
                           int64_t r1, int64_t in) {
  const int64_t es = f16 ? 2 : 4;
  const char *wb = (const char *)w;
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    const void *w0 = wb + r * in * es, *w1 = wb + (r + 1) * in * es;
    const void *w2 = wb + (r + 2) * in * es, *w3 = wb + (r + 3) * in * es;
    v8f a0 = v8f_set1(0.f), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    int64_t i = 0;
    for (; i + 16 <= in; i += 16) {
      v8f x0 = v8f_load(x + i), x1 = v8f_load(x + i + 8);
      a0 = blk_fma(gemv_wload8(w0, i, f16), x0, a0);
      a1 = blk_fma(gemv_wload8(w1, i, f16), x0, a1);
      a2 = blk_fma(gemv_wload8(w2, i, f16), x0, a2);
      a3 = blk_fma(gemv_wload8(w3, i, f16), x0, a3);
      b0 = blk_fma(gemv_wload8(w0, i + 8, f16), x1, b0);
      b1 = blk_fma(gemv_wload8(w1, i + 8, f16), x1, b1);
      b2 = blk_fma(gemv_wload8(w2, i + 8, f16), x1, b2);
      b3 = blk_fma(gemv_wload8(w3, i + 8, f16), x1, b3);
    }
    for (; i + 8 <= in; i += 8) {
      v8f x0 = v8f_load(x + i);
      a0 = blk_fma(gemv_wload8(w0, i, f16), x0, a0);
      a1 = blk_fma(gemv_wload8(w1, i, f16), x0, a1);
      a2 = blk_fma(gemv_wload8(w2, i, f16), x0, a2);
      a3 = blk_fma(gemv_wload8(w3, i, f16), x0, a3);
    }
    float s0 = v8f_hsum(a0 + b0), s1 = v8f_hsum(a1 + b1);
    float s2 = v8f_hsum(a2 + b2), s3 = v8f_hsum(a3 + b3);
    for (; i < in; i++) {
      s0 += gemv_wload1(w0, i, f16) * x[i];
      s1 += gemv_wload1(w1, i, f16) * x[i];
      s2 += gemv_wload1(w2, i, f16) * x[i];
      s3 += gemv_wload1(w3, i, f16) * x[i];
    }
    y[r] = s0;
    y[r + 1] = s1;
    y[r + 2] = s2;
    y[r + 3] = s3;
  }
  for (; r < r1; r++) {
    const void *wr = wb + r * in * es;
    v8f a = v8f_set1(0.f);
    int64_t i = 0;
    for (; i + 8 <= in; i += 8) a = blk_fma(gemv_wload8(wr, i, f16), v8f_load(x + i), a);
    float s = v8f_hsum(a);
    for (; i < in; i++) s += gemv_wload1(wr, i, f16) * x[i];
    y[r] = s;
  }
}

static void gemv_f32_rows(const float *w, const float *x, float *y, int64_t r0, int64_t r1,
                          int64_t in) {
  gemv_rows(w, 0, x, y, r0, r1, in);
}

static void gemv_f16_rows(const uint16_t *w, const float *x, float *y, int64_t r0, int64_t r1,
                          int64_t in) {
  gemv_rows(w, 1, x, y, r0, r1, in);
}

static void gemv_f32_task(void *vc, int64_t t, int thread) {
  gemv_ctx *c = (gemv_ctx *)vc;
  (void)thread;
  int64_t r0 = t * GEMV_ROWS_PER_TASK;
  int64_t r1 = r0 + GEMV_ROWS_PER_TASK < c->out ? r0 + GEMV_ROWS_PER_TASK : c->out;
  gemv_f32_rows((const float *)c->w, c->x, c->y, r0, r1, c->in);
}

static void gemv_f16_task(void *vc, int64_t t, int thread) {
  gemv_ctx *c = (gemv_ctx *)vc;
  (void)thread;
  int64_t r0 = t * GEMV_ROWS_PER_TASK;
  int64_t r1 = r0 + GEMV_ROWS_PER_TASK < c->out ? r0 + GEMV_ROWS_PER_TASK : c->out;
  gemv_f16_rows((const uint16_t *)c->w, c->x, c->y, r0, r1, c->in);
}

static int gemv_run(const void *w, const float *x, float *y, int64_t out, int64_t in,
                    int32_t n_threads, sdpa_probe_task_fn fn) {
  if (out < 0 || in < 0 || !blk_mul_ok(out, in)) return SDPA_INVALID;
  if (out == 0) return SDPA_OK;
  if (!y || (in > 0 && (!w || !x))) return SDPA_INVALID;
  if (in == 0) {
    memset(y, 0, (size_t)out * sizeof(float));
    return SDPA_OK;
  }
  gemv_ctx c = {w, x, y, out, in};
  int64_t n_tasks = (out + GEMV_ROWS_PER_TASK - 1) / GEMV_ROWS_PER_TASK;
  blk_run(blk_threads(n_threads), out * in, BLK_PAR_MIN, n_tasks, fn, &c);
  return SDPA_OK;
}

int sdpa_probe_gemv_f32(const float *w, const float *x, float *y, int64_t out, int64_t in,
                        int32_t n_threads) {
  return gemv_run(w, x, y, out, in, n_threads, gemv_f32_task);
}

int sdpa_probe_gemv_f16(const uint16_t *w, const float *x, float *y, int64_t out, int64_t in,
                        int32_t n_threads) {
  return gemv_run(w, x, y, out, in, n_threads, gemv_f16_task);
}
