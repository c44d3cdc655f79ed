/* flash_core's prefill tile (the panel path: a K block transposed once, score and
 * P.V products over a tile of query rows) on AVX-512, 16 lanes where flash_core's
 * own code is 8 wide, and over tiles of 8 rows where it takes 4:
 *
 * - K^T: 16 x 16 tiles of the block converted (int8: dequantised) and transposed
 *   in registers.
 * - Scores: outer products against the transposed block, 32 keys a step for a
 *   tile of 8 rows (16 accumulators, each K vector loaded once for the tile's
 *   rows, each q element a broadcast), then 16 keys a step for the rest.
 * - The online softmax of the tile's rows, 16 lanes (fc_softmax_tile's rules).
 * - P.V: 8 rows x 2 vectors of the accumulator (32 dims) in registers while the
 *   keys' V rows stream through, each P element a broadcast.
 * Tiles of 8 rows, not 4: a pass over the block's K^T or V then feeds twice the
 * FMAs (the block, 32 KiB of each at head_dim 64, does not stay in a 48 KiB L1).
 *
 * The products' sums run in the same order as flash_core's (over d for a score,
 * over keys for P.V, one FMA each); a row's softmax sum adds 16 lanes, not 8. */
#include "flash_x512_block.h" /* (fx_exp) */

#ifndef SDPA_HAVE_AVX512

int flash_x512_panel_available(void) { return 0; }
void flash_x512_scores_panel(int64_t nr, const float *Q, int64_t D, const float *KT, int64_t kts,
                             int64_t n, float *S, int64_t sst) {
  (void)nr, (void)Q, (void)D, (void)KT, (void)kts, (void)n, (void)S, (void)sst;
}
void flash_x512_pv_f32(int64_t nr, float *acc, int64_t D, const char *V, int64_t vs, int64_t n,
                       const float *P, int64_t pst) {
  (void)nr, (void)acc, (void)D, (void)V, (void)vs, (void)n, (void)P, (void)pst;
}
void flash_x512_softmax_tile(int64_t nr, float *S, int64_t sst, int64_t n16, float *m, float *l,
                             float *alpha) {
  (void)nr, (void)S, (void)sst, (void)n16, (void)m, (void)l, (void)alpha;
}
void flash_x512_pack_kt16(int dt, const char *K, int64_t ks, const int32_t *kz, const float *ksc,
                          int64_t m, int64_t D, float *KT, int64_t kts) {
  (void)dt, (void)K, (void)ks, (void)kz, (void)ksc, (void)m, (void)D, (void)KT, (void)kts;
}

#else

int flash_x512_panel_available(void) { return 1; }

/* The register tile both products are: C[r][0 .. 16 W) (+)= sum_i x[r xs + i] y_i
 * for the NR rows, i < n, y_i the 16 W floats at y + i ys bytes; C starts from
 * itself when ACC, else from zero. Scores: x = q over dims, y = K^T rows; P.V:
 * x = P over keys, y = V rows. */
SDPA_INLINE void fxp_tile(const int NR, const int W, const int ACC, const float *SDPA_RESTRICT x,
                          int64_t xs, const char *y, int64_t ys, int64_t n,
                          float *SDPA_RESTRICT C, int64_t cs) {
  __m512 acc[16];
#pragma GCC unroll 8
  for (int r = 0; r < NR; r++)
#pragma GCC unroll 8
    for (int w = 0; w < W; w++)
      acc[r * W + w] = ACC ? _mm512_loadu_ps(C + r * cs + 16 * w) : _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i++, y += ys) {
    __m512 v[4];
#pragma GCC unroll 8
    for (int w = 0; w < W; w++) v[w] = _mm512_loadu_ps((const float *)y + 16 * w);
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++) {
      const __m512 xb = _mm512_set1_ps(x[r * xs + i]);
#pragma GCC unroll 8
      for (int w = 0; w < W; w++) acc[r * W + w] = _mm512_fmadd_ps(xb, v[w], acc[r * W + w]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < NR; r++)
#pragma GCC unroll 8
    for (int w = 0; w < W; w++) _mm512_storeu_ps(C + r * cs + 16 * w, acc[r * W + w]);
}

/* S[r][j0 .. j0 + 16 KW) for the NR rows */
SDPA_INLINE void fxp_scores_step(const int NR, const int KW, const float *SDPA_RESTRICT Q,
                                 int64_t D, const float *SDPA_RESTRICT KT, int64_t kts, int64_t j0,
                                 float *SDPA_RESTRICT S, int64_t sst) {
  fxp_tile(NR, KW, 0, Q, D, (const char *)(KT + j0), kts * (int64_t)sizeof(float), D, S + j0, sst);
}

