/* `flash_maskskip`: flash plus a scan of the additive mask that finds, per
 * query block, the key ranges some row can see (skipping fully hidden key
 * blocks and trimming hidden block edges) and the blocks whose mask is all
 * zero (skipping the mask add there). The scan is shared by every batch
 * entry and head, since the mask is 2-D. */
#include <math.h>

#include "flash_core.h"

typedef struct {
  flash_mask_plan plan;
  int64_t *seg_begin, *segs;
  int32_t *zero_prefix;
} owned_plan;

static void plan_free(owned_plan *p) {
  sdpa_probe_free(p->seg_begin);
  sdpa_probe_free(p->segs);
  sdpa_probe_free(p->zero_prefix);
}

/* Returns SDPA_OK or SDPA_UNSUPPORTED (allocation failure). */
static int plan_build(const sdpa_args *a, int64_t qb, owned_plan *p) {
  const int64_t kv = a->kv_len, nqb = (a->q_len + qb - 1) / qb;
  p->seg_begin = (int64_t *)sdpa_probe_malloc((nqb + 1) * (int64_t)sizeof(int64_t));
  /* at most ceil(kv/2) runs per block; one run more per block as slack */
  int64_t max_segs = nqb * (kv / 2 + 2);
  p->segs = (int64_t *)sdpa_probe_malloc(2 * max_segs * (int64_t)sizeof(int64_t));
  p->zero_prefix = (int32_t *)sdpa_probe_malloc(nqb * (kv + 1) * (int64_t)sizeof(int32_t));
  if (!p->seg_begin || !p->segs || !p->zero_prefix) {
    plan_free(p);
    return SDPA_UNSUPPORTED;
  }
  int64_t n = 0;
  for (int64_t qbi = 0; qbi < nqb; qbi++) {
    int64_t q0 = qbi * qb, q1 = q0 + qb < a->q_len ? q0 + qb : a->q_len;
    int32_t *zp = p->zero_prefix + qbi * (kv + 1);
    p->seg_begin[qbi] = n;
    zp[0] = 0;
    int64_t run_start = -1;
    for (int64_t j = 0; j < kv; j++) {
      int visible = 0, zero = 1;
      for (int64_t i = q0; i < q1; i++) {
        float mv = a->mask[i * a->mask_row_stride + j];
        if (a->is_causal && j > a->start_pos + i) continue; /* hidden anyway */
        visible |= mv != -INFINITY;
        zero &= mv == 0.0f;
      }
      zp[j + 1] = zp[j] + (zero ? 1 : 0);
      if (visible && run_start < 0) run_start = j;
      if (!visible && run_start >= 0) {
        p->segs[2 * n] = run_start;
        p->segs[2 * n + 1] = j;
        n++;
        run_start = -1;
      }
    }
    if (run_start >= 0) {
      p->segs[2 * n] = run_start;
      p->segs[2 * n + 1] = kv;
      n++;
    }
  }
  p->seg_begin[nqb] = n;
  p->plan.n_qblocks = nqb;
  p->plan.seg_begin = p->seg_begin;
  p->plan.segs = p->segs;
  p->plan.zero_prefix = p->zero_prefix;
  return SDPA_OK;
}

/* Whether the call builds a mask plan (a mask, and something to run it on). */
static int uses_plan(const sdpa_args *a) {
  return a->mask != NULL && a->kv_len > 0 && a->batch > 0 && a->q_len > 0;
}

int sdpa_probe_flash_maskskip_forward_ex(const sdpa_args *a, const sdpa_probe_flash_opts *opts) {
  int st = sdpa_validate_args(a);
  if (st != SDPA_OK) return st;
  if (a->q.dtype == SDPA_I8 || (a->kv_len > 0 && (a->k.dtype == SDPA_I8 || a->v.dtype == SDPA_I8)))
    return SDPA_UNSUPPORTED;
  flash_cfg cfg;
  flash_cfg_defaults(&cfg, opts);
  if (!uses_plan(a)) return flash_core(a, &cfg);
  int64_t qb = cfg.q_block < a->q_len ? cfg.q_block : a->q_len;
  owned_plan p = {0};
  st = plan_build(a, qb, &p);
  if (st != SDPA_OK) return st;
  cfg.plan = &p.plan;
  st = flash_core(a, &cfg);
  plan_free(&p);
  return st;
}

int sdpa_probe_flash_maskskip_forward(const sdpa_args *a) {
  return sdpa_probe_flash_maskskip_forward_ex(a, NULL);
}

/* flash's scratch, with the query blocks a mask plan keeps (flash_core reads them
 * from cfg when a plan is given) */
int64_t sdpa_probe_flash_maskskip_scratch(const sdpa_args *a) {
  flash_cfg cfg;
  flash_cfg_defaults(&cfg, NULL);
  if (uses_plan(a)) cfg.q_block_auto = 0;
  return flash_scratch_bytes(a, &cfg);
}
