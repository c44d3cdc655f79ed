/* flash_bf16's prefill block on the AMX tiles: Q.K^T and P.V as BF16 products with
 * F32 sums (TDPBF16PS), the online softmax and the running output in F32.
 *
 * A tile of 16 query rows against a key block (flash_fast_block's contract):
 * - Scores transposed, S^T = K Q^T: K's rows are the A operand as they lie (BF16,
 *   converted once a block), Q^T the B operand (packed once a task), so a C tile
 *   holds 16 keys x 16 rows, key-major: each key's scores are one vector of the 16
 *   rows' lanes, and the softmax is lane-wise (no horizontal reduction), as on the
 *   AVX-512 decode block.
 * - P = exp(S - max) in F32, rounded to BF16 as the A operand of P.V (key pairs
 *   interleaved, one 16 x 16 transpose per 32 keys); V's key pairs interleaved once
 *   a block are the B operand. The 16 x 16-dim products are added to the rows'
 *   F32 accumulators, which are rescaled in F32 as the max moves.
 * Rounding: Q (scaled), K, V and P to BF16 (8 significant bits); every sum in F32.
 * Semantics are flash_core's: -inf past a row's keys, a NaN score poisons its row, a
 * row that sees no key of the block keeps its state; keys past the block are zeros
 * in the operands, never read from the tensors. */
#define _GNU_SOURCE
#include "flash_amx.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>

#if defined(SDPA_HAVE_AVX512) && defined(__AMX_TILE__) && defined(__AMX_BF16__) && \
    defined(__AVX512BF16__) && defined(__linux__)
#define FA_AMX 1
#include <cpuid.h>
#include <errno.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "flash_x512_block.h"
#endif

#define FA_KEYS(n) (((n) + 31) & ~(int64_t)31) /* keys rounded up to a P.V tile's 32 */

int64_t flash_amx_scratch_floats(int64_t R_max, int64_t D, int64_t kv_block) {
  const int64_t rows = PAD16(R_max), keys = FA_KEYS(kv_block);
  /* Q^T tiles, K rows, V pairs (BF16), S^T [key][16] and P tiles, the P.V tile's
   * output [16][D], the tile configuration */
  const int64_t bytes = rows * D * 2 + keys * D * 2 + keys * D * 2 + keys * 64 + keys * 32 +
                        64 * D + 64;
  return bytes / 4;
}

#ifndef FA_AMX

int flash_amx_available(void) { return 0; }
const char *flash_amx_why(void) {
  return "this build has no AMX-BF16 block (built for a target without AMX-TILE, AMX-BF16 "
         "and AVX512-BF16, or not for Linux)";
}
void flash_amx_pack_q(const float *Q, int64_t R, int64_t D, float *amx) {
  (void)Q, (void)R, (void)D, (void)amx;
}
void flash_amx_block(flash_ctx *c, thread_bufs *tb, int64_t b, int64_t hk, int64_t q0,
                     int64_t qbr, int64_t j0, int64_t j1, int mask_is_zero) {
  (void)c, (void)tb, (void)b, (void)hk, (void)q0, (void)qbr, (void)j0, (void)j1,
      (void)mask_is_zero;
}

#else

#define FA_XFEATURE_XTILEDATA 18
#define FA_ARCH_REQ_XCOMP_PERM 0x1023

typedef struct {
  uint16_t *qt, *kb, *vb, *pa;
  float *st, *ot;
  void *cfg;
} fa_bufs;

static fa_bufs fa_carve(float *amx, int64_t R_max, int64_t D, int64_t kv_block) {
  const int64_t rows = PAD16(R_max), keys = FA_KEYS(kv_block);
  char *p = (char *)amx;
  fa_bufs f;
  f.qt = (uint16_t *)p, p += rows * D * 2;
  f.kb = (uint16_t *)p, p += keys * D * 2;
  f.vb = (uint16_t *)p, p += keys * D * 2;
  f.st = (float *)p, p += keys * 64;
  f.pa = (uint16_t *)p, p += keys * 32;
  f.ot = (float *)p, p += 64 * D;
  f.cfg = p;
  return f;
}

static pthread_once_t fa_once = PTHREAD_ONCE_INIT;
static const char *fa_reason = "not probed";
static char fa_reason_buf[160];

/* The CPU's AMX-TILE, AMX-BF16 and AVX512-BF16, the OS's XSAVE of the tile state,
 * and Linux's permission for this process to use it (off until asked for). */
