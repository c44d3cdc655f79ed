/* Decode building blocks, part 2: RoPE, the KV cache (linear / ring; F32, F16,
 * int8 per token), and the ops of the decomposed attention graph (GQA
 * broadcast, K packing, QK^T, softmax, PV). See include/sdpa_probe_blocks.h. */
#include <math.h>

#include "blocks_internal.h"

/* ---- RoPE ---------------------------------------------------------------- */

int sdpa_probe_rope_table(float *cos_tab, float *sin_tab, int64_t n_pos, int64_t head_dim,
                          float theta) {
  if (n_pos < 0 || head_dim <= 0 || (head_dim & 1) || !(theta > 0.0f) || isinf(theta) ||
      !blk_mul_ok(n_pos, head_dim))
    return SDPA_INVALID;
  if (n_pos == 0) return SDPA_OK;
  if (!cos_tab || !sin_tab) return SDPA_INVALID;
  const int64_t h = head_dim / 2;
  for (int64_t i = 0; i < h; i++) {
    double inv = pow((double)theta, -2.0 * (double)i / (double)head_dim);
    for (int64_t p = 0; p < n_pos; p++) {
      double a = (double)p * inv;
      cos_tab[p * h + i] = (float)cos(a);
      sin_tab[p * h + i] = (float)sin(a);
    }
  }
  return SDPA_OK;
}

static void rope_head(const float *src, float *dst, int64_t D, const float *c, const float *s,
                      int32_t style) {
  const int64_t h = D / 2;
  if (style == SDPA_PROBE_ROPE_HALF) {
    int64_t i = 0;
    for (; i + 8 <= h; i += 8) {
      v8f x1 = v8f_load(src + i), x2 = v8f_load(src + h + i);
      v8f vc = v8f_load(c + i), vs = v8f_load(s + i);
      v8f_store(dst + i, x1 * vc - x2 * vs);
      v8f_store(dst + h + i, x2 * vc + x1 * vs);
    }
    for (; i < h; i++) {
      float x1 = src[i], x2 = src[h + i];
      dst[i] = x1 * c[i] - x2 * s[i];
      dst[h + i] = x2 * c[i] + x1 * s[i];
    }
  } else {
    for (int64_t i = 0; i < h; i++) {
      float x0 = src[2 * i], x1 = src[2 * i + 1];
      dst[2 * i] = x0 * c[i] - x1 * s[i];
      dst[2 * i + 1] = x1 * c[i] + x0 * s[i];
    }
  }
}

static int rope_args_ok(int64_t n_heads, int64_t head_dim, const float *cos_tab,
                        const float *sin_tab, int64_t n_pos, int32_t style) {
  if (n_heads < 0 || head_dim <= 0 || (head_dim & 1) || n_pos <= 0) return 0;
  if (!cos_tab || !sin_tab) return 0;
  if (style != SDPA_PROBE_ROPE_HALF && style != SDPA_PROBE_ROPE_INTERLEAVED) return 0;
  return blk_mul_ok(n_heads, head_dim) && blk_mul_ok(n_pos, head_dim);
}

int sdpa_probe_rope(float *x, int64_t n_heads, int64_t head_dim, int64_t pos,
                    const float *cos_tab, const float *sin_tab, int64_t n_pos, int32_t style) {
  if (!rope_args_ok(n_heads, head_dim, cos_tab, sin_tab, n_pos, style)) return SDPA_INVALID;
  if (pos < 0 || pos >= n_pos) return SDPA_INVALID;
  if (n_heads == 0) return SDPA_OK;
  if (!x) return SDPA_INVALID;
  const int64_t h = head_dim / 2;
  const float *c = cos_tab + pos * h, *s = sin_tab + pos * h;
  for (int64_t k = 0; k < n_heads; k++) rope_head(x + k * head_dim, x + k * head_dim, head_dim, c, s, style);
  return SDPA_OK;
}

typedef struct {
  const float *src;
  float *dst;
  int64_t len, n_heads, D, pos0, n_pos, rows_per_task;
  const int64_t *positions;
  const float *cos_tab, *sin_tab;
  int32_t style;
  int bad; /* a position out of range */
} rope_win_ctx;

