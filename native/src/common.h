/* Internal helpers shared by the built-in kernels: vector types, dtype
 * conversion, a vectorised exp, the counting allocator and the thread pool.
 * Not part of the public ABI (that is include/sdpa_probe.h). */
#ifndef SDPA_PROBE_COMMON_H
#define SDPA_PROBE_COMMON_H

#include <stdint.h>
#include <string.h>

#include "sdpa_probe.h"
#include "sdpa_probe_lib.h"

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#define SDPA_HAVE_F16C 1
#endif

/* GCC/Clang vector extensions: lowered to AVX/SSE/NEON or scalar code. */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v8fu __attribute__((vector_size(32), aligned(4), may_alias));

#define SDPA_INLINE static inline __attribute__((always_inline))
#define SDPA_RESTRICT __restrict__

#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
/* AArch64's NEON path: an 8-lane vector is two 128-bit registers, lanes 0-3 and 4-7. */
#define SDPA_HAVE_NEON 1
SDPA_INLINE v8f sdpa_v8f_halves(float32x4_t lo, float32x4_t hi) {
  v8f r;
  memcpy(&r, &lo, 16);
  memcpy((char *)&r + 16, &hi, 16);
  return r;
}
SDPA_INLINE float32x4_t sdpa_v8f_lo(v8f x) {
  float32x4_t r;
  memcpy(&r, &x, 16);
  return r;
}
SDPA_INLINE float32x4_t sdpa_v8f_hi(v8f x) {
  float32x4_t r;
  memcpy(&r, (const char *)&x + 16, 16);
  return r;
}
#endif

SDPA_INLINE v8f v8f_load(const float *p) { return *(const v8fu *)p; }
SDPA_INLINE void v8f_store(float *p, v8f x) { *(v8fu *)p = x; }
SDPA_INLINE v8f v8f_set1(float x) { return (v8f){x, x, x, x, x, x, x, x}; }
SDPA_INLINE float v8f_hsum(v8f x) {
  float s0 = x[0] + x[4], s1 = x[1] + x[5], s2 = x[2] + x[6], s3 = x[3] + x[7];
  return (s0 + s2) + (s1 + s3);
}
SDPA_INLINE float v8f_hmax(v8f x) {
  float m = x[0];
  for (int i = 1; i < 8; i++) m = x[i] > m ? x[i] : m;
  return m;
}

/* The range reduction and polynomial of the kernels' vector exp (Cephes), shared by
 * every width: x clamped to [SDPA_EXP_LO, SDPA_EXP_HI], n = round(x log2 e),
 * r = x - n ln 2 (in two parts), exp(x) = 2^n (1 + r + r^2 p(r)). */
#define SDPA_EXP_LO -87.3365447505531f
#define SDPA_EXP_HI 88.3762626647949f
#define SDPA_EXP_LOG2E 1.44269504088896341f
#define SDPA_EXP_LN2_HI 0.693359375f
#define SDPA_EXP_LN2_LO -2.12194440e-4f
/* p = p(r) by Horner, with FMA(a, b, c) = a * b + c and SET1 a broadcast */
#define SDPA_EXP_POLY(FMA, SET1, r, p)           \
  do {                                           \
    (p) = SET1(1.9875691500E-4f);                \
    (p) = FMA((p), (r), SET1(1.3981999507E-3f)); \
    (p) = FMA((p), (r), SET1(8.3334519073E-3f)); \
    (p) = FMA((p), (r), SET1(4.1665795894E-2f)); \
    (p) = FMA((p), (r), SET1(1.6666665459E-1f)); \
    (p) = FMA((p), (r), SET1(5.0000001201E-1f)); \
  } while (0)

/* exp(x) for 8 lanes, Cephes-style range reduction and degree-6 polynomial
 * (about 2 ulp). exp(-inf) = 0 and exp(x < -87.3) = 0; NaN propagates. */
