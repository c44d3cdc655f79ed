/* Tiled online-softmax attention (flash attention) on the CPU.
 *
 * A task is (batch, chunk of kv heads, query block, kv split). Its rows are
 * every query head of each kv head's group times the query rows of the block,
 * so each K/V block is read once for the whole group (GQA in-kernel, no
 * broadcast copy). Long kv ranges are split across tasks (split-k /
 * flash-decoding) and the partial softmax states merged afterwards, so batch-1
 * decode uses all threads. When a kv head has few rows (decode, short chunks),
 * a task takes every kv head: it walks its key range in short blocks, every
 * head in turn within a block, and prefetches the next block in address order,
 * so that a [B, S, H, D] cache is streamed rather than walked with a
 * whole-position stride per head.
 *
 * Block paths (sharing the task, merge and output code):
 *
 * - the fast path (head_dim a multiple of 8, K and V rows with unit dim
 *   stride, dequantisation not per block): rows in register tiles of up to 4.
 *   Scores: 8 / NR keys at a time, each K vector loaded (and converted from
 *   F16 / BF16 / I8 in registers) once for the NR rows and FMA'd into
 *   NR x (8 / NR) accumulators, reduced together to 8 scores; int8 Q and K:
 *   exact integer dot products instead. Softmax: the tile's rows' max, exp and
 *   sums interleaved. P.V: the tile's output rows held in registers for a slice
 *   of head_dim while the block's V rows stream through. int8 K/V: (x -
 *   zero_point) in int32, converted in registers, the K scale applied to the
 *   scores and the V scale folded into P.
 *   Panel variant (many rows per kv head: prefill): the K block is dequantised
 *   and transposed once per block and V converted once; score tiles are outer
 *   products over 16 keys, without horizontal sums.
 *   Nothing is read past kv_len or past head_dim: a partial key group repeats
 *   its last valid key (extra lanes discarded) or is zero-filled in the panel.
 * - the generic path (any dim stride, any head_dim, the per-block allocating
 *   int8 variant): K / V blocks are converted into F32 scratch first.
 */
#include <math.h>
#include <stdlib.h>

#include "flash_core.h"
#include "flash_prefetch.h"
#include "flash_vec.h"
#include "flash_x512.h"

#define PAD16(n) (((n) + 15) & ~(int64_t)15)
#define FC_TILE 4 /* rows per register tile */
#define FC_TILE_MAX 8 /* rows per tile on the AVX-512 panel (flash_x512_panel.c) */
/* A task takes every kv head when a head has at most this many rows (G x q block). */
#define FLASH_HEADS_TOGETHER_ROWS 16

/* Where each region of a thread's scratch starts, in floats from its start (-1:
 * the call has no such region), and how many floats a thread takes. The one
 * statement of the layout: flash_scratch_bytes and flash_core size the scratch
 * from it, flash_task and merge_task carve it (scratch_bufs). */
typedef struct flash_scratch_layout {
  int64_t Q, acc, m, l, S;  /* every path: [hc * R_max] rows; S: a block's scores */
  int64_t Qp, mk;           /* x512: packed Q, the block's mask */
  int64_t ksc, vsc, kz, vz; /* int8 K / V: a block's per-key scales and zero points */
  int64_t qf, qs, qz;       /* integer Q.K^T: per-row terms (qz: x512 only) */
  int64_t KT;               /* panel: K^T of a block */
  int64_t Kf, Vf;           /* a K / V block as F32 (panel: V; generic: K and V) */
  int64_t merge_acc, merge_l; /* the split-k merge pass, over the same scratch */
  int64_t floats;           /* per thread: the larger of a task's and the merge's */
} flash_scratch_layout;

typedef struct {
  const sdpa_args *a;
  const flash_cfg *cfg;
  int64_t G, qb, kvb, n_qblocks, n_splits, split_len, R_max, D;
  int64_t hc, n_hchunks;  /* kv heads per task, and chunks of them */
  float scale;
  int k_direct, v_direct; /* F32 with unit dim stride: read in place */
  int fast;               /* the register-tiled block path */
  int iqk;                /* fast path, int8 Q and K: integer Q.K^T */
  int panel;              /* fast path, many rows per head (prefill): K block transposed
                             (and V converted) once per block, GEMM-style score tiles */
  int panel16;            /* panel, AVX-512: the tile's products 16 lanes wide (flash_x512_panel.c) */
  int x512;               /* decode tasks on the AVX-512 block path (flash_x512_block.h): every kv
                             head of a key block at once, in memory order */
  char *scratch;
  int64_t scratch_stride; /* bytes per thread */
  flash_scratch_layout layout; /* of each thread's scratch */
  float *partial;         /* split-k: [batch, kv head, query block, split][R_max][D + 2] */
  int status;
} flash_ctx;

void flash_cfg_defaults(flash_cfg *cfg, const sdpa_probe_flash_opts *opts) {
  cfg->q_block = FLASH_DEFAULT_Q_BLOCK;
  cfg->q_block_auto = 1;
  cfg->kv_block = 0; /* chosen from the shape */
  cfg->n_splits = 0;
  cfg->alloc_per_block = 0;
  cfg->plan = NULL;
  if (opts) {
    if (opts->q_block > 0) cfg->q_block = opts->q_block, cfg->q_block_auto = 0;
    if (opts->kv_block > 0) cfg->kv_block = opts->kv_block;
    if (opts->n_splits > 0) cfg->n_splits = opts->n_splits;
  }
}

static int64_t kvb_pad(int64_t kvb) { return PAD16(kvb); }

static int64_t take(int64_t *n, int64_t floats) {
  const int64_t at = *n;
  *n += floats;
  return at;
}