static void rope_win_task(void *vc, int64_t t, int thread) {
  rope_win_ctx *c = (rope_win_ctx *)vc;
  (void)thread;
  const int64_t h = c->D / 2, row = c->n_heads * c->D;
  int64_t j0 = t * c->rows_per_task, j1 = j0 + c->rows_per_task < c->len ? j0 + c->rows_per_task : c->len;
  for (int64_t j = j0; j < j1; j++) {
    int64_t p = c->positions ? c->positions[j] : c->pos0 + j;
    if (p < 0 || p >= c->n_pos) {
      __atomic_store_n(&c->bad, 1, __ATOMIC_RELAXED);
      continue;
    }
    const float *cs = c->cos_tab + p * h, *sn = c->sin_tab + p * h;
    for (int64_t k = 0; k < c->n_heads; k++)
      rope_head(c->src + j * row + k * c->D, c->dst + j * row + k * c->D, c->D, cs, sn, c->style);
  }
}

int sdpa_probe_rope_window(const float *src, float *dst, int64_t len, int64_t n_heads,
                           int64_t head_dim, int64_t pos0, const int64_t *positions,
                           const float *cos_tab, const float *sin_tab, int64_t n_pos,
                           int32_t style, int32_t n_threads) {
  if (!rope_args_ok(n_heads, head_dim, cos_tab, sin_tab, n_pos, style)) return SDPA_INVALID;
  if (len < 0 || !blk_mul_ok(len, n_heads * head_dim)) return SDPA_INVALID;
  if (len == 0 || n_heads == 0) return SDPA_OK;
  if (!src || !dst) return SDPA_INVALID;
  if (!positions && (pos0 < 0 || pos0 > n_pos - len)) return SDPA_INVALID;
  rope_win_ctx c = {src, dst, len, n_heads, head_dim, pos0, n_pos, len, positions,
                    cos_tab, sin_tab, style, 0};
  int nt = blk_threads(n_threads);
  if (nt == 1 || len * n_heads * head_dim < BLK_PAR_MIN) {
    rope_win_task(&c, 0, 0);
  } else {
    c.rows_per_task = (len + 4 * nt - 1) / (4 * nt);
    sdpa_probe_parallel_for(nt, (len + c.rows_per_task - 1) / c.rows_per_task, rope_win_task, &c);
  }
  return c.bad ? SDPA_INVALID : SDPA_OK;
}

/* ---- KV cache ------------------------------------------------------------ */

static int kv_ok(const sdpa_probe_kv_cache *c) {
  if (!c || !c->data) return 0;
  if (c->dtype != SDPA_F32 && c->dtype != SDPA_F16 && c->dtype != SDPA_I8) return 0;
  if (c->capacity <= 0 || c->n_kv_heads <= 0 || c->head_dim <= 0) return 0;
  if (c->ring_size < 0 || c->ring_size > c->capacity) return 0;
  if (c->dtype == SDPA_I8 && !c->scale) return 0;
  return blk_mul_ok(c->capacity, c->n_kv_heads) &&
         blk_mul_ok(c->capacity * c->n_kv_heads, c->head_dim);
}

int64_t sdpa_probe_kv_slot(const sdpa_probe_kv_cache *c, int64_t pos) {
  if (!kv_ok(c) || pos < 0) return -1;
  if (c->ring_size > 0) return pos % c->ring_size;
  return pos < c->capacity ? pos : -1;
}

/* Per-token int8: asymmetric with a zero point (range includes 0), or
 * symmetric (zp = 0) when the cache has no zero-point array. */
static void quant_row(const float *x, int64_t D, int8_t *q, float *scale, int8_t *zp_out) {
  float mn = 0.0f, mx = 0.0f;
  for (int64_t d = 0; d < D; d++) {
    mn = x[d] < mn ? x[d] : mn;
    mx = x[d] > mx ? x[d] : mx;
  }
  float sc;
  int32_t zp = 0;
  if (zp_out) {
    sc = (mx - mn) / 255.0f;
    if (!(sc > 0.0f) || isinf(sc)) sc = 1.0f;
    zp = (int32_t)lrintf(-128.0f - mn / sc);
    zp = zp < -128 ? -128 : (zp > 127 ? 127 : zp);
  } else {
    float amax = -mn > mx ? -mn : mx;
    sc = amax / 127.0f;
    if (!(sc > 0.0f) || isinf(sc)) sc = 1.0f;
  }
  float inv = 1.0f / sc;
  for (int64_t d = 0; d < D; d++) {
    int32_t v = (int32_t)lrintf(x[d] * inv) + zp;
    q[d] = (int8_t)(v < -128 ? -128 : (v > 127 ? 127 : v));
  }
  *scale = sc;
  if (zp_out) *zp_out = (int8_t)zp;
}