static void fa_probe(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22))) {
    fa_reason = "this CPU has no AMX-BF16 tiles (cpuid leaf 7: AMX-TILE or AMX-BF16 not set)";
    return;
  }
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) {
    fa_reason = "this CPU has no AVX512-BF16 (cpuid leaf 7.1)";
    return;
  }
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) {
    fa_reason = "the OS has not enabled the AMX tile state (XCR0 bits 17-18)";
    return;
  }
  if (syscall(SYS_arch_prctl, FA_ARCH_REQ_XCOMP_PERM, FA_XFEATURE_XTILEDATA) != 0) {
    snprintf(fa_reason_buf, sizeof fa_reason_buf,
             "Linux refused this process the AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM: %s)",
             strerror(errno));
    fa_reason = fa_reason_buf;
    return;
  }
  fa_reason = NULL;
}

const char *flash_amx_why(void) {
  pthread_once(&fa_once, fa_probe);
  return fa_reason;
}

int flash_amx_available(void) { return flash_amx_why() == NULL; }

/* Palette 1, tiles 0-5 of 16 rows x 64 bytes: C tiles 0-3, A tile 4, B tile 5. */
static void fa_config(void *mem) {
  uint8_t *cfg = (uint8_t *)mem;
  memset(cfg, 0, 64);
  cfg[0] = 1;
  for (int t = 0; t < 6; t++) {
    cfg[16 + 2 * t] = 64; /* colsb, little-endian uint16 */
    cfg[48 + t] = 16;     /* rows */
  }
  _tile_loadconfig(cfg);
}

/* 32 dims of a row (dtype DT) as BF16: word w is dim w. */
SDPA_INLINE __m512i fa_bf16x32(const char *p, int DT) {
  const int64_t isz = sdpa_isz(DT);
  const __m512i z = _mm512_setzero_si512();
  return (__m512i)_mm512_cvtne2ps_pbh(sdpa_ld16(p + 16 * isz, DT, z), sdpa_ld16(p, DT, z));
}

