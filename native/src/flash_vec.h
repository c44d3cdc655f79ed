/* 8-lane vector helpers of flash_core's fast path: FMA, max, horizontal
 * reductions of score accumulators, the softmax's exp, an 8 x 8 transpose. With
 * AVX2 + FMA + F16C (FC_X86) they are intrinsics; on AArch64 the reductions (the
 * scores of a decode step's keys, the softmax's max and sum) are NEON's pairwise and
 * across-lane instructions (SDPA_HAVE_NEON) and the F16 / BF16 / int8 loads common.h's;
 * elsewhere GCC vector code. */
#ifndef SDPA_PROBE_FLASH_VEC_H
#define SDPA_PROBE_FLASH_VEC_H

#include "common.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define FC_X86 1
#endif

SDPA_INLINE v8f fc_fma(v8f a, v8f b, v8f c) { /* a * b + c */
#ifdef FC_X86
  return (v8f)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  return a * b + c;
#endif
}

SDPA_INLINE v8f fc_max(v8f a, v8f b) {
#ifdef FC_X86
  return (v8f)_mm256_max_ps((__m256)a, (__m256)b);
#else
  return v8f_select((v8i)(a > b), a, b);
#endif
}

#ifndef FC_X86
/* Lane i of the result is the sum of the lanes of a[i]. */
SDPA_INLINE v8f fc_hsum8(const v8f *a) {
#ifdef SDPA_HAVE_NEON
  float32x4_t s[8];
  for (int i = 0; i < 8; i++) s[i] = vaddq_f32(sdpa_v8f_lo(a[i]), sdpa_v8f_hi(a[i]));
  float32x4_t lo = vpaddq_f32(vpaddq_f32(s[0], s[1]), vpaddq_f32(s[2], s[3]));
  float32x4_t hi = vpaddq_f32(vpaddq_f32(s[4], s[5]), vpaddq_f32(s[6], s[7]));
  return sdpa_v8f_halves(lo, hi);
#else
  v8f r;
  for (int i = 0; i < 8; i++) r[i] = v8f_hsum(a[i]);
  return r;
#endif
}
#endif

SDPA_INLINE v8i fc_set1i(int32_t x) { return (v8i){x, x, x, x, x, x, x, x}; }

/* y[0:n] *= alpha (the same rounding as sdpa_scal, vectorised). */
SDPA_INLINE void fc_scal(float *y, float alpha, int64_t n) {
  v8f va = v8f_set1(alpha);
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) v8f_store(y + d, v8f_load(y + d) * va);
  for (; d < n; d++) y[d] *= alpha;
}

#ifdef FC_X86
/* The 8 reduced scores (lo: lanes 0-3, hi: 4-7) to their rows: lane r * (8 / NR) + k
 * is row r's score of key j + k. */
SDPA_INLINE void fc_store_lanes(const int NR, __m128 lo, __m128 hi, float *S, int64_t sst,
                                int64_t j) {
  if (NR == 1) {
    _mm_storeu_ps(S + j, lo);
    _mm_storeu_ps(S + j + 4, hi);
  } else if (NR == 2) {
    _mm_storeu_ps(S + j, lo);
    _mm_storeu_ps(S + sst + j, hi);
  } else {
    _mm_storel_pi((__m64 *)(S + j), lo);
    _mm_storeh_pi((__m64 *)(S + sst + j), lo);
    _mm_storel_pi((__m64 *)(S + 2 * sst + j), hi);
    _mm_storeh_pi((__m64 *)(S + 3 * sst + j), hi);
  }
}
#endif

/* Lane r * (8 / NR) + k of the reduced acc[] is row r's score of key j + k. */
SDPA_INLINE void fc_store_scores(const int NR, const v8f *acc, float *S, int64_t sst, int64_t j) {
#ifdef FC_X86
  /* two hadd levels, then 128-bit halves (vperm2f128 is slow on Zen) */
  __m256 t0 = _mm256_hadd_ps((__m256)acc[0], (__m256)acc[1]);
  __m256 t1 = _mm256_hadd_ps((__m256)acc[2], (__m256)acc[3]);
  __m256 t2 = _mm256_hadd_ps((__m256)acc[4], (__m256)acc[5]);
  __m256 t3 = _mm256_hadd_ps((__m256)acc[6], (__m256)acc[7]);
  __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(u0), _mm256_extractf128_ps(u0, 1));
  __m128 hi = _mm_add_ps(_mm256_castps256_ps128(u1), _mm256_extractf128_ps(u1, 1));
  fc_store_lanes(NR, lo, hi, S, sst, j);
#else
  v8f s = fc_hsum8(acc);
  const int KS = 8 / NR;
  for (int r = 0; r < NR; r++)
    for (int k = 0; k < KS; k++) S[r * sst + j + k] = s[r * KS + k];
#endif
}

#ifdef FC_X86
/* fc_store_scores for int32 sums: reduced in integers (exact), then one
 * conversion per 4 scores instead of one per 8-lane accumulator (a conversion
 * costs ~3 cycles on Zen-class cores, an integer add one). */