/* Keys [0, n) rounded up to 16 (KT is zero past the block's keys, S has room):
 * 16 accumulators a step, 64 keys for up to 4 rows, 32 for 8. */
SDPA_INLINE void fxp_scores(const int NR, const float *Q, int64_t D, const float *KT, int64_t kts,
                            int64_t n, float *S, int64_t sst) {
  const int KW = NR == 8 ? 2 : 4;
  const int64_t n16 = (n + 15) & ~(int64_t)15;
  int64_t j = 0;
  for (; j + 16 * KW <= n16; j += 16 * KW) fxp_scores_step(NR, KW, Q, D, KT, kts, j, S, sst);
  for (; j < n16; j += 16) fxp_scores_step(NR, 1, Q, D, KT, kts, j, S, sst);
}

void flash_x512_scores_panel(int64_t nr, const float *Q, int64_t D, const float *KT, int64_t kts,
                             int64_t n, float *S, int64_t sst) {
  if (nr == 8) fxp_scores(8, Q, D, KT, kts, n, S, sst);
  else if (nr == 4) fxp_scores(4, Q, D, KT, kts, n, S, sst);
  else if (nr == 2) fxp_scores(2, Q, D, KT, kts, n, S, sst);
  else fxp_scores(1, Q, D, KT, kts, n, S, sst);
}

/* acc[r][d0 .. d0 + 16 VC) += sum_j P[r][j] V[j][d0 ..] for the NR rows */
SDPA_INLINE void fxp_pv_chunk(const int NR, const int VC, float *SDPA_RESTRICT acc, int64_t D,
                              int64_t d0, const char *V, int64_t vs, int64_t n,
                              const float *SDPA_RESTRICT P, int64_t pst) {
  fxp_tile(NR, VC, 1, P, pst, V + d0 * (int64_t)sizeof(float), vs, n, acc + d0, D);
}

/* 16 accumulators a pass: 64 dims for up to 4 rows, 32 for 8 */
SDPA_INLINE void fxp_pv(const int NR, float *acc, int64_t D, const char *V, int64_t vs, int64_t n,
                        const float *P, int64_t pst) {
  const int VC = NR == 8 ? 2 : 4;
  int64_t d = 0;
  for (; d + 16 * VC <= D; d += 16 * VC) fxp_pv_chunk(NR, VC, acc, D, d, V, vs, n, P, pst);
  switch ((D - d) / 16) { /* (8 rows: at most 1) */
    case 3: fxp_pv_chunk(NR, NR == 8 ? 1 : 3, acc, D, d, V, vs, n, P, pst); break;
    case 2: fxp_pv_chunk(NR, NR == 8 ? 1 : 2, acc, D, d, V, vs, n, P, pst); break;
    case 1: fxp_pv_chunk(NR, 1, acc, D, d, V, vs, n, P, pst); break;
    default: break;
  }
}

void flash_x512_pv_f32(int64_t nr, float *acc, int64_t D, const char *V, int64_t vs, int64_t n,
                       const float *P, int64_t pst) {
  if (nr == 8) fxp_pv(8, acc, D, V, vs, n, P, pst);
  else if (nr == 4) fxp_pv(4, acc, D, V, vs, n, P, pst);
  else if (nr == 2) fxp_pv(2, acc, D, V, vs, n, P, pst);
  else fxp_pv(1, acc, D, V, vs, n, P, pst);
}

/* flash_core's fc_softmax_tile, 16 lanes: the rows' block max (a NaN poisons the
 * row; a row that sees nothing keeps its state and gets P = 0), P = exp(s - max)
 * in place, alpha = exp(m_old - m_new) from one vector exp, m and l updated. */
SDPA_INLINE void fxp_softmax(const int NR, float *SDPA_RESTRICT S, int64_t sst, int64_t n16,
                             float *m, float *l, float *alpha) {
  const float neg_inf = -INFINITY;
  __m512 mx[8], vs[8], vm[8];
  __mmask16 nan[8];
#pragma GCC unroll 8
  for (int r = 0; r < NR; r++) {
    mx[r] = _mm512_set1_ps(neg_inf);
    vs[r] = _mm512_setzero_ps();
    nan[r] = 0;
  }
  for (int64_t j = 0; j < n16; j += 16)
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++) {
      const __m512 x = _mm512_loadu_ps(S + r * sst + j);
      mx[r] = _mm512_max_ps(mx[r], x);
      nan[r] |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    }
  float m_new[8], dv[16] = {0};
  int need_exp = 0;