/* Two 16-float vectors as BF16 pairs: dword i = (lo[i], hi[i]). */
SDPA_INLINE __m512i fa_pairs(__m512 lo, __m512 hi) {
  static const uint16_t idx[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                   8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  return _mm512_permutexvar_epi16(_mm512_loadu_si512(idx), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

void flash_amx_pack_q(const float *Q, int64_t R, int64_t D, float *amx) {
  uint16_t *qt = (uint16_t *)amx; /* (the first region of fa_carve) */
  const int64_t DC = D / 32;
  for (int64_t t = 0; t < PAD16(R) / 16; t++)
    for (int64_t dc = 0; dc < DC; dc++) {
      __m512i x[16];
      for (int r = 0; r < 16; r++) /* row r: dword p = dims (2p, 2p + 1) */
        x[r] = t * 16 + r < R ? fa_bf16x32((const char *)(Q + (t * 16 + r) * D + dc * 32), SDPA_F32)
                              : _mm512_setzero_si512();
      fx_transpose16(x); /* x[p] lane r: row r's pair p, B's row p */
      for (int p = 0; p < 16; p++) _mm512_storeu_si512(qt + ((t * DC + dc) * 16 + p) * 32, x[p]);
    }
}

/* The block's K rows as BF16 (A operands, keys past nk zero) and V's key pairs
 * interleaved (B operands, [32-key chunk][16 dims][pair][dim][2]). */
static void fa_pack_kv(const fa_bufs *f, int KDT, const char *K, int64_t ks, int VDT,
                       const char *V, int64_t vs, int64_t nk, int64_t D) {
  const int64_t nk16 = PAD16(nk), nk32 = FA_KEYS(nk), ki = sdpa_isz(KDT), vi = sdpa_isz(VDT);
  const int64_t DV = D / 16;
  const __m512i z = _mm512_setzero_si512();
  for (int64_t j = 0; j < nk16; j++)
    for (int64_t d = 0; d < D; d += 32)
      _mm512_storeu_si512(f->kb + j * D + d, j < nk ? fa_bf16x32(K + j * ks + d * ki, KDT) : z);
  for (int64_t j = 0; j < nk32; j += 2)
    for (int64_t dc = 0; dc < DV; dc++) {
      const __m512 lo = j < nk ? sdpa_ld16(V + j * vs + dc * 16 * vi, VDT, z) : _mm512_setzero_ps();
      const __m512 hi = j + 1 < nk ? sdpa_ld16(V + (j + 1) * vs + dc * 16 * vi, VDT, z)
                                   : _mm512_setzero_ps();
      _mm512_storeu_si512(f->vb + (((j / 32) * DV + dc) * 16 + (j % 32) / 2) * 32, fa_pairs(lo, hi));
    }
}

#define FA_DP_IF(G, NG) \
  if ((G) < (NG)) _tile_dpbf16ps(G, 4, 5)
#define FA_STORE_IF(G, NG, PTR, STRIDE) \
  if ((G) < (NG)) _tile_stored(G, (PTR), (STRIDE))

/* S^T of tile t's rows against keys [0, 16 nkc): st[key][row]. */
static void fa_scores(const fa_bufs *f, int64_t t, int64_t nkc, int64_t D) {
  const int64_t DC = D / 32;
  for (int64_t k0 = 0; k0 < nkc; k0 += 4) {
    const int64_t ng = nkc - k0 < 4 ? nkc - k0 : 4;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t dc = 0; dc < DC; dc++) {
      _tile_loadd(5, f->qt + (t * DC + dc) * 512, 64);
      for (int64_t g = 0; g < ng; g++) {
        _tile_loadd(4, f->kb + (k0 + g) * 16 * D + dc * 32, D * 2);
        if (g == 0) _tile_dpbf16ps(0, 4, 5);
        else if (g == 1) _tile_dpbf16ps(1, 4, 5);
        else if (g == 2) _tile_dpbf16ps(2, 4, 5);
        else _tile_dpbf16ps(3, 4, 5);
      }
    }
    float *s = f->st + k0 * 256;
    FA_STORE_IF(0, ng, s, 64);
    FA_STORE_IF(1, ng, s + 256, 64);
    FA_STORE_IF(2, ng, s + 512, 64);
    FA_STORE_IF(3, ng, s + 768, 64);
  }
}

/* O = P V for the tile's rows over keys [0, 32 nkp): ot[row][d]. */
static void fa_pv(const fa_bufs *f, int64_t nkp, int64_t D) {
  const int64_t DV = D / 16;
  for (int64_t d0 = 0; d0 < DV; d0 += 4) {
    const int64_t ng = DV - d0 < 4 ? DV - d0 : 4;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t kc = 0; kc < nkp; kc++) {
      _tile_loadd(4, f->pa + kc * 512, 64);
      _tile_loadd(5, f->vb + (kc * DV + d0) * 512, 64);
      _tile_dpbf16ps(0, 4, 5);
      if (ng > 1) _tile_loadd(5, f->vb + (kc * DV + d0 + 1) * 512, 64);
      FA_DP_IF(1, ng);
      if (ng > 2) _tile_loadd(5, f->vb + (kc * DV + d0 + 2) * 512, 64);
      FA_DP_IF(2, ng);
      if (ng > 3) _tile_loadd(5, f->vb + (kc * DV + d0 + 3) * 512, 64);
      FA_DP_IF(3, ng);
    }
    float *o = f->ot + d0 * 16;
    FA_STORE_IF(0, ng, o, D * 4);
    FA_STORE_IF(1, ng, o + 16, D * 4);
    FA_STORE_IF(2, ng, o + 32, D * 4);
    FA_STORE_IF(3, ng, o + 48, D * 4);
  }
}

/* The lane-wise online softmax of the tile's rows over st[0, n) (lanes: rows; lim:
 * each lane's visible keys, 0 past the tile), P left in st and rounded into the P.V
 * A tiles (keys past n zero); m, l updated for lanes < nr, alpha[16] the rescale. */
static void fa_softmax(const fa_bufs *f, int64_t n, const int32_t *lim, int64_t nr, float *m,
                       float *l, float *alpha) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  const __m512i limv = _mm512_loadu_si512(lim);
  const __mmask16 lanes = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1u);
  __m512 mx = ninf;
  __mmask16 nan = 0;
  for (int64_t j = 0; j < n; j++) {
    const __mmask16 seen = _mm512_cmpgt_epi32_mask(limv, _mm512_set1_epi32((int32_t)j));
    const __m512 s = _mm512_mask_mov_ps(ninf, seen, _mm512_loadu_ps(f->st + j * 16));
    _mm512_storeu_ps(f->st + j * 16, s);
    mx = _mm512_max_ps(mx, s);
    nan |= _mm512_cmp_ps_mask(s, s, _CMP_UNORD_Q);
  }
  const __m512 m_old = _mm512_maskz_loadu_ps(lanes, m);
  const __mmask16 none = _mm512_cmp_ps_mask(mx, ninf, _CMP_EQ_OQ) & ~nan; /* nothing visible */
  __m512 mn = _mm512_mask_mov_ps(_mm512_max_ps(mx, m_old), nan, _mm512_set1_ps(NAN));
  const __m512 vm = _mm512_mask_mov_ps(mn, none, _mm512_set1_ps(INFINITY)); /* P = 0 */
  const __m512 al = _mm512_mask_mov_ps(fx_exp(_mm512_sub_ps(m_old, mn)), none, _mm512_set1_ps(1.0f));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < FA_KEYS(n); j += 32) {
    __m512i x[16];
    for (int p = 0; p < 16; p++) { /* x[p] lane r: row r's P of keys j + 2p, j + 2p + 1 */
      const int64_t k = j + 2 * p;
      const __m512 e0 = k < n ? fx_exp(_mm512_sub_ps(_mm512_loadu_ps(f->st + k * 16), vm)) : _mm512_setzero_ps();
      const __m512 e1 = k + 1 < n ? fx_exp(_mm512_sub_ps(_mm512_loadu_ps(f->st + (k + 1) * 16), vm)) : _mm512_setzero_ps();
      sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
      x[p] = fa_pairs(e0, e1);
    }
    fx_transpose16(x); /* x[r]: row r's 16 pairs, the A tile's row r */
    for (int r = 0; r < 16; r++) _mm512_storeu_si512(f->pa + (j / 32) * 512 + r * 32, x[r]);
  }
  const __m512 l_old = _mm512_maskz_loadu_ps(lanes, l);
  _mm512_mask_storeu_ps(l, lanes, _mm512_fmadd_ps(l_old, al, sum));
  _mm512_mask_storeu_ps(m, lanes, _mm512_mask_mov_ps(mn, none, m_old));
  _mm512_storeu_ps(alpha, al);
}

