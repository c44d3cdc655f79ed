/* flash_core's AVX-512 block path for decode tasks, as inline code that
 * flash_x512_<dtype>.c instantiate: one key block for every
 * kv head of the task, K and V read in memory order.
 *
 * Why memory order: with a [B, S, H, D] cache a decode task reads every head
 * of a position range. Walked one head at a time (a register tile per head),
 * that is a strided walk the hardware prefetchers do not follow: on Zen 5 a
 * read in that order streams 14-24 GB/s from DRAM on one core where a linear
 * read streams 30-35, and software prefetch of the next block recovers only
 * part of it while costing 20-40 % when the cache is in L3. So here every
 * loop over K or V goes position by position, heads within a position, and
 * leaves the prefetching to the hardware.
 *
 * - Scores: lanes are rows. For each key, the rows of 16 / R heads at a time
 *   (16 accumulators, each K vector loaded and converted once for its head's
 *   R rows, Q packed so that its vectors sit at constant offsets) are reduced
 *   together into one vector of 16 scores (four shuffle-and-add levels), stored
 *   key-major: S[j][row].
 * - Softmax, vertical: a row's max, NaN check, exp and sum are lane-wise
 *   across the block's keys, so there is no horizontal reduction at all; the
 *   rescale factors of 16 rows come from one vector exp.
 * - P.V, 4 to 16 keys at a time (FX_PV_KEYS): for each head, a slice of up
 *   to 8 vectors of each of its rows' accumulator in registers while the keys'
 *   V rows stream through.
 * - int8 K/V: (x - zero point) in int32 then converted, in registers; the
 *   per-key scales broadcast to their rows' lanes by a permute, read in place
 *   from the tensors when each position's heads are adjacent. int8 Q and K:
 *   exact integer dot products. With 4 or more rows per head, transposed
 *   (fx_dot_iqt: lanes over keys, VNNI vpdpbusd, no reduction tree); with
 *   fewer, int16 vpdpwssd and the reduction.
 *
 * Semantics are flash_core's fast path's (and the ABI's): keys past a row's
 * limit are -inf, a NaN score poisons its row, a row that sees nothing in the
 * block is left as it was; nothing is read past the block's keys, the task's
 * heads or head_dim.
 */
#ifndef SDPA_PROBE_FLASH_X512_BLOCK_H
#define SDPA_PROBE_FLASH_X512_BLOCK_H

#include <math.h>

#include "flash_x512.h"

#ifdef SDPA_HAVE_AVX512
#define FX512 1
#endif

/* rows padded to whole 16-lane chunks */
#define FX_PAD16(n) (((n) + 15) & ~(int64_t)15)

/* int8 Q and K with at least 4 rows per head: Q.K^T by the transposed VNNI path
 * (fx_dot_iqt); fewer rows do not pay back the K transpose. */
#ifdef __AVX512VNNI__
#define FX_IQT(R) ((R) >= 4)
#else
#define FX_IQT(R) 0
#endif

#ifdef FX512

/* The copies of the block, [dtype][R = 1, 2, 4, 8, 16] (flash_x512_<dtype>.c). */
#define FX_DECL_R(NAME)                                                               \
  void flash_x512_blk_##NAME##_1(const flash_x512_block *b);                          \
  void flash_x512_blk_##NAME##_2(const flash_x512_block *b);                          \
  void flash_x512_blk_##NAME##_4(const flash_x512_block *b);                          \
  void flash_x512_blk_##NAME##_8(const flash_x512_block *b);                          \
  void flash_x512_blk_##NAME##_16(const flash_x512_block *b);
FX_DECL_R(f32)
FX_DECL_R(f16)
FX_DECL_R(bf16)
FX_DECL_R(i8)
FX_DECL_R(iq)
#undef FX_DECL_R

/* The cross prefetches are spread over the loop they overlap, not issued in a
 * burst (a burst stalls on the line fill buffers; see fx_pv): nl lines over n
 * steps taken in order, step k the lines [k nl / n, (k + 1) nl / n), kept as a
 * running split so that a step costs no 64-bit division (two a step, some 200 a
 * block, where n is not a compile-time constant: removing them made (32, 8, 64)
 * decode 1.5-2.5 % faster on the Xeon). */
typedef struct {
  int64_t next, rem, q, r, n;
  int l2; /* prefetcht1, not prefetcht0 */
} fx_spread;
SDPA_INLINE fx_spread fx_spread_of(int64_t nl, int64_t n, int l2) {
  const fx_spread s = {0, 0, nl / n, nl % n, n, l2};
  return s;
}
SDPA_INLINE void fx_spread_step(fx_spread *s, const char *base) {
  const int64_t lo = s->next;
  s->next += s->q;
  s->rem += s->r;
  if (s->rem >= s->n) s->rem -= s->n, s->next++;
  if (s->l2)
    for (int64_t l = lo; l < s->next; l++) _mm_prefetch(base + 64 * l, _MM_HINT_T1);
  else
    for (int64_t l = lo; l < s->next; l++) _mm_prefetch(base + 64 * l, _MM_HINT_T0);
}

/* Lane i of the result is the sum of the lanes of a[i]: four levels of
 * shuffle-and-add, the leaves taken in the order that lands a[i]'s sum in
 * lane i. FX_ADD / FX_SH* work on float or int32 lanes. */