SDPA_INLINE v8f v8f_select(v8i m, v8f a, v8f b) { /* m ? a : b, lane-wise */
  return (v8f)(((v8i)a & m) | ((v8i)b & ~m));
}

SDPA_INLINE v8f v8f_exp(v8f x) {
  v8i is_nan = (v8i)(x != x);
  v8i under = (v8i)(x < v8f_set1(-87.3365447505531f));
  v8f x0 = x;
  const v8f hi = v8f_set1(88.3762626647949f);
  x = v8f_select((v8i)(x < hi), x, hi);
  x = v8f_select(under, v8f_set1(0.0f), x); /* keep the exponent in range */
  v8f fx = x * v8f_set1(1.44269504088896341f);
  const v8f magic = v8f_set1(12582912.0f); /* 1.5 * 2^23: round to nearest */
  fx = (fx + magic) - magic;
  v8f r = x - fx * v8f_set1(0.693359375f);
  r = r - fx * v8f_set1(-2.12194440e-4f);
  v8f p = v8f_set1(1.9875691500E-4f);
  p = p * r + v8f_set1(1.3981999507E-3f);
  p = p * r + v8f_set1(8.3334519073E-3f);
  p = p * r + v8f_set1(4.1665795894E-2f);
  p = p * r + v8f_set1(1.6666665459E-1f);
  p = p * r + v8f_set1(5.0000001201E-1f);
  p = p * (r * r) + r + v8f_set1(1.0f);
  v8i n = __builtin_convertvector(fx, v8i);
  v8f res = p * (v8f)((n + 127) << 23);
  res = (v8f)((v8i)res & ~under & ~is_nan);
  return (v8f)((v8i)res | ((v8i)x0 & is_nan));
}

SDPA_INLINE float sdpa_expf_fast(float x) {
  v8f v = v8f_set1(x);
  return v8f_exp(v)[0];
}

/* ---- dtype conversion ------------------------------------------------ */

SDPA_INLINE float sdpa_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
SDPA_INLINE uint16_t sdpa_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
  return (uint16_t)(u >> 16);
}
SDPA_INLINE float sdpa_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else { /* subnormal: normalise */
      int e = -1;
      do { e++; man <<= 1; } while ((man & 0x400u) == 0);
      u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}
SDPA_INLINE uint16_t sdpa_f32_to_f16(float f) {
#ifdef SDPA_HAVE_F16C
  return (uint16_t)_cvtss_sh(f, 0);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow -> inf */
  if (absu < 0x38800000u) { /* subnormal or zero in f16 */
    float af;
    memcpy(&af, &absu, 4);
    af = af * 16777216.0f; /* scale by 2^24: f16 subnormal unit */
    uint32_t m = (uint32_t)af;
    float rem = af - (float)m;
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) m++;
    return (uint16_t)(sign | m);
  }
  uint32_t r = absu + 0xfffu + ((absu >> 13) & 1u) - 0x38000000u;
  return (uint16_t)(sign | (r >> 13));
#endif
}

/* Bytes of one element of a storage dtype. */
SDPA_INLINE int64_t sdpa_isz(int32_t dt) { return dt == SDPA_F32 ? 4 : dt == SDPA_I8 ? 1 : 2; }

/* 8 consecutive elements of dtype DT at p as float; I8 gives (x - zp). The
 * conversion in the kernels' inner loops, and the one `probe info` times. */