/* The layout of a thread's scratch for the plan c (see flash_scratch_layout). */
static void scratch_layout(const flash_ctx *c, flash_scratch_layout *L) {
  const int64_t R = c->R_max, D = c->D, kvb = c->kvb, kvp = kvb_pad(kvb), RH = c->hc * R;
  const sdpa_args *a = c->a;
  int64_t n = 0;
  *L = (flash_scratch_layout){.Q = -1, .acc = -1, .m = -1, .l = -1, .S = -1, .Qp = -1, .mk = -1,
                              .ksc = -1, .vsc = -1, .kz = -1, .vz = -1, .qf = -1, .qs = -1,
                              .qz = -1, .KT = -1, .Kf = -1, .Vf = -1};
  L->Q = take(&n, PAD16(RH * D));
  L->acc = take(&n, PAD16(RH * D));
  L->m = take(&n, PAD16(RH));
  L->l = take(&n, PAD16(RH));
  if (c->x512) {
    L->S = take(&n, flash_x512_scratch_floats(c->hc, R, kvb));
    L->Qp = take(&n, flash_x512_packed_q_floats(c->hc, R, D));
    L->mk = take(&n, 16 * kvb); /* the block's mask, key-major */
    if (a->k.dtype == SDPA_I8) { /* scales and zero points, [key][head] */
      L->ksc = take(&n, kvb * c->hc);
      L->vsc = take(&n, kvb * c->hc);
      L->kz = take(&n, kvb * c->hc);
      L->vz = take(&n, kvb * c->hc);
    }
    if (c->iqk) { /* per row: scale * q_scale, sum(q - zq), zq */
      L->qf = take(&n, PAD16(RH));
      L->qs = take(&n, PAD16(RH));
      L->qz = take(&n, PAD16(RH));
    }
  } else if (c->fast) {
    L->S = take(&n, FC_TILE_MAX * kvp); /* scores of one tile */
    if (a->kv_len > 0 && (a->k.dtype == SDPA_I8 || a->v.dtype == SDPA_I8)) {
      L->ksc = take(&n, kvp); /* per-key scales and zero points of a block */
      L->vsc = take(&n, kvp);
      L->kz = take(&n, kvp);
      L->vz = take(&n, kvp);
    }
    if (c->iqk) { /* per row: scale * q_scale, and sum(q - zq) */
      L->qf = take(&n, PAD16(RH));
      L->qs = take(&n, PAD16(RH));
    }
    if (c->panel) {
      L->KT = take(&n, PAD16(D * kvp)); /* K^T of a block */
      if (a->v.dtype != SDPA_F32 || c->panel16) L->Vf = take(&n, PAD16(kvb * D)); /* V as F32 */
    }
  } else {
    L->S = take(&n, PAD16(R * kvp));
    if (!c->cfg->alloc_per_block) {
      if (!c->k_direct) L->Kf = take(&n, PAD16(kvb * D));
      if (!c->v_direct) L->Vf = take(&n, PAD16(kvb * D));
    }
  }
  /* the merge pass reuses the scratch for acc and l */
  int64_t merge = 0;
  L->merge_acc = take(&merge, PAD16(R * D));
  L->merge_l = take(&merge, PAD16(R));
  L->floats = merge > n ? merge : n;
}

static int fast_dtype(int32_t dt) {
  return dt == SDPA_F32 || dt == SDPA_F16 || dt == SDPA_BF16 || dt == SDPA_I8;
}

static void setup(flash_ctx *c, const sdpa_args *a, const flash_cfg *cfg) {
  c->a = a;
  c->cfg = cfg;
  c->D = a->head_dim;
  c->G = a->n_heads / a->n_kv_heads;
  /* (a mask plan is laid out over cfg's query blocks: keep them) */
  int64_t qblock = cfg->q_block;
  if (cfg->q_block_auto && !cfg->plan && !cfg->alloc_per_block && a->head_dim % 8 == 0 &&
      FLASH_PANEL_ROWS / c->G > qblock)
    qblock = FLASH_PANEL_ROWS / c->G;
  c->qb = qblock < a->q_len ? qblock : a->q_len;
  if (c->qb < 1) c->qb = 1;
  c->n_qblocks = (a->q_len + c->qb - 1) / c->qb;
  c->R_max = c->G * c->qb;
  c->x512 = flash_x512_available() && !cfg->alloc_per_block && a->kv_len > 0 &&
            a->head_dim % 16 == 0 && c->R_max <= 16 && 16 % c->R_max == 0 &&
            a->k.dtype == a->v.dtype && fast_dtype(a->k.dtype) && a->k.stride[3] == 1 &&
            a->v.stride[3] == 1;
  /* Few rows per kv head (decode, short chunks): one task takes every kv head
   * for its key range and streams K / V in memory order; otherwise one head. */
  c->hc = c->x512 || c->R_max <= FLASH_HEADS_TOGETHER_ROWS ? a->n_kv_heads : 1;
  c->n_hchunks = (a->n_kv_heads + c->hc - 1) / c->hc;
  /* short key blocks when a block spans every head: FLASH_DECODE_BLOCK_BYTES of
   * K and V, so that the block and the next one, prefetched while this one
   * runs, stay in L2; at most FLASH_DECODE_KV_BLOCK 4-byte keys (more keys per
   * block only lengthened the per-block work) and at least FLASH_DECODE_MIN_KEYS */
  c->kvb = cfg->kv_block > 0 ? cfg->kv_block : FLASH_DEFAULT_KV_BLOCK;
  if (cfg->kv_block <= 0 && c->x512) {
    c->kvb = FLASH_X512_KV_BLOCK;
  } else if (cfg->kv_block <= 0 && c->hc > 1 && a->kv_len > 0) {
    const int64_t ik = sdpa_isz(a->k.dtype), iv = sdpa_isz(a->v.dtype);
    const int64_t isz = ik > iv ? ik : iv;
    /* conversion-bound (narrower) dtypes: twice the bytes, as their per-block work
     * weighs more than L2 residency (F16 MHA decode 2-8 % faster, int8 4 %; F32 4-6 %
     * slower with the larger blocks) */
    const int64_t budget = FLASH_DECODE_BLOCK_BYTES * (isz == 4 ? 1 : 2);
    int64_t kvb = budget / (c->hc * c->D * (ik + iv));
    if (kvb > FLASH_DECODE_KV_BLOCK * 4 / isz) kvb = FLASH_DECODE_KV_BLOCK * 4 / isz;
    c->kvb = kvb < FLASH_DECODE_MIN_KEYS ? FLASH_DECODE_MIN_KEYS : kvb;
  } else if (cfg->kv_block <= 0 && c->hc > 1) {
    c->kvb = FLASH_DECODE_KV_BLOCK;
  }
  c->scale = sdpa_effective_scale(a);
  c->k_direct = a->k.dtype == SDPA_F32 && a->k.stride[3] == 1;
  c->v_direct = a->v.dtype == SDPA_F32 && a->v.stride[3] == 1;
  c->fast = !cfg->alloc_per_block && c->D % 8 == 0 &&
            (a->kv_len == 0 || (a->k.stride[3] == 1 && a->v.stride[3] == 1 &&
                                fast_dtype(a->k.dtype) && fast_dtype(a->v.dtype)));
  c->panel = c->fast && a->kv_len > 0 && c->hc == 1 && !c->x512;
  c->panel16 = c->panel && flash_x512_panel_available() && c->D % 16 == 0;
#ifdef FC_X86
  c->iqk = c->fast && !c->panel && a->kv_len > 0 && a->q.dtype == SDPA_I8 &&
           a->k.dtype == SDPA_I8 && c->D % 16 == 0 && c->D <= 256;
#else
  c->iqk = 0;
#endif
  int nt = sdpa_threads(a);
  int64_t base = a->batch * c->n_hchunks * c->n_qblocks;
  int64_t max_splits = (a->kv_len + c->kvb - 1) / c->kvb;
  if (max_splits < 1) max_splits = 1;
  int64_t ns = cfg->n_splits;
  if (ns <= 0) {
    /* split-k when the tasks would not fill the threads. The AVX-512 block path
     * takes one split per thread: each task start pays for its Q packing and for
     * its first K block read on demand, and four splits per thread were 1.03-1.05x
     * slower at kv 8192 and 1.2-1.5x at kv 512 (a Xeon, decode, 2 threads);
     * elsewhere four per thread, for the load balance. */
    const int64_t per = c->x512 ? 1 : 4;
    ns = 1;
    if (base < per * nt && a->kv_len >= per * c->kvb) ns = (per * nt + base - 1) / base;
  }
  if (ns > max_splits) ns = max_splits;
  c->n_splits = ns;
  /* split boundaries on kv-block multiples */
  int64_t blocks_per_split = (max_splits + ns - 1) / ns;
  c->split_len = blocks_per_split * c->kvb;
  scratch_layout(c, &c->layout);
}