#define FX_LEAF {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15}
#define FX_HSUM16(T, ADD, SH4, SHP)                                                           \
  static const int leaf[16] = FX_LEAF;                                                        \
  T b[8], c[4], d[2];                                                                         \
  _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {                                        \
    const T x = a[leaf[i]], y = a[leaf[i + 8]];                                               \
    b[i] = ADD(SH4(x, y, 0x44), SH4(x, y, 0xEE));                                             \
  }                                                                                           \
  _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) c[i] =                                   \
      ADD(SH4(b[i], b[i + 4], 0x88), SH4(b[i], b[i + 4], 0xDD));                              \
  _Pragma("GCC unroll 2") for (int i = 0; i < 2; i++) d[i] =                                   \
      ADD(SHP(c[i], c[i + 2], 0x44), SHP(c[i], c[i + 2], 0xEE));                              \
  return ADD(SHP(d[0], d[1], 0x88), SHP(d[0], d[1], 0xDD));

SDPA_INLINE __m512 fx_hsum16(const __m512 *a) {
  FX_HSUM16(__m512, _mm512_add_ps, _mm512_shuffle_f32x4, _mm512_shuffle_ps)
}

#define FX_SH4I(x, y, imm) \
  _mm512_castps_si512(_mm512_shuffle_f32x4(_mm512_castsi512_ps(x), _mm512_castsi512_ps(y), imm))
#define FX_SHPI(x, y, imm) \
  _mm512_castps_si512(_mm512_shuffle_ps(_mm512_castsi512_ps(x), _mm512_castsi512_ps(y), imm))
SDPA_INLINE __m512i fx_hsum16i(const __m512i *a) {
  FX_HSUM16(__m512i, _mm512_add_epi32, FX_SH4I, FX_SHPI)
}

SDPA_INLINE __mmask16 fx_first(int64_t m) { /* lanes [0, m) */
  return m <= 0 ? 0 : m >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << m) - 1u);
}

/* Scores of one key against the 16 rows of a chunk (16 / R heads from the
 * one at kh; heads past nhc repeat the last one, their lanes junk). Qp: the
 * chunk's packed Q. kz: I8 zero points of this key's heads from the chunk's
 * first. */