int sdpa_probe_kv_write(const sdpa_probe_kv_cache *c, int64_t pos, const float *src) {
  int64_t slot = sdpa_probe_kv_slot(c, pos);
  if (slot < 0 || !src) return SDPA_INVALID;
  const int64_t H = c->n_kv_heads, D = c->head_dim, off = slot * H * D;
  switch (c->dtype) {
    case SDPA_F32:
      memcpy((float *)c->data + off, src, (size_t)(H * D) * sizeof(float));
      break;
    case SDPA_F16: {
      uint16_t *p = (uint16_t *)c->data + off;
      int64_t i = 0, n = H * D;
      for (; i + 8 <= n; i += 8) blk_store_f16(p + i, v8f_load(src + i));
      for (; i < n; i++) p[i] = sdpa_f32_to_f16(src[i]);
      break;
    }
    case SDPA_I8:
      for (int64_t h = 0; h < H; h++)
        quant_row(src + h * D, D, (int8_t *)c->data + off + h * D, c->scale + slot * H + h,
                  c->zero_point ? c->zero_point + slot * H + h : NULL);
      break;
  }
  return SDPA_OK;
}

typedef struct {
  const sdpa_probe_kv_cache *c;
  int64_t slot0, n, per_task;
  float *dst;
} kv_read_ctx;

static void kv_read_task(void *vc, int64_t t, int thread) {
  kv_read_ctx *k = (kv_read_ctx *)vc;
  const sdpa_probe_kv_cache *c = k->c;
  (void)thread;
  const int64_t H = c->n_kv_heads, D = c->head_dim, row = H * D;
  int64_t j0 = t * k->per_task, j1 = j0 + k->per_task < k->n ? j0 + k->per_task : k->n;
  if (j0 >= j1) return;
  int64_t src0 = (k->slot0 + j0) * row, cnt = (j1 - j0) * row;
  float *dst = k->dst + j0 * row;
  switch (c->dtype) {
    case SDPA_F32:
      memcpy(dst, (const float *)c->data + src0, (size_t)cnt * sizeof(float));
      break;
    case SDPA_F16: {
      const uint16_t *s = (const uint16_t *)c->data + src0;
      int64_t i = 0;
      for (; i + 16 <= cnt; i += 16) {
        v8f_store(dst + i, blk_load_f16(s + i));
        v8f_store(dst + i + 8, blk_load_f16(s + i + 8));
      }
      for (; i < cnt; i++) dst[i] = sdpa_f16_to_f32(s[i]);
      break;
    }
    case SDPA_I8: {
      const int8_t *s = (const int8_t *)c->data + src0;
      for (int64_t r = 0; r < (j1 - j0) * H; r++) {
        int64_t qi = (k->slot0 + j0) * H + r;
        float sc = c->scale[qi];
        float zp = c->zero_point ? (float)c->zero_point[qi] : 0.0f;
        const int8_t *q = s + r * D;
        float *o = dst + r * D;
        for (int64_t d = 0; d < D; d++) o[d] = ((float)q[d] - zp) * sc;
      }
      break;
    }
  }
}

int sdpa_probe_kv_read(const sdpa_probe_kv_cache *c, int64_t slot0, int64_t n, float *dst,
                       int32_t n_threads) {
  if (!kv_ok(c) || slot0 < 0 || n < 0 || slot0 > c->capacity - n) return SDPA_INVALID;
  if (n == 0) return SDPA_OK;
  if (!dst) return SDPA_INVALID;
  kv_read_ctx k = {c, slot0, n, n, dst};
  int nt = blk_threads(n_threads);
  if (nt == 1 || n * c->n_kv_heads * c->head_dim < 4 * BLK_PAR_MIN) {
    kv_read_task(&k, 0, 0);
  } else {
    k.per_task = (n + 2 * nt - 1) / (2 * nt);
    sdpa_probe_parallel_for(nt, (n + k.per_task - 1) / k.per_task, kv_read_task, &k);
  }
  return SDPA_OK;
}

int sdpa_probe_kv_tensor(const sdpa_probe_kv_cache *c, sdpa_tensor *t) {
  if (!kv_ok(c) || !t) return SDPA_INVALID;
  memset(t, 0, sizeof *t);
  t->data = c->data;
  t->dtype = c->dtype;
  t->stride[0] = 0;
  t->stride[1] = c->n_kv_heads * c->head_dim;
  t->stride[2] = c->head_dim;
  t->stride[3] = 1;
  if (c->dtype == SDPA_I8) {
    t->scale = c->scale;
    t->zero_point = c->zero_point;
    t->qstride[0] = 0;
    t->qstride[1] = c->n_kv_heads;
    t->qstride[2] = 1;
  }
  return SDPA_OK;
}