/* (the mask's values of the tile's rows, added where a row sees the key) */
static void fa_add_mask(const fa_bufs *f, const sdpa_args *a, int64_t q0, int64_t qbr, int64_t t0,
                        int64_t nr, int64_t j0, const int32_t *lim) {
  for (int64_t r = 0; r < nr; r++) {
    const float *mrow = a->mask + (q0 + (t0 + r) % qbr) * a->mask_row_stride + j0;
    for (int64_t j = 0; j < lim[r]; j++) f->st[j * 16 + r] += mrow[j];
  }
}

void flash_amx_block(flash_ctx *c, thread_bufs *tb, int64_t b, int64_t hk, int64_t q0,
                     int64_t qbr, int64_t j0, int64_t j1, int mask_is_zero) {
  const sdpa_args *a = c->a;
  const int64_t D = c->D, nk = j1 - j0, R = c->G * qbr;
  const int kdt = a->k.dtype, vdt = a->v.dtype;
  const int64_t ki = sdpa_isz(kdt), vi = sdpa_isz(vdt);
  const fa_bufs f = fa_carve(tb->amx, c->R_max, D, c->kvb);
  const char *K = (const char *)a->k.data + sdpa_row_offset(&a->k, b, j0, hk) * ki;
  const char *V = (const char *)a->v.data + sdpa_row_offset(&a->v, b, j0, hk) * vi;
  fa_config(f.cfg);
  fa_pack_kv(&f, kdt, K, a->k.stride[1] * ki, vdt, V, a->v.stride[1] * vi, nk, D);
  const int use_mask = a->mask != NULL && !mask_is_zero;
  for (int64_t t0 = 0; t0 < R; t0 += 16) {
    const int64_t nr = R - t0 < 16 ? R - t0 : 16;
    int32_t lim[16] = {0};
    int64_t n = 0;
    for (int64_t r = 0; r < nr; r++) {
      lim[r] = (int32_t)fc_visible_keys(a, q0 + (t0 + r) % qbr, j0, nk);
      if (lim[r] > n) n = lim[r];
    }
    if (n == 0) continue;
    fa_scores(&f, t0 / 16, (n + 15) / 16, D);
    if (use_mask) fa_add_mask(&f, a, q0, qbr, t0, nr, j0, lim);
    float alpha[16];
    fa_softmax(&f, n, lim, nr, tb->m + t0, tb->l + t0, alpha);
    fa_pv(&f, FA_KEYS(n) / 32, D);
    for (int64_t r = 0; r < nr; r++) {
      float *acc = tb->acc + (t0 + r) * D;
      const float *o = f.ot + r * D;
      const __m512 al = _mm512_set1_ps(alpha[r]);
      for (int64_t d = 0; d < D; d += 16)
        _mm512_storeu_ps(acc + d, _mm512_fmadd_ps(_mm512_loadu_ps(acc + d), al, _mm512_loadu_ps(o + d)));
    }
  }
  _tile_release();
}

#endif