SDPA_INLINE __m512 fx_dot_f(const int R, const int DT, const float *SDPA_RESTRICT Qp, int64_t D,
                            const char *kh, int64_t ks2, int64_t nhc, const int8_t *kz,
                            const char *pv, int64_t pvl, int pl2) {
  const int HPC = 16 / R;
  const int64_t isz = sdpa_isz(DT);
  const char *kr[16];
  __m512i zk[16];
#pragma GCC unroll 16
  for (int h = 0; h < HPC; h++) {
    const int64_t hh = h < nhc ? h : nhc - 1;
    kr[h] = kh + hh * ks2;
    zk[h] = DT == SDPA_I8 ? _mm512_set1_epi32(kz[hh]) : _mm512_setzero_si512();
  }
  __m512 acc[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
  fx_spread pf = fx_spread_of(pvl, D / 16, pl2); /* this key's V rows, over the dims */
#pragma GCC unroll 16
  for (int64_t d = 0; d < D; d += 16, Qp += 256) {
    fx_spread_step(&pf, pv);
#pragma GCC unroll 16
    for (int h = 0; h < HPC; h++) {
      const __m512 kv = sdpa_ld16(kr[h] + d * isz, DT, zk[h]);
#pragma GCC unroll 16
      for (int r = 0; r < R; r++)
        acc[h * R + r] = _mm512_fmadd_ps(_mm512_loadu_ps(Qp + 16 * (h * R + r)), kv, acc[h * R + r]);
    }
  }
  return fx_hsum16(acc);
}

/* P.V goes over the block FX_PV_KEYS keys at a time (the tail 1 at a
 * time), every head in turn, a slice of 16 / R vectors (at most 8) of each
 * row's accumulator in registers while the keys' V rows of its head stream
 * through. More keys a visit load and store the slice less often; with the
 * next block's K prefetch spread over the heads, 16 keys were the fastest for
 * int8 (Xeon, (32, 8, 64) kv 8192: 1.19x warm, 1.08x cold against 4) and, once
 * half of its next K moved to the scores (fx_next_k_early), for F16 (1.04-1.07x
 * warm in four of five runs, 1.02-1.04x cold against 8, which had been 1.10x
 * against 4), 8 for BF16 (16: 0.98-1.02x) and 4 for F32 (8 or 16: 4 % slower)
 * and for one row per head (16 for int8 at (16, 16, 128): 4 % slower). With
 * the prefetch in one burst per visit, Zen 5 had measured 16 keys 10-20 %
 * slower cold. */
#define FX_PV_KEYS(DT, R) \
  ((R) == 1 || (DT) == SDPA_F32 ? 4 : (DT) == SDPA_I8 || (DT) == SDPA_F16 ? 16 : 8)

/* Float Q.K^T of the block head by head (FX_HO): raw scores into S[j][row].
 * A head's R rows' Q stay in registers while its keys go by KG = 16 / R at a
 * time, and the KG x R dot products of a group are reduced together into one
 * vector, lane t R + r holding key t's score for row r. Against fx_dot_f's
 * key-by-key walk (every Q vector a memory operand of its FMA: 16 loads per
 * (key, head) at R = 4, head_dim 64) this is 2.2x faster in isolation on Zen 5.
 * The block's K rows are in cache by now (the cross prefetch), so the walk
 * across positions within a head costs nothing; the block's V rows are
 * prefetched here, spread over the groups. */
#define FX_HO(R, DC) ((R) >= 2 && (DC) != 0 && (R) * (DC) <= 256)
/* The next block's keys whose K rows are prefetched during this block's
 * scores, beside its V rows; P.V prefetches the rest (a multiple of its keys a
 * visit). Only F16 blocks in the L2 regime: prefetched during P.V alone, the
 * next block's K had asked for 32 KiB in the shorter phase of the two, and with
 * K / V rotated past the L3 ((32, 8, 64) kv 8192 and 32768, 2 threads) the
 * first half moved to the scores made F16 decode 1.03-1.14x faster in five
 * interleaved runs, warm 0.97-1.004x; moving a quarter did nothing, three
 * quarters or all of it the same cold, all of it 0.95x warm. F32 (64 KiB) was
 * 0.94x warm and 1.00-1.04x cold; int8 (16 KiB) is not in the L2 regime. */
SDPA_INLINE int64_t fx_next_k_early(const int R, const int DT, const int DC, const int PL2,
                                    const flash_x512_block *b) {
  if (!PL2 || DT != SDPA_F16 || !FX_HO(R, DC) || !b->pf_bytes) return 0;
  return b->next_n / 2 / FX_PV_KEYS(DT, R) * FX_PV_KEYS(DT, R);
}

SDPA_INLINE void fx_scores_ho(const int R, const int DT, const int DC, const int PL2,
                              const flash_x512_block *b) {
  const int KG = 16 / R, DV = DC / 16;
  const int64_t n = b->n, nh = b->nh, rp = FX_PAD16(nh * R), isz = sdpa_isz(DT);
  const int64_t ngr = (n + KG - 1) / KG;
  /* the block's V lines (0: no prefetch), over the (head, key group) steps */
  fx_spread pf = fx_spread_of((n * b->pf_bytes + 63) / 64, nh * ngr, PL2);
  fx_spread pfk = fx_spread_of((fx_next_k_early(R, DT, DC, PL2, b) * b->pf_bytes + 63) / 64, nh * ngr, PL2);
  const float *Qp = (const float *)b->Qp;
  for (int64_t h = 0; h < nh; h++) {
    __m512 q[16];
    const int64_t f0 = h * R;
    const float *qh = Qp + (f0 / 16) * 16 * DC + (f0 % 16) * 16;
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
#pragma GCC unroll 16
      for (int c = 0; c < DV; c++) q[r * DV + c] = _mm512_loadu_ps(qh + c * 256 + r * 16);
    const char *kh = b->K + h * b->ks2;
    for (int64_t j0 = 0; j0 < n; j0 += KG) {
      fx_spread_step(&pf, b->V);
      fx_spread_step(&pfk, b->next_k);
      const int64_t nk = n - j0 < KG ? n - j0 : KG;
      __m512 acc[16];
#pragma GCC unroll 16
      for (int t = 0; t < KG; t++) {
        const int64_t j = j0 + (t < nk ? t : nk - 1); /* (past the block: a repeat, not stored) */
        const char *k = kh + j * b->ks1;
        const __m512i z = DT == SDPA_I8 ? _mm512_set1_epi32(b->kz[j * b->kq1 + h]) : _mm512_setzero_si512();
        __m512 kv[16];
#pragma GCC unroll 16
        for (int c = 0; c < DV; c++) kv[c] = sdpa_ld16(k + 16 * c * isz, DT, z);
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
          __m512 a = _mm512_mul_ps(q[r * DV], kv[0]);
#pragma GCC unroll 16
          for (int c = 1; c < DV; c++) a = _mm512_fmadd_ps(q[r * DV + c], kv[c], a);
          acc[t * R + r] = a;
        }
      }
      const __m512 x = fx_hsum16(acc);
      float *s = b->S + j0 * rp + f0;
      if (KG == 1) {
        _mm512_storeu_ps(s, x);
      } else {
#pragma GCC unroll 16
        for (int t = 0; t < KG; t++) /* key t's R lanes to its S row */
          if (t < nk)
            _mm512_mask_storeu_ps(s + t * (rp - R), (__mmask16)(((1u << R) - 1u) << (t * R)), x);
      }
    }
  }
}

SDPA_INLINE __m512i fx_dpwssd(__m512i acc, __m512i a, __m512i b) { /* acc + pairwise a * b */
#ifdef __AVX512VNNI__
  return _mm512_dpwssd_epi32(acc, a, b);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
}

/* fx_dot_f for int8 Q and K: (q - zq) . k, exact in int32, as float (exact
 * below 2^24: head_dim <= 256). Qp: int16, 32 dims per step, zero-padded. */