/* ---- GQA repeat-interleave broadcast ------------------------------------- */

SDPA_INLINE void copy_floats(float *SDPA_RESTRICT d, const float *SDPA_RESTRICT s, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    v8f_store(d + i, v8f_load(s + i));
    v8f_store(d + i + 8, v8f_load(s + i + 8));
  }
  for (; i + 8 <= n; i += 8) v8f_store(d + i, v8f_load(s + i));
  for (; i < n; i++) d[i] = s[i];
}

typedef struct {
  const float *src;
  float *dst;
  int64_t len, Hkv, H, D, G, per_task, chunks;
} bcast_ctx;

static void bcast_task(void *vc, int64_t t, int thread) {
  bcast_ctx *c = (bcast_ctx *)vc;
  (void)thread;
  int64_t h = t / c->chunks, ch = t % c->chunks;
  int64_t j0 = ch * c->per_task, j1 = j0 + c->per_task < c->len ? j0 + c->per_task : c->len;
  const int64_t hk = h / c->G, row = c->Hkv * c->D;
  float *dst = c->dst + h * c->len * c->D;
  for (int64_t j = j0; j < j1; j++) copy_floats(dst + j * c->D, c->src + j * row + hk * c->D, c->D);
}

int sdpa_probe_gqa_broadcast(const float *src, float *dst, int64_t len, int64_t n_kv_heads,
                             int64_t n_heads, int64_t head_dim, int32_t n_threads) {
  if (len < 0 || n_kv_heads <= 0 || n_heads <= 0 || head_dim <= 0) return SDPA_INVALID;
  if (n_heads % n_kv_heads) return SDPA_INVALID;
  if (!blk_mul_ok(n_heads, head_dim) || !blk_mul_ok(len, n_heads * head_dim)) return SDPA_INVALID;
  if (len == 0) return SDPA_OK;
  if (!src || !dst) return SDPA_INVALID;
  bcast_ctx c = {src, dst, len, n_kv_heads, n_heads, head_dim, n_heads / n_kv_heads, len, 1};
  int nt = blk_threads(n_threads);
  if (nt == 1 || len * n_heads * head_dim < 4 * BLK_PAR_MIN) {
    for (int64_t h = 0; h < n_heads; h++) bcast_task(&c, h, 0);
  } else {
    c.per_task = 256;
    c.chunks = (len + c.per_task - 1) / c.per_task;
    sdpa_probe_parallel_for(nt, n_heads * c.chunks, bcast_task, &c);
  }
  return SDPA_OK;
}

/* ---- matmul packing of K, and QK^T on the packed panels ------------------ */

#define NR SDPA_PROBE_PACK_NR

int64_t sdpa_probe_pack_k_floats(int64_t heads, int64_t len, int64_t head_dim) {
  if (heads < 0 || len < 0 || head_dim <= 0) return -1;
  int64_t panels = (len + NR - 1) / NR;
  if (!blk_mul_ok(heads, panels) || !blk_mul_ok(heads * panels, head_dim * NR)) return -1;
  return heads * panels * head_dim * NR;
}

#define PANELS_PER_TASK 32

typedef struct {
  const float *k;
  float *dst;
  const float *q;
  float *scores;
  int64_t heads, len, D, panels, chunks;
  float scale;
} pack_ctx;

static void pack_task(void *vc, int64_t t, int thread) {
  pack_ctx *c = (pack_ctx *)vc;
  (void)thread;
  const int64_t D = c->D, h = t / c->chunks, ch = t % c->chunks;
  int64_t p0 = ch * PANELS_PER_TASK, p1 = p0 + PANELS_PER_TASK < c->panels ? p0 + PANELS_PER_TASK : c->panels;
  const float *kh = c->k + h * c->len * D;
  for (int64_t p = p0; p < p1; p++) {
    float *out = c->dst + (h * c->panels + p) * D * NR;
    int64_t j0 = p * NR, n = c->len - j0 < NR ? c->len - j0 : NR;
    if (n == NR) {
      const float *r0 = kh + j0 * D;
      for (int64_t d = 0; d < D; d++) {
        float *o = out + d * NR;
        for (int r = 0; r < NR; r++) o[r] = r0[r * D + d];
      }
    } else {
      for (int64_t d = 0; d < D; d++)
        for (int r = 0; r < NR; r++) out[d * NR + r] = r < n ? kh[(j0 + r) * D + d] : 0.0f;
    }
  }
}