int64_t flash_scratch_bytes(const sdpa_args *a, const flash_cfg *cfg) {
  flash_ctx c;
  setup(&c, a, cfg);
  return c.layout.floats * (int64_t)sizeof(float);
}

/* How many of the block's nk keys from j0 on query row i (absolute index in the
 * query range) may see under the causal rule; 0 when none. */
SDPA_INLINE int64_t fc_visible_keys(const sdpa_args *a, int64_t i, int64_t j0, int64_t nk) {
  int64_t l = nk;
  if (a->is_causal && a->start_pos + i + 1 - j0 < l) l = a->start_pos + i + 1 - j0;
  return l < 0 ? 0 : l;
}

#ifdef FC_X86
/* An Intel core (the prefetch spreading's trade-off is the CPU's; see fc_pf_pass). */
static int fc_intel(void) {
  __builtin_cpu_init(); /* (once per process; afterwards a flag test) */
  return __builtin_cpu_is("intel") ? 1 : 0;
}
#endif

/* Aim the cursor at the rows of positions [j, j_end) of the task's heads. */
static void fc_prefetch_aim(fc_prefetch *pf, int64_t j, int64_t j_end) {
  if (j_end < j) j_end = j;
  if (pf->linear) {
    pf->kc = pf->k + j * pf->ks1;
    pf->kend = pf->k + j_end * pf->ks1;
    pf->vc = pf->v + j * pf->vs1;
    pf->vend = pf->v + j_end * pf->vs1;
  }
  pf->j = j;
  pf->h = 0;
  pf->j_end = j_end;
}

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

typedef void (*fc_scores_fn)(const float *, int64_t, const char *, int64_t, const int32_t *,
                             int64_t, float *, int64_t, fc_prefetch *);
typedef void (*fc_pv_fn)(float *, int64_t, const char *, int64_t, const int32_t *, int64_t,
                         const float *, int64_t);

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
typedef void (*fc_scores_iq_fn)(const int16_t *, int64_t, const char *, int64_t, int64_t,
                                float *, int64_t, fc_prefetch *);
#define FC_INST_IQ(NR)                                                                        \
  static void scores_iq_##NR(const int16_t *Qi, int64_t D, const char *K, int64_t ks,        \
                             int64_t n, float *S, int64_t sst, fc_prefetch *pf) {             \
    fc_scores_iq(NR, Qi, D, K, ks, n, S, sst, pf);                                            \
  }
FC_INST_IQ(1)
FC_INST_IQ(2)
FC_INST_IQ(4)
static const fc_scores_iq_fn k_scores_iq[5] = {NULL, scores_iq_1, scores_iq_2, NULL, scores_iq_4};
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

typedef void (*fc_panel_fn)(const float *, int64_t, const float *, int64_t, int64_t, float *,
                            int64_t);
#define FC_INST_PANEL(NR)                                                                     \
  static void scores_panel_##NR(const float *Q, int64_t D, const float *KT, int64_t kts,     \
                                int64_t n, float *S, int64_t sst) {                          \
    fc_scores_panel(NR, Q, D, KT, kts, n, S, sst);                                            \
  }
FC_INST_PANEL(1)
FC_INST_PANEL(2)
FC_INST_PANEL(4)
static const fc_panel_fn k_scores_panel[5] = {NULL, scores_panel_1, scores_panel_2, NULL,
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

typedef void (*fc_pack_fn)(const char *, int64_t, const int32_t *, const float *, int64_t, int64_t,
                           float *, int64_t, fc_prefetch *);
#define FC_INST_PACK(NAME, DT)                                                                \
  static void pack_kt_##NAME(const char *K, int64_t ks, const int32_t *kz, const float *ksc,  \
                             int64_t nk, int64_t D, float *KT, int64_t kts, fc_prefetch *pf) {\
    fc_pack_kt(DT, K, ks, kz, ksc, nk, D, KT, kts, pf);                                       \
  }
FC_INST_PACK(f32, SDPA_F32)
FC_INST_PACK(f16, SDPA_F16)
FC_INST_PACK(bf16, SDPA_BF16)
FC_INST_PACK(i8, SDPA_I8)
static const fc_pack_fn k_pack_kt[4] = {pack_kt_f32, pack_kt_f16, pack_kt_bf16, pack_kt_i8};

/* Rows [0, nk) of a V block as F32, row stride D; int8: (v - zv) * v_scale. */
static void fc_convert_v(int DT, const char *V, int64_t vs, const int32_t *vz, const float *vsc,
                         int64_t nk, int64_t D, float *dst) {
  const int64_t isz = sdpa_isz(DT);
  for (int64_t j = 0; j < nk; j++) {
    const char *row = V + j * vs;
    float *o = dst + j * D;
    const v8i z = DT == SDPA_I8 ? fc_set1i(vz[j]) : fc_set1i(0);
    const v8f sc = v8f_set1(DT == SDPA_I8 ? vsc[j] : 1.0f);
    for (int64_t d = 0; d < D; d += 8) {
      v8f x;
      if (DT == SDPA_F16) x = sdpa_ld8(row + d * isz, SDPA_F16, z);
      else if (DT == SDPA_BF16) x = sdpa_ld8(row + d * isz, SDPA_BF16, z);
      else if (DT == SDPA_I8) x = sdpa_ld8(row + d * isz, SDPA_I8, z) * sc;
      else x = sdpa_ld8(row + d * isz, SDPA_F32, z);
      v8f_store(o + d, x);
    }
  }
}

/* indexed [dtype][nr] (nr 1, 2 or 4) */
#define FC_ROW(NAME) {NULL, scores_##NAME##_1, scores_##NAME##_2, NULL, scores_##NAME##_4}
static const fc_scores_fn k_scores[4][5] = {FC_ROW(f32), FC_ROW(f16), FC_ROW(bf16), FC_ROW(i8)};
#undef FC_ROW
#define FC_ROW(NAME) {NULL, pv_##NAME##_1, pv_##NAME##_2, NULL, pv_##NAME##_4}
static const fc_pv_fn k_pv[4][5] = {FC_ROW(f32), FC_ROW(f16), FC_ROW(bf16), FC_ROW(i8)};
#undef FC_ROW

/* ---- the generic path ---------------------------------------------------- */