SDPA_INLINE __m512 fx_dot_iq(const int R, const int16_t *SDPA_RESTRICT Qp, int64_t D,
                             const char *kh, int64_t ks2, int64_t nhc, const char *pv, int64_t pvl,
                             int pl2) {
  const int HPC = 16 / R;
  const char *kr[16];
#pragma GCC unroll 16
  for (int h = 0; h < HPC; h++) kr[h] = kh + (h < nhc ? h : nhc - 1) * ks2;
  __m512i acc[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_si512();
  fx_spread pf = fx_spread_of(pvl, D / 16, pl2); /* this key's V rows, 16 dims a step */
  int64_t d = 0;
#pragma GCC unroll 8
  for (; d + 32 <= D; d += 32, Qp += 512) {
    fx_spread_step(&pf, pv);
    fx_spread_step(&pf, pv);
#pragma GCC unroll 16
    for (int h = 0; h < HPC; h++) {
      const __m512i kv = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(kr[h] + d)));
#pragma GCC unroll 16
      for (int r = 0; r < R; r++)
        acc[h * R + r] = fx_dpwssd(acc[h * R + r], _mm512_loadu_si512((const void *)(Qp + 32 * (h * R + r))), kv);
    }
  }
  if (d < D) { /* 16 dims left (Q's upper lanes are zero) */
    fx_spread_step(&pf, pv);
#pragma GCC unroll 16
    for (int h = 0; h < HPC; h++) {
      const __m512i kv = _mm512_cvtepi8_epi16(
          _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(kr[h] + d))));
#pragma GCC unroll 16
      for (int r = 0; r < R; r++)
        acc[h * R + r] = fx_dpwssd(acc[h * R + r], _mm512_loadu_si512((const void *)(Qp + 32 * (h * R + r))), kv);
    }
  }
  return _mm512_cvtepi32_ps(fx_hsum16i(acc));
}

/* exp(x) for the softmax (x = score - running max <= 0, -inf or NaN): the
 * range reduction and polynomial of flash_core's fc_exp, 16 lanes, scalef for
 * the power of two. exp(x < -87.34) = 0, exp(-inf) = 0, NaN propagates. */
SDPA_INLINE __m512 fx_exp(__m512 x) {
  const __m512 lo = _mm512_set1_ps(SDPA_EXP_LO), hi = _mm512_set1_ps(SDPA_EXP_HI);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ); /* x >= lo, or NaN */
  const __m512 xc = _mm512_min_ps(hi, _mm512_max_ps(lo, x));    /* NaN passes through */
  const __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(SDPA_EXP_LOG2E)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(SDPA_EXP_LN2_HI), xc);
  r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(SDPA_EXP_LN2_LO), r);
  __m512 p;
  SDPA_EXP_POLY(_mm512_fmadd_ps, _mm512_set1_ps, r, p);
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, fx));
}

/* A per-head value of this chunk's heads (p[0 .. nhc)) in each of its rows' lanes. */
SDPA_INLINE __m512 fx_heads_ps(__m512i head_of_lane, __mmask16 heads, const float *p) {
  return _mm512_permutexvar_ps(head_of_lane, _mm512_maskz_loadu_ps(heads, p));
}
SDPA_INLINE __m512i fx_heads_epi8(__m512i head_of_lane, __mmask16 heads, const int8_t *p) {
  return _mm512_permutexvar_epi32(head_of_lane, _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(heads, p)));
}

/* Lane constants of a block (the same for every chunk: R divides 16). */
typedef struct {
  __m512i head_of_lane; /* f / R: the lane's head within its chunk */
  __m512i row_of_lane;  /* the lane's query row */
  __m512i lim;          /* the lane's query row sees keys [0, lim) */
  int all_visible;       /* every row sees every key of the block */
} fx_lanes;

SDPA_INLINE fx_lanes fx_lanes_of(const int R, const flash_x512_block *b) {
  int32_t hl[16], il[16], ll[16];
  for (int f = 0; f < 16; f++) {
    hl[f] = f / R;
    il[f] = (int32_t)((f % R) % b->qbr); /* row r = g * qbr + i */
    ll[f] = (int32_t)b->lim[il[f]];
  }
  int all = 1;
  for (int64_t i = 0; i < b->qbr; i++) all &= b->lim[i] >= b->n;
  fx_lanes L = {_mm512_loadu_si512(hl), _mm512_loadu_si512(il), _mm512_loadu_si512(ll), all};
  return L;
}

/* 16 x 16 transpose of 32-bit lanes: afterwards r[i] lane t is r[t] lane i
 * before. 64 shuffles: within 128-bit lanes (two unpack levels), then the
 * 128-bit lanes themselves. */
SDPA_INLINE void fx_transpose16(__m512i *r) {
  __m512i t[16], u[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) { /* u[4i + e] 128-bit lane L: column 4L + e of rows 4i .. 4i + 3 */
    u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
#pragma GCC unroll 4
  for (int e = 0; e < 4; e++) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x44);
    const __m512i v1 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xEE);
    r[e] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    r[4 + e] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    r[8 + e] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    r[12 + e] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
}

/* What a chunk's scores need besides Q.K^T. */
typedef struct {
  int64_t c, h0;         /* the chunk and its first head */
  __mmask16 heads;       /* its heads' lanes in per-head loads */
  __m512 qs, qf;         /* integer Q.K^T: sum(q - zq), scale * q_scale per row */
  __m512 mx;             /* lane-wise max so far */
  __mmask16 nan;         /* NaN lanes so far */
} fx_chunk;

