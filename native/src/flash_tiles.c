/* The fast path's register-tile kernels: a tile's scores against a key block
 * (each K vector converted in registers once for the tile's rows; int8 Q and K:
 * integer dot products), its P.V, and the panel path's K block transpose and
 * outer-product scores. Instantiated per dtype and rows per tile into the
 * tables of flash_tiles.h. */
#include "flash_tiles.h"

/* Scores of NR rows (Q, row stride D, pre-scaled) against keys [0, n) of a
 * block (K: row stride ks bytes; kz: I8 zero points per key) into S (row
 * stride sst; lanes up to the next multiple of 8 / NR get junk). */
SDPA_INLINE void fc_scores(const int NR, const int DT, const float *SDPA_RESTRICT Q, int64_t D,
                           const char *K, int64_t ks, const int32_t *kz, int64_t n,
                           float *SDPA_RESTRICT S, int64_t sst, fc_prefetch *pf) {
  const int KS = 8 / NR;
  const int64_t isz = sdpa_isz(DT);
  for (int64_t j = 0; j < n; j += KS) {
    const char *kr[8];
    v8i zk[8];
    const int spread = KS == 8 && (DT != SDPA_F32 || (pf != NULL && pf->spread_f32));
    fc_pf_pass pp = fc_prefetch_take(pf, KS, spread ? D / 8 : 1);
#pragma GCC unroll 8
    for (int k = 0; k < KS; k++) {
      int64_t jj = j + k < n ? j + k : n - 1; /* never past the block's last key */
      kr[k] = K + jj * ks;
      zk[k] = DT == SDPA_I8 ? fc_set1i(kz[jj]) : fc_set1i(0);
    }
    v8f acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) acc[i] = v8f_set1(0.0f);
    for (int64_t d = 0; d < D; d += 8) {
      fc_prefetch_some(&pp, pp.kper, pp.vper);
      if (NR == 1) { /* each K vector used once: load, convert and FMA it in one go, so
                        that 8 converted vectors are never live at once (16 registers) */
        const v8f qv = v8f_load(Q + d);
#pragma GCC unroll 8
        for (int k = 0; k < KS; k++) acc[k] = fc_fma(qv, sdpa_ld8(kr[k] + d * isz, DT, zk[k]), acc[k]);
        continue;
      }
      v8f kv[8];
#pragma GCC unroll 8
      for (int k = 0; k < KS; k++) kv[k] = sdpa_ld8(kr[k] + d * isz, DT, zk[k]);
#pragma GCC unroll 4
      for (int r = 0; r < NR; r++) {
        v8f qv = v8f_load(Q + r * D + d);
#ifdef FC_X86
        /* one load for the KS keys: Zen-class cores load 256 bits per cycle, so
         * the FMAs must not each fold their own load of q */
        if (KS > 1) __asm__("" : "+x"(qv));
#endif
#pragma GCC unroll 8
        for (int k = 0; k < KS; k++) acc[r * KS + k] = fc_fma(qv, kv[k], acc[r * KS + k]);
      }
    }
    fc_prefetch_some(&pp, pp.kn, pp.vn);
    fc_store_scores(NR, acc, S, sst, j);
  }
}

#ifdef FC_X86
/* The scores of int8 Q against int8 K before the K zero point: (q - zq) . k in
 * int32 through 16-bit multiply-adds (|q - zq| <= 255, |k| <= 128: products and
 * pair sums fit), converted to float (exact: below 2^24 for head_dim <= 256).
 * The caller subtracts zk * sum(q - zq), also exact, and applies scale *
 * q_scale * k_scale; leaving zk out of the loop saves a subtract per K vector
 * and the registers that held it. head_dim a multiple of 16. */
SDPA_INLINE void fc_scores_iq(const int NR, const int16_t *SDPA_RESTRICT Qi, int64_t D,
                              const char *K, int64_t ks, int64_t n, float *SDPA_RESTRICT S,
                              int64_t sst, fc_prefetch *pf) {
  const int KS = 8 / NR;
  for (int64_t j = 0; j < n; j += KS) {
    const char *kr[8];
    fc_pf_pass pp = fc_prefetch_take(pf, KS, KS == 8 ? D / 16 : 1);
#pragma GCC unroll 8
    for (int k = 0; k < KS; k++) {
      int64_t jj = j + k < n ? j + k : n - 1; /* never past the block's last key */
      kr[k] = K + jj * ks;
    }
    __m256i acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_si256();
    for (int64_t d = 0; d < D; d += 16) {
      fc_prefetch_some(&pp, pp.kper, pp.vper);
      __m256i kv[8];
#pragma GCC unroll 8
      for (int k = 0; k < KS; k++)
        kv[k] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(kr[k] + d)));
#pragma GCC unroll 4
      for (int r = 0; r < NR; r++) {
        __m256i qv = _mm256_loadu_si256((const __m256i *)(Qi + r * D + d));
        if (KS > 1) __asm__("" : "+x"(qv));
#pragma GCC unroll 8
        for (int k = 0; k < KS; k++)
          acc[r * KS + k] = fc_dpwssd(acc[r * KS + k], qv, kv[k]);
      }
    }
    fc_prefetch_some(&pp, pp.kn, pp.vn);
    fc_store_scores_i32(NR, acc, S, sst, j);
  }
}
#endif