/* acc[0:D] += sum_jj p[jj] * V[jj, 0:D], four vector accumulators in registers. */
static void pv_accum(float *SDPA_RESTRICT acc, const float *SDPA_RESTRICT p, const float *v,
                     int64_t vs, int64_t n, int64_t D) {
  int64_t d = 0;
  for (; d + 32 <= D; d += 32) {
    v8f a0 = v8f_load(acc + d), a1 = v8f_load(acc + d + 8);
    v8f a2 = v8f_load(acc + d + 16), a3 = v8f_load(acc + d + 24);
    for (int64_t jj = 0; jj < n; jj++) {
      const float *vr = v + jj * vs + d;
      v8f pj = v8f_set1(p[jj]);
      a0 += pj * v8f_load(vr);
      a1 += pj * v8f_load(vr + 8);
      a2 += pj * v8f_load(vr + 16);
      a3 += pj * v8f_load(vr + 24);
    }
    v8f_store(acc + d, a0);
    v8f_store(acc + d + 8, a1);
    v8f_store(acc + d + 16, a2);
    v8f_store(acc + d + 24, a3);
  }
  for (; d + 8 <= D; d += 8) {
    v8f a0 = v8f_load(acc + d);
    for (int64_t jj = 0; jj < n; jj++) a0 += v8f_set1(p[jj]) * v8f_load(v + jj * vs + d);
    v8f_store(acc + d, a0);
  }
  for (; d < D; d++) {
    float s = acc[d];
    for (int64_t jj = 0; jj < n; jj++) s += p[jj] * v[jj * vs + d];
    acc[d] = s;
  }
}

/* Materialise rows [j0, j1) of K or V for kv head hk as float, row stride D. */
static void convert_block(const sdpa_tensor *t, int64_t b, int64_t j0, int64_t j1, int64_t hk,
                          int64_t D, float *dst) {
  for (int64_t j = j0; j < j1; j++) sdpa_load_token(t, b, j, hk, D, dst + (j - j0) * D);
}

typedef struct {
  float *Q, *acc, *m, *l, *S, *Kf, *Vf;
  fc_prefetch *pf;   /* fast path: the task's prefetch cursor (NULL: none) */
  float *ksc, *vsc;  /* fast path, I8: per-key scales of the block */
  float *qf;         /* integer Q.K^T: scale * q_scale per row; Q then holds (q - zq) as int16 */
  float *qs;         /* integer Q.K^T: sum of (q - zq) per row (an integer, exact) */
  float *qz;         /* x512, integer Q.K^T: zq per row (flash_x512_pack_q wants q itself) */
  float *KT;         /* panel: the K block transposed, [D][kvp], dequantised */
  float *Qp, *mk;    /* x512: Q packed (flash_x512_pack_q), the block's mask [key][16] */
  int32_t *kz, *vz;  /* fast path, I8: per-key zero points of the block */
} thread_bufs;

static float *region(float *base, int64_t at) { return at < 0 ? NULL : base + at; }

/* A thread's buffers in its scratch at base, as c->layout lays them out (pf: NULL). */
static thread_bufs scratch_bufs(const flash_ctx *c, float *base) {
  const flash_scratch_layout *L = &c->layout;
  thread_bufs tb;
  memset(&tb, 0, sizeof tb);
  tb.Q = region(base, L->Q);
  tb.acc = region(base, L->acc);
  tb.m = region(base, L->m);
  tb.l = region(base, L->l);
  tb.S = region(base, L->S);
  tb.Qp = region(base, L->Qp);
  tb.mk = region(base, L->mk);
  tb.ksc = region(base, L->ksc);
  tb.vsc = region(base, L->vsc);
  tb.kz = (int32_t *)region(base, L->kz);
  tb.vz = (int32_t *)region(base, L->vz);
  tb.qf = region(base, L->qf);
  tb.qs = region(base, L->qs);
  tb.qz = region(base, L->qz);
  tb.KT = region(base, L->KT);
  tb.Kf = region(base, L->Kf);
  tb.Vf = region(base, L->Vf);
  return tb;
}

/* ---- the fast path: one key block for every row of the task ------------- */
/* Online-softmax update of the NR rows of a tile from their block scores
 * S[r][0, n8) (keys a row must not see already -inf). Leaves P in S and the
 * factor each row's accumulator must be rescaled by in alpha[r]. The rows'
 * reductions and exps are interleaved so that their latencies overlap. */
SDPA_INLINE void fc_softmax_tile(const int NR, float *SDPA_RESTRICT S, int64_t sst, int64_t n8,
                                 float *m, float *l, float *alpha) {
  const float neg_inf = -INFINITY;
  v8f mx[4], vs[4];
  v8i nn[4];
  for (int r = 0; r < NR; r++) {
    mx[r] = v8f_set1(neg_inf);
    nn[r] = fc_set1i(0);
    vs[r] = v8f_set1(0.0f);
  }
  for (int64_t j = 0; j < n8; j += 8)
    for (int r = 0; r < NR; r++) {
      v8f x = v8f_load(S + r * sst + j);
      mx[r] = fc_max(mx[r], x);
      nn[r] |= (v8i)(x != x);
    }
  v8f vm[4];
  float m_new[4];
  int need_exp = 0;
  for (int r = 0; r < NR; r++) {
    const float bm = fc_hmax(mx[r]); /* meaningless with NaN about: has_nan decides then */
    const int has_nan = fc_any(nn[r]);
    const float m_old = m[r];
    alpha[r] = 1.0f;
    if (bm == neg_inf && !has_nan) { /* nothing visible in this block: P = 0 */
      m_new[r] = m_old;
      vm[r] = v8f_set1(INFINITY);
      continue;
    }
    float mn = bm > m_old ? bm : m_old;
    if (has_nan) mn = NAN; /* poison the row, as the reference would */
    m_new[r] = mn;
    vm[r] = v8f_set1(mn);
    if (m_old == neg_inf) alpha[r] = 0.0f;
    else if (m_old != mn) need_exp = 1;
  }
  for (int64_t j = 0; j < n8; j += 8)
    for (int r = 0; r < NR; r++) {
      v8f e = fc_exp(v8f_load(S + r * sst + j) - vm[r]);
      v8f_store(S + r * sst + j, e);
      vs[r] += e;
    }
  if (need_exp) { /* one vector exp for every row whose max moved */
    v8f dv = v8f_set1(0.0f);
    for (int r = 0; r < NR; r++)
      if (m[r] != neg_inf && m[r] != m_new[r]) dv[r] = m[r] - m_new[r];
    v8f ev = fc_exp(dv);
    for (int r = 0; r < NR; r++)
      if (m[r] != neg_inf && m[r] != m_new[r]) alpha[r] = ev[r];
  }
  for (int r = 0; r < NR; r++) {
    l[r] = l[r] * alpha[r] + fc_hsum(vs[r]);
    m[r] = m_new[r];
  }
}