/* Key j's Q.K^T x of a chunk's rows finished into S[j][chunk's rows]: int8
 * scales and zero points, the mask, -inf where a row must not see the key;
 * the chunk's max and NaN lanes updated. */
SDPA_INLINE void fx_score_key(const int KDT, const int IQK, const flash_x512_block *b,
                              const fx_lanes *L, fx_chunk *ch, int64_t j, __m512 x) {
  const int64_t nh = b->nh, h0 = ch->h0;
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  if (KDT == SDPA_I8) {
    const __m512 ksc = fx_heads_ps(L->head_of_lane, ch->heads, b->ksc + j * b->kq1 + h0);
    if (IQK) {
      const __m512 zk =
          _mm512_cvtepi32_ps(fx_heads_epi8(L->head_of_lane, ch->heads, b->kz + j * b->kq1 + h0));
      x = _mm512_mul_ps(_mm512_mul_ps(_mm512_fnmadd_ps(zk, ch->qs, x), ksc), ch->qf);
    } else {
      x = _mm512_mul_ps(x, ksc);
    }
  }
  if (L->all_visible) {
    if (b->mask)
      x = _mm512_add_ps(x, _mm512_permutexvar_ps(L->row_of_lane, _mm512_loadu_ps(b->mask + j * 16)));
  } else {
    const __mmask16 vis = _mm512_cmpgt_epi32_mask(L->lim, _mm512_set1_epi32((int32_t)j));
    if (b->mask)
      x = _mm512_mask_add_ps(
          x, vis, x, _mm512_permutexvar_ps(L->row_of_lane, _mm512_loadu_ps(b->mask + j * 16)));
    x = _mm512_mask_blend_ps(vis, ninf, x);
  }
  ch->mx = _mm512_max_ps(ch->mx, x);
  ch->nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  _mm512_storeu_ps(b->S + j * FX_PAD16(nh * b->R) + ch->c * 16, x);
}

#ifdef __AVX512VNNI__
/* acc + u . (the 4 signed bytes at p, in every lane): gcc 12 does not fold the
 * broadcast into vpdpbusd's memory operand by itself. */
typedef int32_t fx_u32 __attribute__((may_alias, aligned(1)));
SDPA_INLINE __m512i fx_dpbusd_bcst(__m512i acc, __m512i u, const void *p) {
  __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const fx_u32 *)p));
  return acc;
}

/* Integer Q.K^T of 16 keys from j0 (nk of them, the rest zero) against a
 * chunk's 16 rows, transposed: lanes are keys, as VNNI vpdpbusd wants them.
 * Each head's K rows (16 keys x 4 dims a lane) are transposed so that lane t
 * holds key t's 4 dims of a dword group, and each row's dword of Q of that
 * group is a broadcast memory operand. vpdpbusd multiplies unsigned by signed
 * bytes, so K goes in as k + 128 and (q - zq) . k =
 * q . (k + 128) - zq sum(k + 128) - 128 sum(q - zq), exact in int32. One
 * more transpose turns the 16 rows' vectors into one vector per key. Per
 * (key, head) at R = 4 and head_dim 64 that is about 11 vector operations
 * against 24 for the shuffle-and-add reduction of fx_dot_iq. */
SDPA_INLINE void fx_dot_iqt(const int R, const int DC, const flash_x512_block *b, int64_t c,
                            int64_t j0, int64_t nk, __m512i *x, fx_spread *pf) {
  const int HPC = 16 / R;
  const int64_t D = DC ? DC : b->D, nh = b->nh, ndw = D / 4, rp = FX_PAD16(nh * R);
  const int64_t h0 = c * HPC, nhc = nh - h0 < HPC ? nh - h0 : HPC;
  const int32_t *cz = (const int32_t *)b->Qp + c * 16, *cs = cz + rp;
  const int8_t *q = (const int8_t *)((const int32_t *)b->Qp + 2 * rp) + c * 16 * D;
  const __m512i ones = _mm512_set1_epi8(1), flip = _mm512_set1_epi8((char)0x80);
  /* the heads as a loop, not unrolled: a head's steps are some 200 instructions,
   * and four copies of them made int8 (32, 8, 64) decode 3-5 % slower on the Xeon
   * (kv 2048-32768); in isolation the Q.K^T went from 10.6 to 9.1 cycles a
   * (key, head) */
#pragma GCC unroll 1
  for (int h = 0; h < HPC; h++) {
    if (h >= nhc) {
#pragma GCC unroll 16
      for (int r = 0; r < R; r++) x[h * R + r] = _mm512_setzero_si512();
      continue;
    }
    fx_spread_step(pf, b->V); /* this block's V rows */
    const char *kh = b->K + (h0 + h) * b->ks2 + j0 * b->ks1;
    __m512i acc[16], sk = _mm512_setzero_si512();
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_si512();
    for (int64_t g0 = 0; g0 < ndw; g0 += 16) {
      const int64_t w = ndw - g0 < 16 ? ndw - g0 : 16;
      const __mmask16 dw = fx_first(w);
      __m512i kt[16];
      if (nk == 16 && w == 16) { /* (plain loads: the common case) */
#pragma GCC unroll 16
        for (int t = 0; t < 16; t++) kt[t] = _mm512_loadu_si512((const void *)(kh + t * b->ks1 + g0 * 4));
      } else {
#pragma GCC unroll 16
        for (int t = 0; t < 16; t++)
          kt[t] = _mm512_maskz_loadu_epi32(t < nk ? dw : 0, kh + t * b->ks1 + g0 * 4);
      }
      fx_transpose16(kt);
#pragma GCC unroll 16
      for (int g = 0; g < 16; g++) {
        if (g >= w) break;
        const __m512i ku = _mm512_xor_si512(kt[g], flip); /* k + 128 */
        sk = _mm512_dpbusd_epi32(sk, ku, ones);
#pragma GCC unroll 16
        for (int r = 0; r < R; r++)
          acc[r] = fx_dpbusd_bcst(acc[r], ku, q + (h * R + r) * D + (g0 + g) * 4);
      }
    }
    /* (the K lanes past nk hold 128 per dim, their scores junk, never read) */
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) {
      const int f = h * R + r;
      x[f] = _mm512_sub_epi32(
          _mm512_sub_epi32(acc[r], _mm512_mullo_epi32(_mm512_set1_epi32(cz[f]), sk)),
          _mm512_set1_epi32(cs[f]));
    }
  }
  fx_transpose16(x);
}