/* acc[r][d0 : d0 + 8 VC] += sum_j P[r][j] V[j][d0 : ...] for the NR rows. (int8 V:
 * (v - zp) in int32 first; folding the zero point into a per-row correction term
 * instead loses too much to cancellation for a constant token.) */
SDPA_INLINE void fc_pv_chunk(const int NR, const int VC, const int DT, float *SDPA_RESTRICT acc,
                             int64_t D, int64_t d0, const char *V, int64_t vs, const int32_t *vz,
                             int64_t n, const float *SDPA_RESTRICT P, int64_t pst) {
  const int64_t isz = sdpa_isz(DT);
  v8f a[12];
#pragma GCC unroll 4
  for (int r = 0; r < NR; r++)
#pragma GCC unroll 8
    for (int c = 0; c < VC; c++) a[r * VC + c] = v8f_load(acc + r * D + d0 + 8 * c);
  const char *vr = V + d0 * isz;
  for (int64_t j = 0; j < n; j++, vr += vs) {
    const v8i z = DT == SDPA_I8 ? fc_set1i(vz[j]) : fc_set1i(0);
    v8f vv[8];
#pragma GCC unroll 8
    for (int c = 0; c < VC; c++) vv[c] = sdpa_ld8(vr + 8 * c * isz, DT, z);
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
      v8f p = v8f_set1(P[r * pst + j]);
#pragma GCC unroll 8
      for (int c = 0; c < VC; c++) a[r * VC + c] = fc_fma(p, vv[c], a[r * VC + c]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < NR; r++)
#pragma GCC unroll 8
    for (int c = 0; c < VC; c++) v8f_store(acc + r * D + d0 + 8 * c, a[r * VC + c]);
}

SDPA_INLINE void fc_pv(const int NR, const int DT, float *SDPA_RESTRICT acc, int64_t D,
                       const char *V, int64_t vs, const int32_t *vz, int64_t n,
                       const float *SDPA_RESTRICT P, int64_t pst) {
  /* as many accumulators as registers allow: 4 rows x 3 vectors (+ 3 V + 1 P = 16
   * ymm registers) measured 18% faster than 4 x 2 */
  const int VC = NR == 4 ? 3 : 8 / NR;
  int64_t d = 0;
  for (; d + 8 * VC <= D; d += 8 * VC) fc_pv_chunk(NR, VC, DT, acc, D, d, V, vs, vz, n, P, pst);
  if (NR == 4 && d + 16 <= D) {
    fc_pv_chunk(NR, 2, DT, acc, D, d, V, vs, vz, n, P, pst);
    d += 16;
  }
  for (; d < D; d += 8) fc_pv_chunk(NR, 1, DT, acc, D, d, V, vs, vz, n, P, pst);
}

#define FC_INST(NAME, DT, NR)                                                                \
  static void scores_##NAME##_##NR(const float *Q, int64_t D, const char *K, int64_t ks,     \
                                   const int32_t *kz, int64_t n, float *S, int64_t sst,      \
                                   fc_prefetch *pf) {                                        \
    fc_scores(NR, DT, Q, D, K, ks, kz, n, S, sst, pf);                                       \
  }                                                                                          \
  static void pv_##NAME##_##NR(float *acc, int64_t D, const char *V, int64_t vs,             \
                               const int32_t *vz, int64_t n, const float *P, int64_t pst) {  \
    fc_pv(NR, DT, acc, D, V, vs, vz, n, P, pst);                                             \
  }
#define FC_INST_DT(NAME, DT) FC_INST(NAME, DT, 1) FC_INST(NAME, DT, 2) FC_INST(NAME, DT, 4)
FC_INST_DT(f32, SDPA_F32)
FC_INST_DT(f16, SDPA_F16)
FC_INST_DT(bf16, SDPA_BF16)
FC_INST_DT(i8, SDPA_I8)

#ifdef FC_X86
#define FC_INST_IQ(NR)                                                                        \
  static void scores_iq_##NR(const int16_t *Qi, int64_t D, const char *K, int64_t ks,        \
                             int64_t n, float *S, int64_t sst, fc_prefetch *pf) {             \
    fc_scores_iq(NR, Qi, D, K, ks, n, S, sst, pf);                                            \
  }
FC_INST_IQ(1)
FC_INST_IQ(2)
FC_INST_IQ(4)
const fc_scores_iq_fn fc_k_scores_iq[5] = {NULL, scores_iq_1, scores_iq_2, NULL, scores_iq_4};
#endif