static void fast_block(flash_ctx *c, thread_bufs *tb, int64_t b, int64_t hk, int64_t q0,
                       int64_t qbr, int64_t j0, int64_t j1, int mask_is_zero) {
  const sdpa_args *a = c->a;
  const int64_t D = c->D, nk = j1 - j0, kvp = kvb_pad(c->kvb), R = c->G * qbr;
  const int kdt = a->k.dtype, vdt = a->v.dtype;
  const char *K = (const char *)a->k.data + sdpa_row_offset(&a->k, b, j0, hk) * sdpa_isz(kdt);
  const char *V = (const char *)a->v.data + sdpa_row_offset(&a->v, b, j0, hk) * sdpa_isz(vdt);
  const int64_t ks = a->k.stride[1] * sdpa_isz(kdt), vs = a->v.stride[1] * sdpa_isz(vdt);
  if (kdt == SDPA_I8) {
    for (int64_t j = 0; j < nk; j++) {
      float sc;
      int32_t zp;
      sdpa_qparams(&a->k, b, j0 + j, hk, &sc, &zp);
      tb->ksc[j] = sc;
      tb->kz[j] = zp;
    }
    for (int64_t j = nk; j < kvp; j++) {
      tb->ksc[j] = 0.0f;
      tb->kz[j] = 0;
    }
  }
  if (vdt == SDPA_I8) {
    for (int64_t j = 0; j < nk; j++) {
      float sc;
      int32_t zp;
      sdpa_qparams(&a->v, b, j0 + j, hk, &sc, &zp);
      tb->vsc[j] = sc;
      tb->vz[j] = zp;
    }
    for (int64_t j = nk; j < kvp; j++) tb->vsc[j] = 0.0f;
  }
  const int use_mask = a->mask != NULL && !mask_is_zero;
  const float neg_inf = -INFINITY;
  const char *Vp = V; /* the V rows P.V reads */
  int64_t vps = vs;
  int pvdt = vdt;
  if (c->panel) { /* dequantise K (transposed) and V once for every tile of the block */
    if (c->panel16) {
      for (int64_t j = 0; j < nk; j += 16) {
        if (tb->pf != NULL) fc_prefetch_step(tb->pf, 16);
        const int i8 = kdt == SDPA_I8;
        flash_x512_pack_kt16(kdt, K + j * ks, ks, i8 ? tb->kz + j : NULL, i8 ? tb->ksc + j : NULL,
                             nk - j < 16 ? nk - j : 16, D, tb->KT + j, kvp);
      }
    } else {
      k_pack_kt[kdt](K, ks, tb->kz, tb->ksc, nk, D, tb->KT, kvp, tb->pf);
    }
    /* (F32 too on the AVX-512 panel: V rows a position apart, 2-8 KiB, share L1 sets;
     * copied together, causal prefill 512 ran 1.04x (32, 8, 64), 1.08x (16, 16, 128)) */
    if (vdt != SDPA_F32 || c->panel16) {
      fc_convert_v(vdt, V, vs, tb->vz, tb->vsc, nk, D, tb->Vf);
      Vp = (const char *)tb->Vf;
      vps = D * (int64_t)sizeof(float);
      pvdt = SDPA_F32;
    }
  }
  for (int64_t t0 = 0, nr; t0 < R; t0 += nr) {
    const int64_t left = R - t0;
    nr = c->panel16 && left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
    int64_t lim[FC_TILE_MAX], n = 0;
    for (int r = 0; r < nr; r++) {
      lim[r] = fc_visible_keys(a, q0 + (t0 + r) % qbr, j0, nk);
      if (lim[r] > n) n = lim[r];
    }
    if (n > 0) {
      float *S = tb->S;
      /* the first tile's pass also prefetches (its key loop is as long as any) */
      if (c->panel16)
        flash_x512_scores_panel(nr, tb->Q + t0 * D, D, tb->KT, kvp, n, S, kvp);
      else if (c->panel)
        k_scores_panel[nr](tb->Q + t0 * D, D, tb->KT, kvp, n, S, kvp);
#ifdef FC_X86
      else if (c->iqk)
        k_scores_iq[nr]((const int16_t *)tb->Q + t0 * D, D, K, ks, n, S, kvp,
                        t0 == 0 ? tb->pf : NULL);
#endif
      else
        k_scores[kdt][nr](tb->Q + t0 * D, D, K, ks, tb->kz, n, S, kvp, t0 == 0 ? tb->pf : NULL);
      /* keys padded to the vector width: -inf past a row's keys, then the softmax */
      const int64_t npad = c->panel16 ? (n + 15) & ~(int64_t)15 : (n + 7) & ~(int64_t)7;
      for (int r = 0; r < nr; r++) {
        float *s = S + r * kvp;
        const int64_t row = t0 + r, i = q0 + row % qbr;
        if (c->iqk) {
          const v8f qf = v8f_set1(tb->qf[row]), qs = v8f_set1(tb->qs[row]);
          for (int64_t j = 0; j < npad; j += 8) {
            const v8f zk = __builtin_convertvector((v8i)v8f_load((const float *)(tb->kz + j)), v8f);
            v8f_store(s + j, (v8f_load(s + j) - zk * qs) * v8f_load(tb->ksc + j) * qf);
          }
        } else if (kdt == SDPA_I8 && !c->panel) { /* (the panel has the scales folded in) */
          for (int64_t j = 0; j < npad; j += 8) v8f_store(s + j, v8f_load(s + j) * v8f_load(tb->ksc + j));
        }
        if (use_mask) {
          const float *mrow = a->mask + i * a->mask_row_stride + j0;
          int64_t j = 0;
          for (; j + 8 <= lim[r]; j += 8) v8f_store(s + j, v8f_load(s + j) + v8f_load(mrow + j));
          for (; j < lim[r]; j++) s[j] += mrow[j];
        }
        for (int64_t j = lim[r]; j < npad; j++) s[j] = neg_inf;
      }
      float alpha[FC_TILE_MAX];
      if (c->panel16) flash_x512_softmax_tile(nr, S, kvp, npad, tb->m + t0, tb->l + t0, alpha);
      else if (nr == 4) fc_softmax_tile(4, S, kvp, npad, tb->m + t0, tb->l + t0, alpha);
      else if (nr == 2) fc_softmax_tile(2, S, kvp, npad, tb->m + t0, tb->l + t0, alpha);
      else fc_softmax_tile(1, S, kvp, npad, tb->m + t0, tb->l + t0, alpha);
      for (int r = 0; r < nr; r++) {
        float *s = S + r * kvp;
        if (pvdt == SDPA_I8)
          for (int64_t j = 0; j < npad; j += 8) v8f_store(s + j, v8f_load(s + j) * v8f_load(tb->vsc + j));
        if (alpha[r] != 1.0f) {
          float *acc = tb->acc + (t0 + r) * D;
          v8f va = v8f_set1(alpha[r]);
          for (int64_t d = 0; d < D; d += 8) v8f_store(acc + d, v8f_load(acc + d) * va);
        }
      }
      if (c->panel16 && pvdt == SDPA_F32)
        flash_x512_pv_f32(nr, tb->acc + t0 * D, D, Vp, vps, n, S, kvp);
      else
        k_pv[pvdt][nr](tb->acc + t0 * D, D, Vp, vps, tb->vz, n, S, kvp);
    }
  }
}

/* ---- the generic path: one key block for every row of the task ---------- */