#else
SDPA_INLINE void fx_dot_iqt(const int R, const int DC, const flash_x512_block *b, int64_t c,
                            int64_t j0, int64_t nk, __m512i *x, fx_spread *pf) {
  (void)R, (void)DC, (void)b, (void)c, (void)j0, (void)nk, (void)x, (void)pf; /* FX_IQT is 0 */
}
#endif

/* Scores of every key of the block for every row into S[j][row]: scaled,
 * masked, -inf where a row must not see the key; chunk by chunk of 16 rows
 * (each chunk's K rows are consecutive within a position). Each chunk's
 * lane-wise max and NaN lanes go to mx[chunk] and nan[chunk]. */
SDPA_INLINE void fx_scores(const int R, const int KDT, const int IQK, const int DC, const int PL2,
                           const flash_x512_block *b, const fx_lanes *L, float *mx,
                           __mmask16 *nan) {
  const int HPC = 16 / R;
  const int64_t D = DC ? DC : b->D, n = b->n, nh = b->nh, rows = nh * R, rp = FX_PAD16(rows);
  const int64_t nch = rp / 16;
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  const size_t qstep = IQK ? 16 * (size_t)((D + 31) / 32) * 32 * 2 : 16 * (size_t)D * 4;
  const int ho = !IQK && FX_HO(R, DC), iqt = IQK && FX_IQT(R);
  /* iqt: the block's V lines over its (chunk, 16 keys, head) steps */
  fx_spread pf = fx_spread_of(iqt ? (n * b->pf_bytes + 63) / 64 : 0, nh * ((n + 15) / 16), PL2);
  if (ho) fx_scores_ho(R, KDT, DC, PL2, b);
  for (int64_t c = 0; c < nch; c++) {
    const int64_t h0 = c * HPC, nhc = nh - h0 < HPC ? nh - h0 : HPC;
    const __mmask16 lanes = fx_first(rows - c * 16);
    fx_chunk ch = {c, h0, fx_first(nhc), ninf, ninf, ninf, 0};
    if (IQK) {
      ch.qs = _mm512_maskz_loadu_ps(lanes, b->qs + c * 16);
      ch.qf = _mm512_maskz_loadu_ps(lanes, b->qf + c * 16);
    }
    if (iqt) {
      for (int64_t j0 = 0; j0 < n; j0 += 16) {
        const int64_t nk = n - j0 < 16 ? n - j0 : 16;
        __m512i x[16];
        fx_dot_iqt(R, DC, b, c, j0, nk, x, &pf);
        for (int64_t t = 0; t < nk; t++)
          fx_score_key(KDT, IQK, b, L, &ch, j0 + t, _mm512_cvtepi32_ps(x[t]));
      }
    } else if (ho) {
      for (int64_t j = 0; j < n; j++)
        fx_score_key(KDT, IQK, b, L, &ch, j, _mm512_maskz_loadu_ps(lanes, b->S + j * rp + c * 16));
    } else {
      const char *qp = (const char *)b->Qp + c * qstep;
      const char *kh = b->K + h0 * b->ks2;
      /* chunk 0 prefetches each key's V rows, spread over its dot products */
      const int64_t pvl = c == 0 ? (b->pf_bytes + 63) / 64 : 0;
      for (int64_t j = 0; j < n; j++, kh += b->ks1) {
        const char *pv = b->V + j * b->vs1;
        const __m512 x =
            IQK ? fx_dot_iq(R, (const int16_t *)qp, D, kh, b->ks2, nhc, pv, pvl, PL2)
                : fx_dot_f(R, KDT, (const float *)qp, D, kh, b->ks2, nhc,
                           KDT == SDPA_I8 ? b->kz + j * b->kq1 + h0 : NULL, pv, pvl, PL2);
        fx_score_key(KDT, IQK, b, L, &ch, j, x);
      }
    }
    _mm512_storeu_ps(mx + 16 * c, ch.mx);
    nan[c] = ch.nan;
  }
}

/* The online-softmax update of chunk c's rows (flash_core's fc_softmax_tile,
 * lane-wise) from their block scores in S: P left in S (I8 V: times the V
 * scale), m and l updated, the rows' rescale factors in alpha[16c ..]. */