int sdpa_probe_pack_k(const float *k, float *dst, int64_t heads, int64_t len, int64_t head_dim,
                      int32_t n_threads) {
  if (sdpa_probe_pack_k_floats(heads, len, head_dim) < 0) return SDPA_INVALID;
  if (heads == 0 || len == 0) return SDPA_OK;
  if (!k || !dst) return SDPA_INVALID;
  pack_ctx c = {k, dst, NULL, NULL, heads, len, head_dim, (len + NR - 1) / NR, 0, 0.0f};
  c.chunks = (c.panels + PANELS_PER_TASK - 1) / PANELS_PER_TASK;
  blk_run(blk_threads(n_threads), heads * len * head_dim, 4 * BLK_PAR_MIN, heads * c.chunks,
          pack_task, &c);
  return SDPA_OK;
}

static void store_scores(float *s, v8f acc, float scale, int64_t n) {
  if (n >= NR) {
    v8f_store(s, acc * v8f_set1(scale));
  } else {
    for (int64_t r = 0; r < n; r++) s[r] = acc[r] * scale;
  }
}

static void qk_task(void *vc, int64_t t, int thread) {
  pack_ctx *c = (pack_ctx *)vc;
  (void)thread;
  const int64_t D = c->D, h = t / c->chunks, ch = t % c->chunks;
  int64_t p0 = ch * PANELS_PER_TASK, p1 = p0 + PANELS_PER_TASK < c->panels ? p0 + PANELS_PER_TASK : c->panels;
  const float *qh = c->q + h * D;
  const float *kp = c->dst + h * c->panels * D * NR; /* the packed K */
  float *sc = c->scores + h * c->len;
  int64_t p = p0;
  for (; p + 4 <= p1; p += 4) {
    const float *b0 = kp + p * D * NR, *b1 = b0 + D * NR, *b2 = b1 + D * NR, *b3 = b2 + D * NR;
    v8f a0 = v8f_set1(0.f), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t d = 0; d < D; d++) {
      v8f qd = v8f_set1(qh[d]);
      a0 = blk_fma(qd, v8f_load(b0 + d * NR), a0);
      a1 = blk_fma(qd, v8f_load(b1 + d * NR), a1);
      a2 = blk_fma(qd, v8f_load(b2 + d * NR), a2);
      a3 = blk_fma(qd, v8f_load(b3 + d * NR), a3);
    }
    store_scores(sc + p * NR, a0, c->scale, c->len - p * NR);
    store_scores(sc + (p + 1) * NR, a1, c->scale, c->len - (p + 1) * NR);
    store_scores(sc + (p + 2) * NR, a2, c->scale, c->len - (p + 2) * NR);
    store_scores(sc + (p + 3) * NR, a3, c->scale, c->len - (p + 3) * NR);
  }
  for (; p < p1; p++) {
    const float *b0 = kp + p * D * NR;
    v8f a0 = v8f_set1(0.f);
    for (int64_t d = 0; d < D; d++) a0 = blk_fma(v8f_set1(qh[d]), v8f_load(b0 + d * NR), a0);
    store_scores(sc + p * NR, a0, c->scale, c->len - p * NR);
  }
}

int sdpa_probe_qk_packed(const float *q, const float *kp, float *scores, int64_t heads,
                         int64_t len, int64_t head_dim, float scale, int32_t n_threads) {
  if (sdpa_probe_pack_k_floats(heads, len, head_dim) < 0 || isnan(scale) || isinf(scale))
    return SDPA_INVALID;
  if (heads == 0 || len == 0) return SDPA_OK;
  if (!q || !kp || !scores) return SDPA_INVALID;
  if (scale <= 0.0f) scale = 1.0f / sqrtf((float)head_dim);
  pack_ctx c = {NULL, (float *)kp, q, scores, heads, len, head_dim, (len + NR - 1) / NR, 0, scale};
  c.chunks = (c.panels + PANELS_PER_TASK - 1) / PANELS_PER_TASK;
  blk_run(blk_threads(n_threads), heads * len * head_dim, 4 * BLK_PAR_MIN, heads * c.chunks,
          qk_task, &c);
  return SDPA_OK;
}

/* ---- softmax --------------------------------------------------------------- */