static void process_block(flash_ctx *c, thread_bufs *tb, int64_t b, int64_t hk, int64_t q0,
                          int64_t qbr, int64_t j0, int64_t j1, int mask_is_zero) {
  if (c->fast) {
    fast_block(c, tb, b, hk, q0, qbr, j0, j1, mask_is_zero);
    return;
  }
  const sdpa_args *a = c->a;
  const int64_t D = c->D, G = c->G, nk = j1 - j0, kvp = kvb_pad(c->kvb);
  const float *kp, *vp = NULL;
  int64_t ks, vs;
  float *Kf = tb->Kf, *Vf = tb->Vf;
  if (c->cfg->alloc_per_block) {
    Kf = c->k_direct ? NULL : (float *)sdpa_probe_malloc(nk * D * (int64_t)sizeof(float));
    Vf = c->v_direct ? NULL : (float *)sdpa_probe_malloc(nk * D * (int64_t)sizeof(float));
    if ((!c->k_direct && !Kf) || (!c->v_direct && !Vf)) {
      c->status = SDPA_UNSUPPORTED;
      sdpa_probe_free(Kf);
      sdpa_probe_free(Vf);
      return;
    }
  }
  if (c->k_direct) {
    kp = (const float *)a->k.data + sdpa_row_offset(&a->k, b, j0, hk);
    ks = a->k.stride[1];
  } else {
    convert_block(&a->k, b, j0, j1, hk, D, Kf);
    kp = Kf;
    ks = D;
  }
  if (c->v_direct) {
    vp = (const float *)a->v.data + sdpa_row_offset(&a->v, b, j0, hk);
    vs = a->v.stride[1];
  } else {
    vs = D; /* converted on first use */
  }
  const int use_mask = a->mask != NULL && !mask_is_zero;
  const float neg_inf = -INFINITY;
  for (int64_t g = 0; g < G; g++) {
    for (int64_t ii = 0; ii < qbr; ii++) {
      const int64_t r = g * qbr + ii, i = q0 + ii;
      const int64_t lim = fc_visible_keys(a, i, j0, nk);
      if (lim == 0) continue;
      float *s = tb->S + r * kvp;
      const float *q = tb->Q + r * D;
      for (int64_t jj = 0; jj < lim; jj++) s[jj] = sdpa_dot(q, kp + jj * ks, D);
      if (use_mask) {
        const float *mrow = a->mask + i * a->mask_row_stride + j0;
        for (int64_t jj = 0; jj < lim; jj++) s[jj] += mrow[jj];
      }
      int64_t limp = (lim + 7) & ~(int64_t)7;
      for (int64_t jj = lim; jj < limp; jj++) s[jj] = neg_inf;
      float bm = neg_inf;
      int has_nan = 0;
      for (int64_t jj = 0; jj < lim; jj++) {
        bm = s[jj] > bm ? s[jj] : bm;
        has_nan |= s[jj] != s[jj];
      }
      if (bm == neg_inf && !has_nan) continue; /* nothing visible in this block */
      float m_old = tb->m[r];
      float m_new = bm > m_old ? bm : m_old;
      if (has_nan) m_new = NAN; /* poison the row, as the reference would */
      v8f vm = v8f_set1(m_new), vsum = v8f_set1(0.f);
      for (int64_t jj = 0; jj < limp; jj += 8) {
        v8f e = v8f_exp(v8f_load(s + jj) - vm);
        v8f_store(s + jj, e);
        vsum += e;
      }
      float alpha = m_old == neg_inf ? 0.0f : sdpa_expf_fast(m_old - m_new);
      float *acc = tb->acc + r * D;
      if (alpha != 1.0f) sdpa_scal(acc, alpha, D);
      tb->l[r] = tb->l[r] * alpha + v8f_hsum(vsum);
      tb->m[r] = m_new;
      if (!vp) {
        convert_block(&a->v, b, j0, j1, hk, D, Vf);
        vp = Vf;
      }
      pv_accum(acc, s, vp, vs, lim, D);
    }
  }
  if (c->cfg->alloc_per_block) {
    sdpa_probe_free(Kf);
    sdpa_probe_free(Vf);
  }
}

/* The per-head slices of a task's buffers: head h_local of the task's chunk. */
static thread_bufs head_bufs(const flash_ctx *c, const thread_bufs *all, int64_t h_local) {
  thread_bufs tb = *all;
  tb.Q += h_local * c->R_max * c->D;
  tb.acc += h_local * c->R_max * c->D;
  tb.m += h_local * c->R_max;
  tb.l += h_local * c->R_max;
  if (tb.qf) tb.qf += h_local * c->R_max;
  if (tb.qs) tb.qs += h_local * c->R_max;
  if (tb.qz) tb.qz += h_local * c->R_max;
  return tb;
}

/* The per-token scales and zero points of keys [j0, j0 + nk), heads [hk0, hk0 + nh)
 * of an int8 tensor for the block path, key-major with heads adjacent: read in
 * place when the tensor has them so (a copy per block cost 10 % at (32, 8, 64),
 * Zen 5), else copied into sc / zp with nh elements a key. Returns the key stride. */
static int64_t x512_qparams(const sdpa_tensor *t, int64_t b, int64_t j0, int64_t nk,
                            int64_t hk0, int64_t nh, float *sc, int8_t *zp, const float **sc_out,
                            const int8_t **zp_out) {
  const int64_t qo = b * t->qstride[0] + j0 * t->qstride[1] + hk0 * t->qstride[2];
  if (t->qstride[2] == 1 && t->zero_point) {
    *sc_out = t->scale + qo;
    *zp_out = t->zero_point + qo;
    return t->qstride[1];
  }
  *sc_out = sc;
  *zp_out = zp;
  for (int64_t j = 0; j < nk; j++)
    for (int64_t h = 0; h < nh; h++) {
      int32_t z;
      sdpa_qparams(t, b, j0 + j, hk0 + h, &sc[j * nh + h], &z);
      zp[j * nh + h] = (int8_t)z;
    }
  return nh;
}