SDPA_INLINE void fx_softmax(const flash_x512_block *b, const fx_lanes *L, int64_t c,
                            __m512 mx, __mmask16 nan, float *alpha) {
  const int64_t n = b->n, nh = b->nh, R = b->R, rows = nh * R, rp = FX_PAD16(rows);
  const int64_t h0 = c * (16 / R), nhc = nh - h0 < 16 / R ? nh - h0 : 16 / R;
  const __mmask16 heads = fx_first(nhc), lanes = fx_first(rows - c * 16);
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  const __m512 m_old = _mm512_maskz_loadu_ps(lanes, b->m + c * 16);
  const __mmask16 none = _mm512_cmp_ps_mask(mx, ninf, _CMP_EQ_OQ) & ~nan; /* nothing visible */
  __m512 mn = _mm512_max_ps(mx, m_old);
  mn = _mm512_mask_mov_ps(mn, nan, _mm512_set1_ps(NAN)); /* poison the row */
  const __m512 vm = _mm512_mask_mov_ps(mn, none, _mm512_set1_ps(INFINITY)); /* P = 0 */
  /* alpha: 0 after -inf (exp(-inf) = 0), exactly 1 when the max stays, NaN if poisoned */
  const __m512 al = _mm512_mask_mov_ps(fx_exp(_mm512_sub_ps(m_old, mn)), none, _mm512_set1_ps(1.0f));
  __m512 sum = _mm512_setzero_ps();
  float *s = b->S + c * 16;
  const int vi8 = b->vdt == SDPA_I8;
  for (int64_t j = 0; j < n; j++, s += rp) {
    const __m512 e = fx_exp(_mm512_sub_ps(_mm512_loadu_ps(s), vm));
    sum = _mm512_add_ps(sum, e);
    _mm512_storeu_ps(s, vi8 ? _mm512_mul_ps(e, fx_heads_ps(L->head_of_lane, heads, b->vsc + j * b->vq1 + h0)) : e);
  }
  const __m512 l_old = _mm512_maskz_loadu_ps(lanes, b->l + c * 16);
  _mm512_mask_storeu_ps(b->l + c * 16, lanes, _mm512_fmadd_ps(l_old, al, sum));
  _mm512_mask_storeu_ps(b->m + c * 16, lanes, _mm512_mask_mov_ps(mn, none, m_old));
  _mm512_storeu_ps(alpha + c * 16, al);
}

/* acc[f][d0 : d0 + 16 VC] += sum_k P[j + k][f] V[j + k][h][d0 : ...] over KN keys
 * for the R rows f of head h, the accumulator slice in registers. */