SDPA_INLINE v8f sdpa_ld8(const char *p, const int DT, v8i zp) {
  if (DT == SDPA_F32) return v8f_load((const float *)p);
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  if (DT == SDPA_F16) return (v8f)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
  if (DT == SDPA_BF16) {
    __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return (v8f)_mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
  }
  __m256i x = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
  return (v8f)_mm256_cvtepi32_ps(_mm256_sub_epi32(x, (__m256i)zp));
#elif defined(SDPA_HAVE_NEON)
  if (DT == SDPA_F16) { /* FCVTL / FCVTL2: exact, subnormals and NaN kept */
    float16x8_t h = vreinterpretq_f16_u16(vld1q_u16((const uint16_t *)p));
    return sdpa_v8f_halves(vcvt_f32_f16(vget_low_f16(h)), vcvt_high_f32_f16(h));
  }
  if (DT == SDPA_BF16) { /* a BF16 is the top half of its F32 */
    uint16x8_t x = vld1q_u16((const uint16_t *)p);
    return sdpa_v8f_halves(vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(x), 16)),
                           vreinterpretq_f32_u32(vshll_high_n_u16(x, 16)));
  }
  int16x8_t w = vmovl_s8(vld1_s8((const int8_t *)p));
  int32x4_t zlo, zhi;
  memcpy(&zlo, &zp, 16);
  memcpy(&zhi, (const char *)&zp + 16, 16);
  return sdpa_v8f_halves(vcvtq_f32_s32(vsubq_s32(vmovl_s16(vget_low_s16(w)), zlo)),
                         vcvtq_f32_s32(vsubq_s32(vmovl_high_s16(w), zhi)));
#else
  v8f r;
  for (int i = 0; i < 8; i++) {
    if (DT == SDPA_F16) r[i] = sdpa_f16_to_f32(((const uint16_t *)p)[i]);
    else if (DT == SDPA_BF16) r[i] = sdpa_bf16_to_f32(((const uint16_t *)p)[i]);
    else r[i] = (float)((int32_t)((const int8_t *)p)[i] - zp[i]);
  }
  return r;
#endif
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define SDPA_HAVE_AVX512 1
/* 16 consecutive elements of dtype DT at p as float; I8 gives (x - zp): the
 * AVX-512 kernels' conversion (flash_x512_block.h), and the one `probe info` times there. */
SDPA_INLINE __m512 sdpa_ld16(const char *p, const int DT, __m512i zp) {
  if (DT == SDPA_F32) return _mm512_loadu_ps((const float *)p);
  if (DT == SDPA_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
  if (DT == SDPA_BF16)
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
  return _mm512_cvtepi32_ps(
      _mm512_sub_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)), zp));
}
#endif

/* Load n elements spaced `stride` apart as float. For SDPA_I8, real value is
 * (x - zp) * scale. */
SDPA_INLINE void sdpa_load_row(const void *base, int32_t dtype, int64_t off, int64_t stride,
                               int64_t n, float scale, int32_t zp, float *SDPA_RESTRICT dst) {
  switch (dtype) {
    case SDPA_F32: {
      const float *p = (const float *)base + off;
      if (stride == 1) memcpy(dst, p, (size_t)n * sizeof(float));
      else for (int64_t d = 0; d < n; d++) dst[d] = p[d * stride];
      break;
    }
    case SDPA_F16: {
      const uint16_t *p = (const uint16_t *)base + off;
      int64_t d = 0;
#ifdef SDPA_HAVE_F16C
      if (stride == 1)
        for (; d + 8 <= n; d += 8)
          _mm256_storeu_ps(dst + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + d))));
#elif defined(SDPA_HAVE_NEON)
      if (stride == 1)
        for (; d + 8 <= n; d += 8) {
          float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(p + d));
          vst1q_f32(dst + d, vcvt_f32_f16(vget_low_f16(h)));
          vst1q_f32(dst + d + 4, vcvt_high_f32_f16(h));
        }
#endif
      for (; d < n; d++) dst[d] = sdpa_f16_to_f32(p[d * stride]);
      break;
    }
    case SDPA_BF16: {
      const uint16_t *p = (const uint16_t *)base + off;
      for (int64_t d = 0; d < n; d++) dst[d] = sdpa_bf16_to_f32(p[d * stride]);
      break;
    }
    case SDPA_I8: {
      const int8_t *p = (const int8_t *)base + off;
      for (int64_t d = 0; d < n; d++) dst[d] = (float)((int32_t)p[d * stride] - zp) * scale;
      break;
    }
  }
}