#pragma GCC unroll 8
  for (int r = 0; r < NR; r++) {
    const float bm = _mm512_reduce_max_ps(mx[r]); /* (meaningless with NaN about) */
    const float m_old = m[r];
    alpha[r] = 1.0f;
    if (bm == neg_inf && !nan[r]) { /* nothing visible in this block: P = 0 */
      m_new[r] = m_old;
      vm[r] = _mm512_set1_ps(INFINITY);
      continue;
    }
    const float mn = nan[r] ? NAN : bm > m_old ? bm : m_old; /* NaN: poison the row */
    m_new[r] = mn;
    vm[r] = _mm512_set1_ps(mn);
    if (m_old == neg_inf) {
      alpha[r] = 0.0f;
    } else if (m_old != mn) {
      dv[r] = m_old - mn;
      need_exp = 1;
    }
  }
  for (int64_t j = 0; j < n16; j += 16)
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++) {
      const __m512 e = fx_exp(_mm512_sub_ps(_mm512_loadu_ps(S + r * sst + j), vm[r]));
      _mm512_storeu_ps(S + r * sst + j, e);
      vs[r] = _mm512_add_ps(vs[r], e);
    }
  if (need_exp) { /* one vector exp for every row whose max moved */
    float ev[16];
    _mm512_storeu_ps(ev, fx_exp(_mm512_loadu_ps(dv)));
    for (int r = 0; r < NR; r++)
      if (m[r] != neg_inf && m[r] != m_new[r]) alpha[r] = ev[r];
  }
#pragma GCC unroll 8
  for (int r = 0; r < NR; r++) {
    l[r] = l[r] * alpha[r] + _mm512_reduce_add_ps(vs[r]);
    m[r] = m_new[r];
  }
}

void flash_x512_softmax_tile(int64_t nr, float *S, int64_t sst, int64_t n16, float *m, float *l,
                             float *alpha) {
  if (nr == 8) fxp_softmax(8, S, sst, n16, m, l, alpha);
  else if (nr == 4) fxp_softmax(4, S, sst, n16, m, l, alpha);
  else if (nr == 2) fxp_softmax(2, S, sst, n16, m, l, alpha);
  else fxp_softmax(1, S, sst, n16, m, l, alpha);
}

/* KT[d][k] = key k's real value in dim d for 16 keys (m of them real, the rest 0):
 * 16 x 16 tiles converted and transposed in registers (int8: (k - zk) k_scale). */
SDPA_INLINE void fxp_pack_kt(const int DT, const char *K, int64_t ks, const int32_t *kz,
                             const float *ksc, int64_t m, int64_t D, float *KT, int64_t kts) {
  const int64_t isz = sdpa_isz(DT);
  for (int64_t d = 0; d < D; d += 16) {
    __m512i r[16];
#pragma GCC unroll 16
    for (int k = 0; k < 16; k++) {
      if (k < m) {
        const __m512i z = DT == SDPA_I8 ? _mm512_set1_epi32(kz[k]) : _mm512_setzero_si512();
        __m512 x = sdpa_ld16(K + k * ks + d * isz, DT, z);
        if (DT == SDPA_I8) x = _mm512_mul_ps(x, _mm512_set1_ps(ksc[k]));
        r[k] = _mm512_castps_si512(x);
      } else {
        r[k] = _mm512_setzero_si512(); /* past the block */
      }
    }
    fx_transpose16(r);
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) _mm512_storeu_ps(KT + (d + i) * kts, _mm512_castsi512_ps(r[i]));
  }
}

void flash_x512_pack_kt16(int dt, const char *K, int64_t ks, const int32_t *kz, const float *ksc,
                          int64_t m, int64_t D, float *KT, int64_t kts) {
  switch (dt) {
    case SDPA_F32: fxp_pack_kt(SDPA_F32, K, ks, kz, ksc, m, D, KT, kts); break;
    case SDPA_F16: fxp_pack_kt(SDPA_F16, K, ks, kz, ksc, m, D, KT, kts); break;
    case SDPA_BF16: fxp_pack_kt(SDPA_BF16, K, ks, kz, ksc, m, D, KT, kts); break;
    default: fxp_pack_kt(SDPA_I8, K, ks, kz, ksc, m, D, KT, kts); break;
  }
}

#endif
