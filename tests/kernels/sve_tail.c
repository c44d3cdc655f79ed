/* A test kernel with an SVE loop-tail bug: the softmax's denominator summed a full
 * vector at a time, then a tail loop written for 128-bit vectors ("at most 3 floats
 * remain"). Right at 128 bits; at 256 bits and more up to svcntw() - 1 keys remain, and
 * the weights past the third are never summed. (Scalar where there is no SVE.) */
#include <stdint.h>
#ifdef __ARM_FEATURE_SVE
#include <arm_sve.h>
#endif

#include "skeleton.h"

static float sum_weights(const float *w, int64_t n) {
  float sum = 0.0f;
  int64_t j = 0;
#ifdef __ARM_FEATURE_SVE
  const int64_t lanes = (int64_t)svcntw();
  svfloat32_t s = svdup_f32(0.0f);
  for (; j + lanes <= n; j += lanes) s = svadd_f32_x(svptrue_b32(), s, svld1_f32(svptrue_b32(), w + j));
  sum = svaddv_f32(svptrue_b32(), s);
  for (int t = 0; t < 3 && j < n; t++, j++) sum += w[j]; /* the bug: 3 is 128 bits' tail */
  return sum;
#endif
  for (; j < n; j++) sum += w[j];
  return sum;
}

static void add_row(float *acc, float w, const sdpa_args *a, int64_t b, int64_t j, int64_t hk) {
  for (int64_t d = 0; d < a->head_dim; d++) acc[d] += w * load(&a->v, b, j, hk, d);
}