typedef struct {
  float *x;
  int64_t rows, n;
} sm_ctx;

static void softmax_row(float *x, int64_t n) {
  v8f vm = v8f_set1(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v8f v = v8f_load(x + i);
    vm = v8f_select((v8i)(v > vm), v, vm);
  }
  float m = v8f_hmax(vm);
  for (; i < n; i++) m = x[i] > m ? x[i] : m;
  if (m == -INFINITY) {
    memset(x, 0, (size_t)n * sizeof(float));
    return;
  }
  v8f mm = v8f_set1(m), vs = v8f_set1(0.f);
  i = 0;
  for (; i + 8 <= n; i += 8) {
    v8f e = v8f_exp(v8f_load(x + i) - mm);
    v8f_store(x + i, e);
    vs += e;
  }
  float s = v8f_hsum(vs);
  for (; i < n; i++) {
    x[i] = expf(x[i] - m);
    s += x[i];
  }
  v8f inv = v8f_set1(1.0f / s);
  i = 0;
  for (; i + 8 <= n; i += 8) v8f_store(x + i, v8f_load(x + i) * inv);
  for (; i < n; i++) x[i] *= 1.0f / s;
}

static void sm_task(void *vc, int64_t r, int thread) {
  sm_ctx *c = (sm_ctx *)vc;
  (void)thread;
  softmax_row(c->x + r * c->n, c->n);
}

int sdpa_probe_softmax(float *x, int64_t rows, int64_t n, int32_t n_threads) {
  if (rows < 0 || n < 0 || !blk_mul_ok(rows, n)) return SDPA_INVALID;
  if (rows == 0 || n == 0) return SDPA_OK;
  if (!x) return SDPA_INVALID;
  sm_ctx c = {x, rows, n};
  blk_run(blk_threads(n_threads), rows * n, BLK_PAR_MIN, rows, sm_task, &c);
  return SDPA_OK;
}

/* ---- PV -------------------------------------------------------------------- */

typedef struct {
  const float *p, *v;
  float *out;
  int64_t len, D;
} pv_ctx;

static void pv_head(const float *p, const float *v, float *out, int64_t len, int64_t D) {
  int64_t d = 0;
  for (; d + 32 <= D; d += 32) {
    v8f a0 = v8f_set1(0.f), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t j = 0; j < len; j++) {
      const float *vr = v + j * D + d;
      v8f pj = v8f_set1(p[j]);
      a0 = blk_fma(pj, v8f_load(vr), a0);
      a1 = blk_fma(pj, v8f_load(vr + 8), a1);
      a2 = blk_fma(pj, v8f_load(vr + 16), a2);
      a3 = blk_fma(pj, v8f_load(vr + 24), a3);
    }
    v8f_store(out + d, a0);
    v8f_store(out + d + 8, a1);
    v8f_store(out + d + 16, a2);
    v8f_store(out + d + 24, a3);
  }
  for (; d + 8 <= D; d += 8) {
    v8f a0 = v8f_set1(0.f);
    for (int64_t j = 0; j < len; j++) a0 = blk_fma(v8f_set1(p[j]), v8f_load(v + j * D + d), a0);
    v8f_store(out + d, a0);
  }
  for (; d < D; d++) {
    float s = 0.0f;
    for (int64_t j = 0; j < len; j++) s += p[j] * v[j * D + d];
    out[d] = s;
  }
}

static void pv_task(void *vc, int64_t h, int thread) {
  pv_ctx *c = (pv_ctx *)vc;
  (void)thread;
  pv_head(c->p + h * c->len, c->v + h * c->len * c->D, c->out + h * c->D, c->len, c->D);
}

int sdpa_probe_pv(const float *p, const float *v, float *out, int64_t heads, int64_t len,
                  int64_t head_dim, int32_t n_threads) {
  if (heads < 0 || len < 0 || head_dim <= 0 || !blk_mul_ok(heads, len) ||
      !blk_mul_ok(heads * len, head_dim))
    return SDPA_INVALID;
  if (heads == 0) return SDPA_OK;
  if (!out || (len > 0 && (!p || !v))) return SDPA_INVALID;
  if (len == 0) {
    memset(out, 0, (size_t)(heads * head_dim) * sizeof(float));
    return SDPA_OK;
  }
  pv_ctx c = {p, v, out, len, head_dim};
  blk_run(blk_threads(n_threads), heads * len * head_dim, 4 * BLK_PAR_MIN, heads, pv_task, &c);
  return SDPA_OK;
}
