/* A complete, minimal SDPA kernel for the sdpa_probe ABI (native/include/sdpa_probe.h).
 *
 *   probe check --kernel docs/examples/minimal_sdpa.c
 *
 * One query row at a time: scores for every visible key, a max-subtracted
 * softmax, a weighted sum of V. Every storage dtype, any strides, GQA, an
 * additive mask, bottom-right causal with start_pos; rows that see no key
 * give zeros. Simple, not fast. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sdpa_probe.h"

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0) {
    float f = ldexpf((float)man, -24); /* zero or subnormal */
    return (h & 0x8000u) ? -f : f;
  }
  u = exp == 31 ? (sign | 0x7f800000u | (man << 13)) : (sign | ((exp + 112u) << 23) | (man << 13));
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t f32_to_f16(float f) { /* round to nearest even */
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

static float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Element d of token (b, s, h) as float. */
static float load(const sdpa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d) {
  int64_t off = b * t->stride[0] + s * t->stride[1] + h * t->stride[2] + d * t->stride[3];
  switch (t->dtype) {
    case SDPA_F32: return ((const float *)t->data)[off];
    case SDPA_F16: return f16_to_f32(((const uint16_t *)t->data)[off]);
    case SDPA_BF16: return bf16_to_f32(((const uint16_t *)t->data)[off]);
    default: { /* SDPA_I8, per-token asymmetric */
      int64_t qo = b * t->qstride[0] + s * t->qstride[1] + h * t->qstride[2];
      int zp = t->zero_point ? t->zero_point[qo] : 0;
      return (float)(((const int8_t *)t->data)[off] - zp) * t->scale[qo];
    }
  }
}

static void store(const sdpa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d, float x) {
  int64_t off = b * t->stride[0] + s * t->stride[1] + h * t->stride[2] + d * t->stride[3];
  if (t->dtype == SDPA_F32) ((float *)t->data)[off] = x;
  else if (t->dtype == SDPA_F16) ((uint16_t *)t->data)[off] = f32_to_f16(x);
  else ((uint16_t *)t->data)[off] = f32_to_bf16(x);
}

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
        int64_t n = kv; /* keys j < n are not hidden by the causal edge */
        if (a->is_causal && a->start_pos + i + 1 < n) n = a->start_pos + i + 1;
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
          float s = 0.0f;
          for (int64_t d = 0; d < D; d++) s += load(&a->q, b, i, h, d) * load(&a->k, b, j, hk, d);
          s *= scale;
          if (a->mask) s += a->mask[i * a->mask_row_stride + j];
          p[j] = s;
          if (s > mx || s != s) mx = s; /* a NaN sticks: the row is NaN, not unseen */
        }
        memset(acc, 0, (size_t)D * sizeof(float));
        float sum = 0.0f;
        if (mx != -INFINITY) { /* else: no visible key, the row stays zero */
          for (int64_t j = 0; j < n; j++) {
            float w = expf(p[j] - mx);
            sum += w;
            for (int64_t d = 0; d < D; d++) acc[d] += w * load(&a->v, b, j, hk, d);
          }
          for (int64_t d = 0; d < D; d++) acc[d] /= sum;
        }
        for (int64_t d = 0; d < D; d++) store(&a->out, b, i, h, d, acc[d]);
      }
  free(p);
  free(acc);
  return SDPA_OK;
}
