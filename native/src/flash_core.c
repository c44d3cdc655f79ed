/* Tiled online-softmax attention (flash attention) on the CPU.
 *
 * A task is (batch, kv head, query block, kv split). Its rows are every query
 * head of the kv head's group times the query rows of the block, so each K/V
 * block is read once for the whole group (GQA in-kernel, no broadcast copy).
 * Long kv ranges are split across tasks (split-k / flash-decoding) and the
 * partial softmax states merged afterwards, so batch-1 decode uses all threads.
 */
#include <math.h>
#include <stdlib.h>

#include "flash_core.h"

#define PAD16(n) (((n) + 15) & ~(int64_t)15)

typedef struct {
  const sdpa_args *a;
  const flash_cfg *cfg;
  int64_t G, qb, kvb, n_qblocks, n_splits, split_len, R_max, D;
  float scale;
  int k_direct, v_direct; /* F32 with unit dim stride: read in place */
  char *scratch;
  int64_t scratch_stride; /* bytes per thread */
  float *partial;         /* split-k: [task][R_max][D + 2] */
  int status;
} flash_ctx;

void flash_cfg_defaults(flash_cfg *cfg, const sdpa_probe_flash_opts *opts) {
  cfg->q_block = FLASH_DEFAULT_Q_BLOCK;
  cfg->kv_block = FLASH_DEFAULT_KV_BLOCK;
  cfg->n_splits = 0;
  cfg->alloc_per_block = 0;
  cfg->plan = NULL;
  if (opts) {
    if (opts->q_block > 0) cfg->q_block = opts->q_block;
    if (opts->kv_block > 0) cfg->kv_block = opts->kv_block;
    if (opts->n_splits > 0) cfg->n_splits = opts->n_splits;
  }
}

static int64_t kvb_pad(int64_t kvb) { return PAD16(kvb); }

static int64_t per_thread_floats(const flash_ctx *c) {
  int64_t R = c->R_max, D = c->D, kvb = c->kvb;
  int64_t n = 2 * PAD16(R * D) + 2 * PAD16(R) + PAD16(R * kvb_pad(kvb));
  if (!c->cfg->alloc_per_block) {
    if (!c->k_direct) n += PAD16(kvb * D);
    if (!c->v_direct) n += PAD16(kvb * D);
  }
  return n;
}

static void setup(flash_ctx *c, const sdpa_args *a, const flash_cfg *cfg) {
  c->a = a;
  c->cfg = cfg;
  c->D = a->head_dim;
  c->G = a->n_heads / a->n_kv_heads;
  c->qb = cfg->q_block < a->q_len ? cfg->q_block : a->q_len;
  if (c->qb < 1) c->qb = 1;
  c->kvb = cfg->kv_block;
  c->n_qblocks = (a->q_len + c->qb - 1) / c->qb;
  c->R_max = c->G * c->qb;
  c->scale = sdpa_effective_scale(a);
  c->k_direct = a->k.dtype == SDPA_F32 && a->k.stride[3] == 1;
  c->v_direct = a->v.dtype == SDPA_F32 && a->v.stride[3] == 1;
  int nt = sdpa_threads(a);
  int64_t base = a->batch * a->n_kv_heads * c->n_qblocks;
  int64_t max_splits = (a->kv_len + c->kvb - 1) / c->kvb;
  if (max_splits < 1) max_splits = 1;
  int64_t ns = cfg->n_splits;
  if (ns <= 0) {
    ns = 1;
    if (base < 4 * nt && a->kv_len >= 4 * c->kvb) ns = (4 * nt + base - 1) / base;
  }
  if (ns > max_splits) ns = max_splits;
  c->n_splits = ns;
  /* split boundaries on kv-block multiples */
  int64_t blocks_per_split = (max_splits + ns - 1) / ns;
  c->split_len = blocks_per_split * c->kvb;
}

int64_t flash_scratch_bytes(const sdpa_args *a, const flash_cfg *cfg) {
  flash_ctx c;
  setup(&c, a, cfg);
  return per_thread_floats(&c) * (int64_t)sizeof(float);
}

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
} thread_bufs;

static void process_block(flash_ctx *c, thread_bufs *tb, int64_t b, int64_t hk, int64_t q0,
                          int64_t qbr, int64_t j0, int64_t j1, int mask_is_zero) {
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
      int64_t lim = nk;
      if (a->is_causal) {
        int64_t vis = a->start_pos + i + 1 - j0;
        if (vis < lim) lim = vis;
      }
      if (lim <= 0) continue;
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

static void visit_range(flash_ctx *c, thread_bufs *tb, int64_t b, int64_t hk, int64_t q0,
                        int64_t qbr, int64_t qbi, int64_t lo, int64_t hi) {
  const flash_mask_plan *plan = c->cfg->plan;
  for (int64_t j0 = lo; j0 < hi; j0 += c->kvb) {
    int64_t j1 = j0 + c->kvb < hi ? j0 + c->kvb : hi;
    int zero = 0;
    if (plan) {
      const int32_t *zp = plan->zero_prefix + qbi * (c->a->kv_len + 1);
      zero = (zp[j1] - zp[j0]) == (int32_t)(j1 - j0);
    }
    process_block(c, tb, b, hk, q0, qbr, j0, j1, zero);
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
      if (l > 0.0f) sdpa_scal(acc, 1.0f / l, D);
      else if (l == 0.0f) memset(acc, 0, (size_t)D * sizeof(float)); /* no visible key */
      else for (int64_t d = 0; d < D; d++) acc[d] = NAN;
      int64_t off = sdpa_row_offset(&a->out, b, q0 + ii, hk * c->G + g);
      sdpa_store_row(a->out.data, a->out.dtype, off, a->out.stride[3], D, acc);
    }
  }
}