SDPA_INLINE void sdpa_store_row(void *base, int32_t dtype, int64_t off, int64_t stride, int64_t n,
                                const float *SDPA_RESTRICT src) {
  switch (dtype) {
    case SDPA_F32: {
      float *p = (float *)base + off;
      for (int64_t d = 0; d < n; d++) p[d * stride] = src[d];
      break;
    }
    case SDPA_F16: {
      uint16_t *p = (uint16_t *)base + off;
      for (int64_t d = 0; d < n; d++) p[d * stride] = sdpa_f32_to_f16(src[d]);
      break;
    }
    case SDPA_BF16: {
      uint16_t *p = (uint16_t *)base + off;
      for (int64_t d = 0; d < n; d++) p[d * stride] = sdpa_f32_to_bf16(src[d]);
      break;
    }
    default:
      break;
  }
}

/* Per-token quantization parameters of row (b, s, h) of an SDPA_I8 tensor. */
SDPA_INLINE void sdpa_qparams(const sdpa_tensor *t, int64_t b, int64_t s, int64_t h, float *scale,
                              int32_t *zp) {
  if (t->dtype != SDPA_I8) {
    *scale = 1.0f;
    *zp = 0;
    return;
  }
  int64_t qo = b * t->qstride[0] + s * t->qstride[1] + h * t->qstride[2];
  *scale = t->scale[qo];
  *zp = t->zero_point ? (int32_t)t->zero_point[qo] : 0;
}

SDPA_INLINE int64_t sdpa_row_offset(const sdpa_tensor *t, int64_t b, int64_t s, int64_t h) {
  return b * t->stride[0] + s * t->stride[1] + h * t->stride[2];
}

SDPA_INLINE void sdpa_load_token(const sdpa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t dim,
                                 float *SDPA_RESTRICT dst) {
  float sc;
  int32_t zp;
  sdpa_qparams(t, b, s, h, &sc, &zp);
  sdpa_load_row(t->data, t->dtype, sdpa_row_offset(t, b, s, h), t->stride[3], dim, sc, zp, dst);
}

SDPA_INLINE float sdpa_effective_scale(const sdpa_args *a) {
  return a->scale > 0.0f ? a->scale : 1.0f / sqrtf((float)a->head_dim);
}

SDPA_INLINE int sdpa_threads(const sdpa_args *a) {
  int n = a->n_threads;
  if (n <= 0) n = sdpa_probe_default_threads();
  if (n > SDPA_PROBE_MAX_THREADS) n = SDPA_PROBE_MAX_THREADS;
  return n;
}

/* Dot product and axpy over n floats, with independent accumulators. */
SDPA_INLINE float sdpa_dot(const float *SDPA_RESTRICT a, const float *SDPA_RESTRICT b, int64_t n) {
  v8f s0 = v8f_set1(0.f), s1 = s0, s2 = s0, s3 = s0;
  int64_t d = 0;
  for (; d + 32 <= n; d += 32) {
    s0 += v8f_load(a + d) * v8f_load(b + d);
    s1 += v8f_load(a + d + 8) * v8f_load(b + d + 8);
    s2 += v8f_load(a + d + 16) * v8f_load(b + d + 16);
    s3 += v8f_load(a + d + 24) * v8f_load(b + d + 24);
  }
  for (; d + 8 <= n; d += 8) s0 += v8f_load(a + d) * v8f_load(b + d);
  float s = v8f_hsum((s0 + s1) + (s2 + s3));
  for (; d < n; d++) s += a[d] * b[d];
  return s;
}

SDPA_INLINE void sdpa_axpy(float *SDPA_RESTRICT y, float alpha, const float *SDPA_RESTRICT x,
                           int64_t n) {
  v8f va = v8f_set1(alpha);
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) v8f_store(y + d, v8f_load(y + d) + va * v8f_load(x + d));
  for (; d < n; d++) y[d] += alpha * x[d];
}

SDPA_INLINE void sdpa_scal(float *y, float alpha, int64_t n) {
  for (int64_t d = 0; d < n; d++) y[d] *= alpha;
}

#endif
