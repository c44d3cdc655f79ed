/* The body the vector test kernels share: one query row at a time, every storage dtype,
 * any strides, GQA, a mask, bottom-right causal (docs/examples/minimal_sdpa.c's
 * arithmetic). A kernel defines two hooks before including it:
 *   static float sum_weights(const float *w, int64_t n);      the softmax's denominator
 *   static void add_row(float *acc, float w, const sdpa_args *a,
 *                       int64_t b, int64_t j, int64_t hk);     acc[d] += w * v[b,j,hk,d] */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sdpa_probe.h"

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0) {
    float f = ldexpf((float)man, -24);
    return (h & 0x8000u) ? -f : f;
  }
  u = exp == 31 ? (sign | 0x7f800000u | (man << 13)) : (sign | ((exp + 112u) << 23) | (man << 13));
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
  if (a < 0x38800000u) {
    float af;
    memcpy(&af, &a, 4);
    return (uint16_t)(sign | (uint32_t)nearbyintf(af * 16777216.0f));
  }
  return (uint16_t)(sign | ((a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13));
}

static float load(const sdpa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d) {
  int64_t off = b * t->stride[0] + s * t->stride[1] + h * t->stride[2] + d * t->stride[3];
  switch (t->dtype) {
    case SDPA_F32: return ((const float *)t->data)[off];
    case SDPA_F16: return f16_to_f32(((const uint16_t *)t->data)[off]);
    case SDPA_BF16: {
      uint32_t u = (uint32_t)((const uint16_t *)t->data)[off] << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
    default: {
      int64_t qo = b * t->qstride[0] + s * t->qstride[1] + h * t->qstride[2];
      int zp = t->zero_point ? t->zero_point[qo] : 0;
      return (float)(((const int8_t *)t->data)[off] - zp) * t->scale[qo];
    }
  }
}

static void store(const sdpa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d, float x) {
  int64_t off = b * t->stride[0] + s * t->stride[1] + h * t->stride[2] + d * t->stride[3];
  if (t->dtype == SDPA_F32) {
    ((float *)t->data)[off] = x;
  } else if (t->dtype == SDPA_F16) {
    ((uint16_t *)t->data)[off] = f32_to_f16(x);
  } else {
    uint32_t u;
    memcpy(&u, &x, 4);
    ((uint16_t *)t->data)[off] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}

static float sum_weights(const float *w, int64_t n);
static void add_row(float *acc, float w, const sdpa_args *a, int64_t b, int64_t j, int64_t hk);

int sdpa_forward(const sdpa_args *a) {
  int st = sdpa_validate_args(a);
  if (st != SDPA_OK) return st;
  if (a->batch == 0 || a->q_len == 0) return SDPA_OK;
  const int64_t D = a->head_dim, kv = a->kv_len, group = a->n_heads / a->n_kv_heads;
  const float scale = a->scale > 0 ? a->scale : 1.0f / sqrtf((float)D);
  float *p = malloc((size_t)(kv > 0 ? kv : 1) * sizeof(float));
  float *acc = malloc((size_t)D * sizeof(float));
  if (!p || !acc) {
    free(p);
    free(acc);
    return SDPA_UNSUPPORTED;
  }
  for (int64_t b = 0; b < a->batch; b++)
    for (int64_t i = 0; i < a->q_len; i++)
      for (int64_t h = 0; h < a->n_heads; h++) {
        const int64_t hk = h / group;
        int64_t n = kv;
        if (a->is_causal && a->start_pos + i + 1 < n) n = a->start_pos + i + 1;
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
          float s = 0.0f;
          for (int64_t d = 0; d < D; d++) s += load(&a->q, b, i, h, d) * load(&a->k, b, j, hk, d);
          s = s * scale + (a->mask ? a->mask[i * a->mask_row_stride + j] : 0.0f);
          p[j] = s;
          if (s > mx || s != s) mx = s;
        }
        memset(acc, 0, (size_t)D * sizeof(float));
        if (mx != -INFINITY) {
          for (int64_t j = 0; j < n; j++) p[j] = expf(p[j] - mx);
          const float sum = sum_weights(p, n);
          for (int64_t j = 0; j < n; j++) add_row(acc, p[j], a, b, j, hk);
          for (int64_t d = 0; d < D; d++) acc[d] /= sum;
        }
        for (int64_t d = 0; d < D; d++) store(&a->out, b, i, h, d, acc[d]);
      }
  free(p);
  free(acc);
  return SDPA_OK;
}