SDPA_INLINE void fc_store_scores_i32(const int NR, const __m256i *acc, float *S, int64_t sst,
                                     int64_t j) {
  __m256i t0 = _mm256_hadd_epi32(acc[0], acc[1]), t1 = _mm256_hadd_epi32(acc[2], acc[3]);
  __m256i t2 = _mm256_hadd_epi32(acc[4], acc[5]), t3 = _mm256_hadd_epi32(acc[6], acc[7]);
  __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
  __m128 lo = _mm_cvtepi32_ps(
      _mm_add_epi32(_mm256_castsi256_si128(u0), _mm256_extracti128_si256(u0, 1)));
  __m128 hi = _mm_cvtepi32_ps(
      _mm_add_epi32(_mm256_castsi256_si128(u1), _mm256_extracti128_si256(u1, 1)));
  fc_store_lanes(NR, lo, hi, S, sst, j);
}

/* acc + the pairwise 16-bit products of a and b: one AVX-VNNI instruction
 * where the CPU has it (Intel client cores from Alder Lake on have it without
 * AVX-512), else a multiply-add and an add */
SDPA_INLINE __m256i fc_dpwssd(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVXVNNI__)
  return _mm256_dpwssd_avx_epi32(acc, a, b);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, a, b);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}
#endif

/* 8 x 8 transpose: out[i][k] = in[k][i]. */
SDPA_INLINE void fc_transpose8(v8f *r) {
#ifdef FC_X86
  __m256 t0 = _mm256_unpacklo_ps((__m256)r[0], (__m256)r[1]);
  __m256 t1 = _mm256_unpackhi_ps((__m256)r[0], (__m256)r[1]);
  __m256 t2 = _mm256_unpacklo_ps((__m256)r[2], (__m256)r[3]);
  __m256 t3 = _mm256_unpackhi_ps((__m256)r[2], (__m256)r[3]);
  __m256 t4 = _mm256_unpacklo_ps((__m256)r[4], (__m256)r[5]);
  __m256 t5 = _mm256_unpackhi_ps((__m256)r[4], (__m256)r[5]);
  __m256 t6 = _mm256_unpacklo_ps((__m256)r[6], (__m256)r[7]);
  __m256 t7 = _mm256_unpackhi_ps((__m256)r[6], (__m256)r[7]);
  __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = (v8f)_mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = (v8f)_mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = (v8f)_mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = (v8f)_mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = (v8f)_mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = (v8f)_mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = (v8f)_mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = (v8f)_mm256_permute2f128_ps(u3, u7, 0x31);
#else
  v8f t[8];
  for (int i = 0; i < 8; i++)
    for (int k = 0; k < 8; k++) t[i][k] = r[k][i];
  for (int i = 0; i < 8; i++) r[i] = t[i];
#endif
}

/* exp(x) for the softmax (x = score - running max <= 0, -inf or NaN): the
 * range reduction and polynomial of common.h's v8f_exp, with FMAs and a
 * rounding instruction. exp(x < -87.34) = 0, exp(-inf) = 0, NaN propagates. */
SDPA_INLINE v8f fc_exp(v8f x) {
#ifdef FC_X86
  const __m256 lo = _mm256_set1_ps(SDPA_EXP_LO), hi = _mm256_set1_ps(SDPA_EXP_HI);
  __m256 X = (__m256)x;
  __m256 keep = _mm256_cmp_ps(X, lo, _CMP_NLT_UQ); /* x >= lo, or NaN */
  __m256 xc = _mm256_min_ps(hi, _mm256_max_ps(lo, X)); /* NaN passes through (src2) */
  __m256 fx = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(SDPA_EXP_LOG2E)),
                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(SDPA_EXP_LN2_HI), xc);
  r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(SDPA_EXP_LN2_LO), r);
  __m256 p;
  SDPA_EXP_POLY(_mm256_fmadd_ps, _mm256_set1_ps, r, p);
  p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  __m256i n = _mm256_cvtps_epi32(fx);
  __m256 pow2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
  return (v8f)_mm256_and_ps(_mm256_mul_ps(p, pow2), keep);
#else
  return v8f_exp(x);
#endif
}

SDPA_INLINE float fc_hmax(v8f v) {
#ifdef FC_X86
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128((__m256)v), _mm256_extractf128_ps((__m256)v, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  return _mm_cvtss_f32(m4);
#elif defined(SDPA_HAVE_NEON)
  return vmaxvq_f32(vmaxq_f32(sdpa_v8f_lo(v), sdpa_v8f_hi(v)));
#else
  return v8f_hmax(v);
#endif
}

SDPA_INLINE float fc_hsum(v8f v) {
#ifdef FC_X86
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128((__m256)v), _mm256_extractf128_ps((__m256)v, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
  return _mm_cvtss_f32(s4);
#elif defined(SDPA_HAVE_NEON)
  return vaddvq_f32(vaddq_f32(sdpa_v8f_lo(v), sdpa_v8f_hi(v)));
#else
  return v8f_hsum(v);
#endif
}

SDPA_INLINE int fc_any(v8i m) {
#ifdef FC_X86
  return _mm256_movemask_ps((__m256)m) != 0;
#elif defined(SDPA_HAVE_NEON)
  uint32x4_t lo, hi;
  memcpy(&lo, &m, 16);
  memcpy(&hi, (const char *)&m + 16, 16);
  return vmaxvq_u32(vorrq_u32(lo, hi)) != 0;
#else
  int any = 0;
  for (int i = 0; i < 8; i++) any |= m[i] != 0;
  return any;
#endif
}

#endif