/* Keys [j0, j1) of every kv head of the task on the AVX-512 block path. */
static void x512_block(flash_ctx *c, thread_bufs *tb, int64_t b, int64_t hk0, int64_t nh,
                       int64_t q0, int64_t qbr, int64_t j0, int64_t j1, int64_t next_n,
                       int64_t span, int mask_is_zero) {
  const sdpa_args *a = c->a;
  const int64_t nk = j1 - j0;
  int64_t lim[16];
  int any = 0;
  for (int64_t i = 0; i < qbr; i++) {
    lim[i] = fc_visible_keys(a, q0 + i, j0, nk);
    any |= lim[i] > 0;
  }
  if (!any) return; /* no row sees a key of the block */
  const int use_mask = a->mask != NULL && !mask_is_zero;
  if (use_mask)
    for (int64_t j = 0; j < nk; j++)
      for (int64_t i = 0; i < qbr; i++)
        tb->mk[j * 16 + i] = a->mask[(q0 + i) * a->mask_row_stride + j0 + j];
  const float *ksc = NULL, *vsc = NULL;
  const int8_t *kz = NULL, *vz = NULL;
  int64_t kq1 = 0, vq1 = 0;
  if (a->k.dtype == SDPA_I8) {
    kq1 = x512_qparams(&a->k, b, j0, nk, hk0, nh, tb->ksc, (int8_t *)tb->kz, &ksc, &kz);
    vq1 = x512_qparams(&a->v, b, j0, nk, hk0, nh, tb->vsc, (int8_t *)tb->vz, &vsc, &vz);
  }
  const int64_t ki = sdpa_isz(a->k.dtype), vi = ki; /* K and V share a dtype here */
  /* the rows of a position's heads back to back, K as V: the block path prefetches */
  const int dense = a->k.stride[2] == c->D && a->v.stride[2] == c->D &&
                    a->k.stride[1] == nh * c->D && a->v.stride[1] == nh * c->D;
  const char *K = (const char *)a->k.data + sdpa_row_offset(&a->k, b, j0, hk0) * ki;
  const int64_t pf_bytes = dense ? nh * c->D * ki : 0; /* (task: span keys of K and V) */
  const flash_x512_block xb = {
      .nh = nh, .R = c->G * qbr, .qbr = qbr, .D = c->D, .n = nk,
      .kdt = a->k.dtype, .vdt = a->v.dtype, .iqk = c->iqk,
      .Qp = tb->Qp, .qf = tb->qf, .qs = tb->qs,
      .K = K,
      .V = (const char *)a->v.data + sdpa_row_offset(&a->v, b, j0, hk0) * vi,
      .ks1 = a->k.stride[1] * ki, .ks2 = a->k.stride[2] * ki,
      .vs1 = a->v.stride[1] * vi, .vs2 = a->v.stride[2] * vi,
      .ksc = ksc, .vsc = vsc, .kz = kz, .vz = vz, .kq1 = kq1, .vq1 = vq1,
      .lim = lim, .mask = use_mask ? tb->mk : NULL,
      .acc = tb->acc, .m = tb->m, .l = tb->l, .S = tb->S,
      .pf_bytes = pf_bytes, .pf_l2 = FLASH_X512_PF_L2(c->kvb * pf_bytes, 2 * span * pf_bytes),
      .next_k = K + nk * a->k.stride[1] * ki, .next_n = next_n};
  flash_x512_run(&xb);
}

/* Keys [lo, hi) in blocks; within a block, every kv head of the task in turn, so
 * a task over all heads reads K / V in memory order (position-major layouts). */
static void visit_range(flash_ctx *c, thread_bufs *tb, int64_t b, int64_t hk0, int64_t nh,
                        int64_t q0, int64_t qbr, int64_t qbi, int64_t lo, int64_t hi) {
  const flash_mask_plan *plan = c->cfg->plan;
  for (int64_t j0 = lo; j0 < hi; j0 += c->kvb) {
    int64_t j1 = j0 + c->kvb < hi ? j0 + c->kvb : hi;
    int zero = 0;
    if (plan) {
      const int32_t *zp = plan->zero_prefix + qbi * (c->a->kv_len + 1);
      zero = (zp[j1] - zp[j0]) == (int32_t)(j1 - j0);
    }
    if (c->x512) {
      const int64_t j2 = j1 + c->kvb < hi ? j1 + c->kvb : hi;
      x512_block(c, tb, b, hk0, nh, q0, qbr, j0, j1, j2 - j1, hi - lo, zero);
      continue;
    }
    if (tb->pf) /* while this block runs, bring in the next one */
      fc_prefetch_aim(tb->pf, j1, j1 + c->kvb < hi ? j1 + c->kvb : hi);
    for (int64_t h = 0; h < nh; h++) {
      thread_bufs hb = head_bufs(c, tb, h);
      process_block(c, &hb, b, hk0 + h, q0, qbr, j0, j1, zero);
    }
  }
}

static void write_rows(flash_ctx *c, thread_bufs *tb, int64_t b, int64_t hk, int64_t q0,
                       int64_t qbr) {
  const sdpa_args *a = c->a;
  const int64_t D = c->D;
  for (int64_t g = 0; g < c->G; g++) {
    for (int64_t ii = 0; ii < qbr; ii++) {
      int64_t r = g * qbr + ii;
      float *acc = tb->acc + r * D;
      float l = tb->l[r];
      if (l > 0.0f) fc_scal(acc, 1.0f / l, D);
      else if (l == 0.0f) memset(acc, 0, (size_t)D * sizeof(float)); /* no visible key */
      else for (int64_t d = 0; d < D; d++) acc[d] = NAN;
      int64_t off = sdpa_row_offset(&a->out, b, q0 + ii, hk * c->G + g);
      sdpa_store_row(a->out.data, a->out.dtype, off, a->out.stride[3], D, acc);
    }
  }
}

/* Index of the split-k partial state of (batch, kv head, query block, split). */
static int64_t partial_index(const flash_ctx *c, int64_t b, int64_t hk, int64_t qbi,
                             int64_t split) {
  return ((b * c->a->n_kv_heads + hk) * c->n_qblocks + qbi) * c->n_splits + split;
}

