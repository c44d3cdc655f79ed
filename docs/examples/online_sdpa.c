/* A blocked, online-softmax SDPA kernel for the sdpa_probe ABI
 * (native/include/sdpa_probe.h), shaped like the kernels it is meant to stand
 * for -- flash attention, flash-decoding, ExecuTorch's custom_sdpa, llama.cpp's
 * CPU flash attention -- and written to be read, not to be fast:
 *
 *   probe check --kernel docs/examples/online_sdpa.c
 *
 * Per query row: the visible keys are split into SPLITS ranges (flash-decoding's
 * split-k); each range is walked in blocks of BLOCK keys with a running max m,
 * a running sum l and an unnormalised accumulator acc, rescaled whenever a block
 * raises the max; the ranges' partial states are merged at the end. The
 * exponentials are exp2((s - m) * log2(e)), as fast kernels compute them. (Scores
 * stay in natural units: an additive mask of -FLT_MAX times log2(e) would
 * overflow to -inf and blank a row the reference keeps; `probe check` caught that.)
 * Every storage dtype, any strides, GQA, an additive mask, bottom-right causal
 * with start_pos; rows that see no key give zeros.
 *
 * The mutation study in docs/check.md puts one-line bugs into this file: each
 * line a bug class of online-softmax kernels lives on is kept simple on purpose. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sdpa_probe.h"

#define BLOCK 32
#define SPLITS 2
#define LOG2E 1.4426950408889634f

typedef struct {
  float m, l; /* running max of the scores and sum of exp(s - m) */
  float *acc; /* head_dim floats: sum of exp(s - m) * v */
} row_state;

static float elem(const sdpa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d) {
  const int64_t off = b * t->stride[0] + s * t->stride[1] + h * t->stride[2] + d * t->stride[3];
  if (t->dtype == SDPA_F32) return ((const float *)t->data)[off];
  if (t->dtype == SDPA_F16) return (float)((const _Float16 *)t->data)[off];
  if (t->dtype == SDPA_BF16) {
    uint32_t u = (uint32_t)((const uint16_t *)t->data)[off] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
  }
  const int64_t qo = b * t->qstride[0] + s * t->qstride[1] + h * t->qstride[2];
  const int zp = t->zero_point ? t->zero_point[qo] : 0;
  return (float)(((const int8_t *)t->data)[off] - zp) * t->scale[qo];
}

static void put(const sdpa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d, float x) {
  const int64_t off = b * t->stride[0] + s * t->stride[1] + h * t->stride[2] + d * t->stride[3];
  if (t->dtype == SDPA_F32) {
    ((float *)t->data)[off] = x;
  } else if (t->dtype == SDPA_F16) {
    ((_Float16 *)t->data)[off] = (_Float16)x;
  } else { /* BF16, round to nearest even; NaN stays NaN */
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    ((uint16_t *)t->data)[off] = (u & 0x7fffffffu) > 0x7f800000u
                                     ? (uint16_t)((u >> 16) | 0x40u)
                                     : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}

/* Keys [lo, hi) of row (b, i) and kv head hk into st, one block at a time. */
static void visit_range(const sdpa_args *a, int64_t b, int64_t i, int64_t hk, const float *q,
                        int64_t lo, int64_t hi, row_state *st, float *p) {
  const int64_t D = a->head_dim;
  st->m = -INFINITY;
  st->l = 0.0f;
  memset(st->acc, 0, (size_t)D * sizeof(float));
  for (int64_t j0 = lo; j0 < hi; j0 += BLOCK) {
    const int64_t j1 = j0 + BLOCK < hi ? j0 + BLOCK : hi;
    float bm = -INFINITY;
    for (int64_t j = j0; j < j1; j++) {
      float s = 0.0f;
      for (int64_t d = 0; d < D; d++) s += q[d] * elem(&a->k, b, j, hk, d);
      if (a->mask) s += a->mask[i * a->mask_row_stride + j];
      p[j - j0] = s;
      if (s > bm || s != s) bm = s; /* a NaN sticks: the row is NaN, not unseen */
    }
    if (bm == -INFINITY) continue; /* every key of the block masked: nothing to add */
    const float mn = bm > st->m || bm != bm ? bm : st->m;
    const float alpha = exp2f((st->m - mn) * LOG2E); /* 0 while the state is empty */
    st->l *= alpha;
    for (int64_t d = 0; d < D; d++) st->acc[d] *= alpha;
    for (int64_t j = j0; j < j1; j++) {
      const float w = exp2f((p[j - j0] - mn) * LOG2E);
      st->l += w;
      for (int64_t d = 0; d < D; d++) st->acc[d] += w * elem(&a->v, b, j, hk, d);
    }
    st->m = mn;
  }
}

int sdpa_forward(const sdpa_args *a) {
  int status = sdpa_validate_args(a);
  if (status != SDPA_OK) return status;
  if (a->batch == 0 || a->q_len == 0) return SDPA_OK;
  const int64_t D = a->head_dim, kv = a->kv_len, group = a->n_heads / a->n_kv_heads;
  const float scale = a->scale > 0 ? a->scale : 1.0f / sqrtf((float)D);
  float *buf = malloc((size_t)(D * (SPLITS + 2) + BLOCK) * sizeof(float));
  if (buf == NULL) return SDPA_UNSUPPORTED;
  float *q = buf, *out = buf + D, *p = buf + 2 * D;
  row_state part[SPLITS];
  for (int s = 0; s < SPLITS; s++) part[s].acc = buf + 2 * D + BLOCK + s * D;
  for (int64_t b = 0; b < a->batch; b++)
    for (int64_t i = 0; i < a->q_len; i++)
      for (int64_t h = 0; h < a->n_heads; h++) {
        const int64_t hk = h / group;
        int64_t n = kv; /* keys j < n are not hidden by the causal edge */
        if (a->is_causal && a->start_pos + i + 1 < n) n = a->start_pos + i + 1;
        for (int64_t d = 0; d < D; d++) q[d] = elem(&a->q, b, i, h, d) * scale;
        const int64_t chunk = (n + SPLITS - 1) / SPLITS;
        for (int s = 0; s < SPLITS; s++) {
          const int64_t lo = s * chunk < n ? s * chunk : n, hi = lo + chunk < n ? lo + chunk : n;
          visit_range(a, b, i, hk, q, lo, hi, &part[s], p);
        }
        /* merge the partial states on their common max */
        float M = -INFINITY, L = 0.0f;
        for (int s = 0; s < SPLITS; s++)
          if (part[s].m > M || part[s].m != part[s].m) M = part[s].m;
        memset(out, 0, (size_t)D * sizeof(float));
        if (M != -INFINITY) { /* else: no visible key, the row stays zero */
          for (int s = 0; s < SPLITS; s++) {
            const float w = exp2f((part[s].m - M) * LOG2E);
            L += part[s].l * w;
            for (int64_t d = 0; d < D; d++) out[d] += part[s].acc[d] * w;
          }
          for (int64_t d = 0; d < D; d++) out[d] /= L;
        }
        for (int64_t d = 0; d < D; d++) put(&a->out, b, i, h, d, out[d]);
      }
  free(buf);
  return SDPA_OK;
}