/* Scores of NR rows against keys [0, n) of a transposed block KT ([D][kts],
 * zero past the block's keys): outer products, 16 keys per step, no
 * horizontal sums. S may be written up to n rounded up to 16. */
SDPA_INLINE void fc_scores_panel(const int NR, const float *SDPA_RESTRICT Q, int64_t D,
                                 const float *SDPA_RESTRICT KT, int64_t kts, int64_t n,
                                 float *SDPA_RESTRICT S, int64_t sst) {
  for (int64_t j = 0; j < n; j += 16) {
    v8f acc[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) acc[r][0] = acc[r][1] = v8f_set1(0.0f);
    const float *kt = KT + j;
    for (int64_t d = 0; d < D; d++, kt += kts) {
      v8f k0 = v8f_load(kt), k1 = v8f_load(kt + 8);
#pragma GCC unroll 4
      for (int r = 0; r < NR; r++) {
        v8f qb = v8f_set1(Q[r * D + d]);
        acc[r][0] = fc_fma(qb, k0, acc[r][0]);
        acc[r][1] = fc_fma(qb, k1, acc[r][1]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
      v8f_store(S + r * sst + j, acc[r][0]);
      v8f_store(S + r * sst + j + 8, acc[r][1]);
    }
  }
}

#define FC_INST_PANEL(NR)                                                                     \
  static void scores_panel_##NR(const float *Q, int64_t D, const float *KT, int64_t kts,     \
                                int64_t n, float *S, int64_t sst) {                          \
    fc_scores_panel(NR, Q, D, KT, kts, n, S, sst);                                            \
  }
FC_INST_PANEL(1)
FC_INST_PANEL(2)
FC_INST_PANEL(4)
const fc_panel_fn fc_k_scores_panel[5] = {NULL, scores_panel_1, scores_panel_2, NULL,
                                          scores_panel_4};

/* KT[d][j] = real K value of key j, dim d, for keys [0, nk); zero for keys
 * [nk, nk rounded up to 16). int8: (k - zk) * k_scale. Also prefetches. */
SDPA_INLINE void fc_pack_kt(const int DT, const char *K, int64_t ks, const int32_t *kz,
                            const float *ksc, int64_t nk, int64_t D, float *KT, int64_t kts,
                            fc_prefetch *pf) {
  const int64_t isz = sdpa_isz(DT);
  for (int64_t j = 0; j < nk; j += 8) {
    if (pf != NULL) fc_prefetch_step(pf, 8);
    const int64_t m = nk - j < 8 ? nk - j : 8;
    for (int64_t d = 0; d < D; d += 8) {
      v8f r[8];
      for (int k = 0; k < 8; k++) {
        if (k < m) {
          const v8i z = DT == SDPA_I8 ? fc_set1i(kz[j + k]) : fc_set1i(0);
          r[k] = sdpa_ld8(K + (j + k) * ks + d * isz, DT, z);
          if (DT == SDPA_I8) r[k] *= v8f_set1(ksc[j + k]);
        } else {
          r[k] = v8f_set1(0.0f); /* past the block: never read */
        }
      }
      fc_transpose8(r);
      for (int i = 0; i < 8; i++) v8f_store(KT + (d + i) * kts + j, r[i]);
    }
  }
  const int64_t n8 = (nk + 7) & ~(int64_t)7, n16 = (nk + 15) & ~(int64_t)15;
  if (n16 > n8)
    for (int64_t d = 0; d < D; d++) memset(KT + d * kts + n8, 0, (size_t)(n16 - n8) * sizeof(float));
}

#define FC_INST_PACK(NAME, DT)                                                                \
  static void pack_kt_##NAME(const char *K, int64_t ks, const int32_t *kz, const float *ksc,  \
                             int64_t nk, int64_t D, float *KT, int64_t kts, fc_prefetch *pf) {\
    fc_pack_kt(DT, K, ks, kz, ksc, nk, D, KT, kts, pf);                                       \
  }
FC_INST_PACK(f32, SDPA_F32)
FC_INST_PACK(f16, SDPA_F16)
FC_INST_PACK(bf16, SDPA_BF16)
FC_INST_PACK(i8, SDPA_I8)
const fc_pack_fn fc_k_pack_kt[4] = {pack_kt_f32, pack_kt_f16, pack_kt_bf16, pack_kt_i8};

/* indexed [dtype][nr] (nr 1, 2 or 4) */
#define FC_ROW(NAME) {NULL, scores_##NAME##_1, scores_##NAME##_2, NULL, scores_##NAME##_4}
const fc_scores_fn fc_k_scores[4][5] = {FC_ROW(f32), FC_ROW(f16), FC_ROW(bf16), FC_ROW(i8)};
#undef FC_ROW
#define FC_ROW(NAME) {NULL, pv_##NAME##_1, pv_##NAME##_2, NULL, pv_##NAME##_4}
const fc_pv_fn fc_k_pv[4][5] = {FC_ROW(f32), FC_ROW(f16), FC_ROW(bf16), FC_ROW(i8)};
#undef FC_ROW