static void flash_task(void *vctx, int64_t t, int thread) {
  flash_ctx *c = (flash_ctx *)vctx;
  const sdpa_args *a = c->a;
  const int64_t D = c->D;
  int64_t split = t % c->n_splits, rest = t / c->n_splits;
  int64_t qbi = rest % c->n_qblocks;
  rest /= c->n_qblocks;
  int64_t hk = rest % a->n_kv_heads, b = rest / a->n_kv_heads;
  int64_t q0 = qbi * c->qb;
  int64_t qbr = a->q_len - q0 < c->qb ? a->q_len - q0 : c->qb;
  int64_t R = c->G * qbr;

  float *base = (float *)(c->scratch + (int64_t)thread * c->scratch_stride);
  thread_bufs tb;
  tb.Q = base;
  tb.acc = tb.Q + PAD16(c->R_max * D);
  tb.m = tb.acc + PAD16(c->R_max * D);
  tb.l = tb.m + PAD16(c->R_max);
  tb.S = tb.l + PAD16(c->R_max);
  float *next = tb.S + PAD16(c->R_max * kvb_pad(c->kvb));
  tb.Kf = tb.Vf = NULL;
  if (!c->cfg->alloc_per_block) {
    if (!c->k_direct) { tb.Kf = next; next += PAD16(c->kvb * D); }
    if (!c->v_direct) { tb.Vf = next; }
  }

  for (int64_t g = 0; g < c->G; g++) {
    for (int64_t ii = 0; ii < qbr; ii++) {
      int64_t r = g * qbr + ii;
      float *q = tb.Q + r * D;
      sdpa_load_token(&a->q, b, q0 + ii, hk * c->G + g, D, q);
      sdpa_scal(q, c->scale, D);
      memset(tb.acc + r * D, 0, (size_t)D * sizeof(float));
      tb.m[r] = -INFINITY;
      tb.l[r] = 0.0f;
    }
  }

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
      if (s0 < s1) visit_range(c, &tb, b, hk, q0, qbr, qbi, s0, s1);
    }
  } else if (lo < hi) {
    visit_range(c, &tb, b, hk, q0, qbr, qbi, lo, hi);
  }

  if (c->n_splits == 1) {
    write_rows(c, &tb, b, hk, q0, qbr);
  } else {
    float *part = c->partial + t * c->R_max * (D + 2);
    for (int64_t r = 0; r < R; r++) {
      float *pr = part + r * (D + 2);
      pr[0] = tb.m[r];
      pr[1] = tb.l[r];
      memcpy(pr + 2, tb.acc + r * D, (size_t)D * sizeof(float));
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
  thread_bufs tb = {0};
  tb.acc = base;
  tb.l = base + PAD16(c->R_max * D);
  for (int64_t r = 0; r < c->G * qbr; r++) {
    float M = -INFINITY;
    int nan_seen = 0;
    for (int64_t s = 0; s < c->n_splits; s++) {
      const float *pr = c->partial + ((t * c->n_splits + s) * c->R_max + r) * (D + 2);
      if (pr[0] != pr[0]) nan_seen = 1;
      if (pr[1] != 0.0f && pr[0] > M) M = pr[0];
    }
    float *acc = tb.acc + r * D, L = 0.0f;
    memset(acc, 0, (size_t)D * sizeof(float));
    for (int64_t s = 0; s < c->n_splits; s++) {
      const float *pr = c->partial + ((t * c->n_splits + s) * c->R_max + r) * (D + 2);
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
  if (cfg->q_block <= 0 || cfg->kv_block <= 0) return SDPA_INVALID;
  flash_ctx c;
  memset(&c, 0, sizeof c);
  setup(&c, a, cfg);
  int nt = sdpa_threads(a);
  c.scratch_stride = per_thread_floats(&c) * (int64_t)sizeof(float);
  /* the merge pass reuses the scratch for acc and l */
  int64_t merge_bytes = (PAD16(c.R_max * c.D) + PAD16(c.R_max)) * (int64_t)sizeof(float);
  if (merge_bytes > c.scratch_stride) c.scratch_stride = merge_bytes;
  c.scratch = (char *)sdpa_probe_malloc(c.scratch_stride * nt);
  if (!c.scratch) return SDPA_UNSUPPORTED;
  int64_t base_tasks = a->batch * a->n_kv_heads * c.n_qblocks;
  if (c.n_splits > 1) {
    c.partial = (float *)sdpa_probe_malloc(base_tasks * c.n_splits * c.R_max * (c.D + 2) *
                                           (int64_t)sizeof(float));
    if (!c.partial) {
      sdpa_probe_free(c.scratch);
      return SDPA_UNSUPPORTED;
    }
  }
  c.status = SDPA_OK;
  sdpa_probe_parallel_for(nt, base_tasks * c.n_splits, flash_task, &c);
  if (c.n_splits > 1 && c.status == SDPA_OK) sdpa_probe_parallel_for(nt, base_tasks, merge_task, &c);
  sdpa_probe_free(c.partial);
  sdpa_probe_free(c.scratch);
  return c.status;
}
