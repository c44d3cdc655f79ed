/* A test kernel with a NEON lane-order bug: F16 V rows widened to F32 eight at a time,
 * the high half's four floats taken for the low half's and the other way round, so
 * that output dims d and d ^ 4 trade places. (Scalar where there is no NEON, and for
 * every other dtype or a V whose dims are not contiguous.) */
#include <stdint.h>
#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#endif

#include "skeleton.h"

static float sum_weights(const float *w, int64_t n) {
  float sum = 0.0f;
  for (int64_t j = 0; j < n; j++) sum += w[j];
  return sum;
}

static void add_row(float *acc, float w, const sdpa_args *a, int64_t b, int64_t j, int64_t hk) {
  const sdpa_tensor *v = &a->v;
  int64_t d = 0;
#if defined(__aarch64__) && defined(__ARM_NEON)
  if (v->dtype == SDPA_F16 && v->stride[3] == 1) {
    const __fp16 *row = (const __fp16 *)v->data + b * v->stride[0] + j * v->stride[1] +
                        hk * v->stride[2];
    for (; d + 8 <= a->head_dim; d += 8) {
      float16x8_t h = vld1q_f16(row + d);
      float32x4_t lo = vcvt_f32_f16(vget_high_f16(h)); /* the bug: high half as the low */
      float32x4_t hi = vcvt_f32_f16(vget_low_f16(h));
      vst1q_f32(acc + d, vfmaq_n_f32(vld1q_f32(acc + d), lo, w));
      vst1q_f32(acc + d + 4, vfmaq_n_f32(vld1q_f32(acc + d + 4), hi, w));
    }
  }
#endif
  for (; d < a->head_dim; d++) acc[d] += w * load(v, b, j, hk, d);
}