SDPA_INLINE void fx_pv_head(const int R, const int VC, const int DT, const int KN,
                            float *SDPA_RESTRICT acc, int64_t D, const char *v, int64_t vs1,
                            const int8_t *vz, int64_t zs, const float *SDPA_RESTRICT p,
                            int64_t ps) {
  const int64_t isz = sdpa_isz(DT);
  __m512 a[16];
#pragma GCC unroll 16
  for (int r = 0; r < R; r++)
#pragma GCC unroll 8
    for (int c = 0; c < VC; c++) a[r * VC + c] = _mm512_loadu_ps(acc + r * D + 16 * c);
#pragma GCC unroll 16
  for (int k = 0; k < KN; k++, v += vs1, p += ps) {
    const __m512i z = DT == SDPA_I8 ? _mm512_set1_epi32(vz[k * zs]) : _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int c = 0; c < VC; c++) {
      const __m512 vv = sdpa_ld16(v + 16 * c * isz, DT, z);
#pragma GCC unroll 16
      for (int r = 0; r < R; r++)
        a[r * VC + c] = _mm512_fmadd_ps(_mm512_set1_ps(p[r]), vv, a[r * VC + c]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; r++)
#pragma GCC unroll 8
    for (int c = 0; c < VC; c++) _mm512_storeu_ps(acc + r * D + 16 * c, a[r * VC + c]);
}

/* acc += P.V over the block (FX_PV_KEYS keys a visit). */
SDPA_INLINE void fx_pv(const int R, const int DT, const int DC, const int PL2, const flash_x512_block *b) {
  const int VMAX = R == 1 ? 8 : 16 / R, PK = FX_PV_KEYS(DT, R);
  const int64_t D = DC ? DC : b->D, n = b->n, nh = b->nh, rp = FX_PAD16(nh * R);
  const int64_t k_early = fx_next_k_early(R, DT, DC, PL2, b); /* (done by the scores) */
  const int64_t isz = sdpa_isz(DT);
  for (int64_t j = 0; j < n; j += PK) {
    const int64_t kn = n - j < PK ? n - j : PK;
    /* the next block's K rows of these keys, which its scores read first, spread
     * over the heads: issued in one burst per pass, the prefetches stalled on the
     * line fill buffers (a Xeon: 17 % of F16 decode samples on that loop; spread,
     * F16 / F32 / int8 decode 5-17 % faster warm, 2-9 % cold; Zen 5 had measured
     * the burst ahead) */
    const int64_t m = b->pf_bytes && j >= k_early && j < b->next_n ? (b->next_n - j < PK ? b->next_n - j : PK) : 0;
    fx_spread pf = fx_spread_of((m * b->pf_bytes + 63) / 64, nh, PL2);
    const char *vj = b->V + j * b->vs1;
    for (int64_t h = 0; h < nh; h++, vj += b->vs2) {
      fx_spread_step(&pf, b->next_k + j * b->ks1);
      float *acc = b->acc + h * R * D;
      const float *p = b->S + j * rp + h * R;
      const int8_t *vz = DT == SDPA_I8 ? b->vz + j * b->vq1 + h : NULL;
      for (int64_t d = 0; d < D; d += 16 * VMAX) {
        const int64_t left = (D - d) / 16;
        const int vc = left >= VMAX ? VMAX : (int)left;
#define FX_PV_CALL(VC, KN, K)                                                              \
  fx_pv_head(R, VC, DT, KN, acc + d, D, vj + (K) * b->vs1 + d * isz, b->vs1,              \
             vz ? vz + (K) * b->vq1 : vz, b->vq1, p + (K) * rp, rp)
#define FX_PV_VC(VC)                                                                  \
  case VC:                                                                            \
    if (VC <= VMAX) {                                                                 \
      if (kn == PK) {                                                                 \
        FX_PV_CALL(VC, PK, 0);                                                        \
      } else { /* the block's last keys, one at a time */                             \
        for (int64_t k = 0; k < kn; k++) FX_PV_CALL(VC, 1, k);                        \
      }                                                                               \
    }                                                                                 \
    break;
        switch (vc) {
          FX_PV_VC(1) FX_PV_VC(2) FX_PV_VC(3) FX_PV_VC(4)
          FX_PV_VC(5) FX_PV_VC(6) FX_PV_VC(7) FX_PV_VC(8)
          default: break;
        }
#undef FX_PV_VC
#undef FX_PV_CALL
      }
    }
  }
}

/* DC: head_dim as a compile-time constant (0: b->D), for the common 64 and 128.
 * FX_OMIT_SCORES / _SOFTMAX / _PV leave a phase out: only for
 * benchmarks/block_cycles.py, which times the block without each in turn. */
SDPA_INLINE void fx_block(const int R, const int KDT, const int VDT, const int IQK, const int DC, const int PL2,
                          const flash_x512_block *b) {
  const int64_t rows = b->nh * R, rp = FX_PAD16(rows), nch = rp / 16, D = DC ? DC : b->D;
  float *alpha = b->S + b->n * rp, *mx = alpha + rp;
  __mmask16 *nan = (__mmask16 *)(mx + rp);
  const fx_lanes L = fx_lanes_of(R, b);
#ifndef FX_OMIT_SCORES
  fx_scores(R, KDT, IQK, DC, PL2, b, &L, mx, nan);
#endif
#ifndef FX_OMIT_SOFTMAX
  for (int64_t c = 0; c < nch; c++) fx_softmax(b, &L, c, _mm512_loadu_ps(mx + 16 * c), nan[c], alpha);
#endif
  for (int64_t f = 0; f < rows; f++) /* rescale the rows whose max moved */
    if (alpha[f] != 1.0f) {
      const __m512 a = _mm512_set1_ps(alpha[f]);
      float *acc = b->acc + f * D;
      for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(acc + d, _mm512_mul_ps(_mm512_loadu_ps(acc + d), a));
    }
#ifndef FX_OMIT_PV
  fx_pv(R, VDT, DC, PL2, b);
#endif
}

/* ---- instantiation by (rows per head, K / V dtype, integer Q.K^T) ----
 * One file per dtype (flash_x512_<dtype>.c) holds a row of copies, so that the
 * build compiles them in parallel. The prefetch hint is a constant in each copy
 * (read at run time it cost up to 5 %); the L2 copies exist for head_dim 64 / 128,
 * up to 4 rows per head and the non-BF16 dtypes only, which keeps the build time
 * (every copy is a fully unrolled block) within 1.5x of a build without them;
 * other blocks keep L1. */
#define FX_INST(NAME, KDT, VDT, IQK, R)                                          \
  void flash_x512_blk_##NAME##_##R(const flash_x512_block *b) {                  \
    if (b->pf_l2 && (R) <= 4 && (KDT) != SDPA_BF16 && (b->D == 64 || b->D == 128)) { \
      if (b->D == 64) fx_block(R, KDT, VDT, IQK, 64, 1, b);                      \
      else fx_block(R, KDT, VDT, IQK, 128, 1, b);                                \
    } else if (b->D == 64) {                                                     \
      fx_block(R, KDT, VDT, IQK, 64, 0, b);                                      \
    } else if (b->D == 128) {                                                    \
      fx_block(R, KDT, VDT, IQK, 128, 0, b);                                     \
    } else {                                                                     \
      fx_block(R, KDT, VDT, IQK, 0, 0, b);                                       \
    }                                                                            \
  }
#define FX_INST_R(NAME, KDT, VDT, IQK)                                                  \
  FX_INST(NAME, KDT, VDT, IQK, 1) FX_INST(NAME, KDT, VDT, IQK, 2)                      \
  FX_INST(NAME, KDT, VDT, IQK, 4) FX_INST(NAME, KDT, VDT, IQK, 8)                      \
  FX_INST(NAME, KDT, VDT, IQK, 16)

#endif /* FX512 */

#endif
