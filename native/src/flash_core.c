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
 *
 * Where: the plan of a call and its scratch layout in flash_plan.c, the tile
 * kernels in flash_tiles.c, the fast path's block in flash_fast.c, the generic
 * path's in flash_generic.c, their shared helpers in flash_vec.h and
 * flash_prefetch.h; here the tasks, their key ranges and the split-k merge.
 */
#include <math.h>
#include <stdlib.h>

#include "flash_amx.h"
#include "flash_internal.h"
#include "flash_x512.h"

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

static void process_block(flash_ctx *c, thread_bufs *tb, int64_t b, int64_t hk, int64_t q0,
                          int64_t qbr, int64_t j0, int64_t j1, int mask_is_zero) {
  if (c->fast) {
    flash_fast_block(c, tb, b, hk, q0, qbr, j0, j1, mask_is_zero);
    return;
  }
  flash_generic_block(c, tb, b, hk, q0, qbr, j0, j1, mask_is_zero);
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
  thread_bufs tb = flash_scratch_bufs(c, base);
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

  if (c->amx) /* every row of the task is loaded: Q as the tiles' operands */
    flash_amx_pack_q(tb.Q, c->G * qbr, D, tb.amx);
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
  flash_setup(&c, a, cfg);
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