/* Task t = (batch, chunk of kv heads, query block, kv split). */
static void flash_task(void *vctx, int64_t t, int thread) {
  flash_ctx *c = (flash_ctx *)vctx;
  const sdpa_args *a = c->a;
  const int64_t D = c->D;
  int64_t split = t % c->n_splits, rest = t / c->n_splits;
  int64_t qbi = rest % c->n_qblocks;
  rest /= c->n_qblocks;
  int64_t hci = rest % c->n_hchunks, b = rest / c->n_hchunks;
  int64_t hk0 = hci * c->hc;
  int64_t nh = a->n_kv_heads - hk0 < c->hc ? a->n_kv_heads - hk0 : c->hc;
  int64_t q0 = qbi * c->qb;
  int64_t qbr = a->q_len - q0 < c->qb ? a->q_len - q0 : c->qb;

  float *base = (float *)(c->scratch + (int64_t)thread * c->scratch_stride);
  thread_bufs tb = scratch_bufs(c, base);
  fc_prefetch pf;
  if (c->fast && !c->x512 && a->kv_len > 0) { /* (x512 reads in memory order itself) */
    const int64_t ki = sdpa_isz(a->k.dtype), vi = sdpa_isz(a->v.dtype);
    pf.k = (const char *)a->k.data + sdpa_row_offset(&a->k, b, 0, hk0) * ki;
    pf.v = (const char *)a->v.data + sdpa_row_offset(&a->v, b, 0, hk0) * vi;
    pf.ks1 = a->k.stride[1] * ki;
    pf.ks2 = a->k.stride[2] * ki;
    pf.vs1 = a->v.stride[1] * vi;
    pf.vs2 = a->v.stride[2] * vi;
    pf.kbytes = D * ki;
    pf.vbytes = D * vi;
    pf.klines = (pf.kbytes + 63) / 64;
    pf.vlines = (pf.vbytes + 63) / 64;
    pf.nh = nh;
    /* rows of one position for the task's heads back to back, positions too */
    pf.linear = pf.ks2 == pf.kbytes && pf.vs2 == pf.vbytes && pf.ks1 == nh * pf.kbytes &&
                pf.vs1 == nh * pf.vbytes;
#ifdef FC_X86
    pf.spread_f32 = fc_intel();
#else
    pf.spread_f32 = 0;
#endif
    pf.memo_ks = pf.memo_steps = 0;
    fc_prefetch_aim(&pf, 0, 0);
    tb.pf = &pf;
  }

  for (int64_t h = 0; h < nh; h++) {
    thread_bufs hb = head_bufs(c, &tb, h);
    for (int64_t g = 0; g < c->G; g++) {
      for (int64_t ii = 0; ii < qbr; ii++) {
        int64_t r = g * qbr + ii;
        float *q = hb.Q + r * D;
        if (c->iqk) { /* (q - zq) as int16, in the row's place in Q */
          int16_t *qi = (int16_t *)hb.Q + r * D;
          const int64_t hq = (hk0 + h) * c->G + g;
          const int8_t *src = (const int8_t *)a->q.data + sdpa_row_offset(&a->q, b, q0 + ii, hq);
          float sq;
          int32_t zq;
          sdpa_qparams(&a->q, b, q0 + ii, hq, &sq, &zq);
          int32_t sum = 0;
          for (int64_t d = 0; d < D; d++) {
            qi[d] = (int16_t)((int32_t)src[d * a->q.stride[3]] - zq);
            sum += qi[d];
          }
          hb.qf[r] = sq * c->scale;
          hb.qs[r] = (float)sum;
          if (hb.qz) hb.qz[r] = (float)zq;
        } else {
          sdpa_load_token(&a->q, b, q0 + ii, (hk0 + h) * c->G + g, D, q);
          fc_scal(q, c->scale, D);
        }
        memset(hb.acc + r * D, 0, (size_t)D * sizeof(float));
        hb.m[r] = -INFINITY;
        hb.l[r] = 0.0f;
      }
    }
  }

  if (c->x512) /* every row of the task is loaded: pack Q for the block path */
    flash_x512_pack_q(tb.Q, nh, c->R_max, D, c->iqk ? 2 * c->R_max * D : c->R_max * D, tb.qz,
                      tb.qs, tb.Qp);

  int64_t lo = split * c->split_len;
  int64_t hi = lo + c->split_len < a->kv_len ? lo + c->split_len : a->kv_len;
  if (a->is_causal) {
    int64_t causal_end = a->start_pos + q0 + qbr; /* last row sees keys < this */
    if (causal_end < hi) hi = causal_end;
  }
  if (c->cfg->plan) {
    const flash_mask_plan *p = c->cfg->plan;
    for (int64_t s = p->seg_begin[qbi]; s < p->seg_begin[qbi + 1]; s++) {
      int64_t s0 = p->segs[2 * s] > lo ? p->segs[2 * s] : lo;
      int64_t s1 = p->segs[2 * s + 1] < hi ? p->segs[2 * s + 1] : hi;
      if (s0 < s1) visit_range(c, &tb, b, hk0, nh, q0, qbr, qbi, s0, s1);
    }
  } else if (lo < hi) {
    visit_range(c, &tb, b, hk0, nh, q0, qbr, qbi, lo, hi);
  }

  for (int64_t h = 0; h < nh; h++) {
    thread_bufs hb = head_bufs(c, &tb, h);
    if (c->n_splits == 1) {
      write_rows(c, &hb, b, hk0 + h, q0, qbr);
      continue;
    }
    float *part = c->partial + partial_index(c, b, hk0 + h, qbi, split) * c->R_max * (D + 2);
    for (int64_t r = 0; r < c->G * qbr; r++) {
      float *pr = part + r * (D + 2);
      pr[0] = hb.m[r];
      pr[1] = hb.l[r];
      memcpy(pr + 2, hb.acc + r * D, (size_t)D * sizeof(float));
    }
  }
}

/* Merge the split-k partial states of one (batch, kv head, query block). */
static void merge_task(void *vctx, int64_t t, int thread) {
  flash_ctx *c = (flash_ctx *)vctx;
  const sdpa_args *a = c->a;
  const int64_t D = c->D;
  int64_t qbi = t % c->n_qblocks, rest = t / c->n_qblocks;
  int64_t hk = rest % a->n_kv_heads, b = rest / a->n_kv_heads;
  int64_t q0 = qbi * c->qb;
  int64_t qbr = a->q_len - q0 < c->qb ? a->q_len - q0 : c->qb;
  float *base = (float *)(c->scratch + (int64_t)thread * c->scratch_stride);
  thread_bufs tb;
  memset(&tb, 0, sizeof tb);
  tb.acc = base + c->layout.merge_acc;
  tb.l = base + c->layout.merge_l;
  for (int64_t r = 0; r < c->G * qbr; r++) {
    float M = -INFINITY;
    int nan_seen = 0;
    for (int64_t s = 0; s < c->n_splits; s++) {
      const float *pr = c->partial + (partial_index(c, b, hk, qbi, s) * c->R_max + r) * (D + 2);
      if (pr[0] != pr[0]) nan_seen = 1;
      if (pr[1] != 0.0f && pr[0] > M) M = pr[0];
    }
    float *acc = tb.acc + r * D, L = 0.0f;
    memset(acc, 0, (size_t)D * sizeof(float));
    for (int64_t s = 0; s < c->n_splits; s++) {
      const float *pr = c->partial + (partial_index(c, b, hk, qbi, s) * c->R_max + r) * (D + 2);
      if (pr[1] == 0.0f || pr[0] != pr[0]) continue;
      float w = expf(pr[0] - M);
      L += pr[1] * w;
      sdpa_axpy(acc, w, pr + 2, D);
    }
    tb.l[r] = nan_seen ? NAN : L;
  }
  write_rows(c, &tb, b, hk, q0, qbr);
}

int flash_core(const sdpa_args *a, const flash_cfg *cfg) {
  if (a->batch == 0 || a->q_len == 0) return SDPA_OK;
  if (cfg->q_block <= 0 || cfg->kv_block < 0) return SDPA_INVALID;
  flash_ctx c;
  memset(&c, 0, sizeof c);
  setup(&c, a, cfg);
  int nt = sdpa_threads(a);
  c.scratch_stride = c.layout.floats * (int64_t)sizeof(float);
  c.scratch = (char *)sdpa_probe_malloc(c.scratch_stride * nt);
  if (!c.scratch) return SDPA_UNSUPPORTED;
  int64_t base_tasks = a->batch * c.n_hchunks * c.n_qblocks;
  int64_t merge_tasks = a->batch * a->n_kv_heads * c.n_qblocks;
  if (c.n_splits > 1) {
    c.partial = (float *)sdpa_probe_malloc(merge_tasks * c.n_splits * c.R_max * (c.D + 2) *
                                           (int64_t)sizeof(float));
    if (!c.partial) {
      sdpa_probe_free(c.scratch);
      return SDPA_UNSUPPORTED;
    }
  }
  c.status = SDPA_OK;
  sdpa_probe_parallel_for(nt, base_tasks * c.n_splits, flash_task, &c);
  if (c.n_splits > 1 && c.status == SDPA_OK)
    sdpa_probe_parallel_for(nt, merge_tasks, merge_task, &c);
  sdpa_probe_free(c.partial);
  sdpa_probe_free(c.scratch);
  return c.status;
}
