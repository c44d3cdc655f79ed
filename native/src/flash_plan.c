/* The plan of a flash_core call: its configuration's defaults, the query and key
 * block sizes, the tasks (kv heads per task, key splits), which block path runs,
 * and the layout of each thread's scratch. */
#include "flash_amx.h"
#include "flash_internal.h"
#include "flash_x512.h"

void flash_cfg_defaults(flash_cfg *cfg, const sdpa_probe_flash_opts *opts) {
  cfg->q_block = FLASH_DEFAULT_Q_BLOCK;
  cfg->q_block_auto = 1;
  cfg->kv_block = 0; /* chosen from the shape */
  cfg->n_splits = 0;
  cfg->alloc_per_block = 0;
  cfg->bf16_products = 0;
  cfg->plan = NULL;
  if (opts) {
    if (opts->q_block > 0) cfg->q_block = opts->q_block, cfg->q_block_auto = 0;
    if (opts->kv_block > 0) cfg->kv_block = opts->kv_block;
    if (opts->n_splits > 0) cfg->n_splits = opts->n_splits;
  }
}

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
                              .qz = -1, .KT = -1, .Kf = -1, .Vf = -1, .amx = -1};
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
    if (c->amx) {
      L->amx = take(&n, PAD16(flash_amx_scratch_floats(c->R_max, D, kvb)));
    } else if (c->panel) {
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

void flash_setup(flash_ctx *c, const sdpa_args *a, const flash_cfg *cfg) {
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
  c->amx = cfg->bf16_products && c->panel16 && c->D % 32 == 0 && flash_amx_available();
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
  flash_setup(&c, a, cfg);
  return c.layout.floats * (int64_t)sizeof(float);
}

static float *region(float *base, int64_t at) { return at < 0 ? NULL : base + at; }

thread_bufs flash_scratch_bufs(const flash_ctx *c, float *base) {
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
  tb.amx = region(base, L->amx);
  return tb;
}
