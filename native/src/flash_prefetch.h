/* flash_core's software prefetch of the next key block (the cursor a task
 * carries, fc_prefetch) and its spreading over a pass of the scores loop. */
#ifndef SDPA_PROBE_FLASH_PREFETCH_H
#define SDPA_PROBE_FLASH_PREFETCH_H

#include "common.h"

/* Software prefetch of the next key block. K / V rows are head_dim elements
 * spaced a whole position (every kv head) apart: read one head at a time that
 * is a strided walk the hardware prefetchers do not follow, and it reopens each
 * DRAM page once per head. So while a block is processed, the next block's rows
 * are prefetched in memory order (position-major, all heads of the task): a
 * cursor that advances one row per key processed, K and V. */
#define FC_PF_HINT 2 /* to L2 and below (prefetcht1): measured ~3% ahead of prefetcht0 */
typedef struct {
  int linear;                     /* rows of a position are dense: walk bytes */
  const char *kc, *kend, *vc, *vend; /* linear: cursors over the next block */
  const char *k, *v;              /* per row: K / V element (b, 0, hk0, 0) */
  int64_t ks1, ks2, vs1, vs2;     /* position and head strides, bytes */
  int64_t kbytes, vbytes;         /* bytes of one K / V row */
  int64_t klines, vlines;         /* 64-byte lines of one K / V row (rounded up) */
  int64_t nh;                     /* kv heads of the task */
  int64_t j, h, j_end;            /* per row: next row (position j, head h); none at j_end */
  int spread_f32;                 /* F32 8-key passes spread their share too (fc_pf_pass) */
  int64_t memo_ks, memo_steps;    /* the spread counts below are for passes of this shape */
  int64_t memo_kn, memo_vn, memo_kper, memo_vper;
} fc_prefetch;

/* n lines from p on (64-byte lines). */
SDPA_INLINE void fc_prefetch_n(const char *p, int64_t n) {
#pragma GCC unroll 4
  for (int64_t i = 0; i < n; i++) __builtin_prefetch(p + 64 * i, 0, FC_PF_HINT);
}

/* The next block's share for KS keys of this pass: KS K rows and KS V rows. */
SDPA_INLINE void fc_prefetch_step(fc_prefetch *pf, const int KS) {
  if (pf->linear) {
    const int64_t kb = KS * pf->kbytes, vb = KS * pf->vbytes;
    if (pf->kc + kb > pf->kend || pf->vc + vb > pf->vend) return; /* tail: left to the hardware */
    /* K and V interleaved (measurably better than one after the other), line by line
     * over the pass's contiguous bytes: one short loop, not one per row */
    const char *k = pf->kc, *v = pf->vc;
    if (kb == vb) {
      for (int64_t o = 0; o < kb; o += 64) {
        __builtin_prefetch(k + o, 0, FC_PF_HINT);
        __builtin_prefetch(v + o, 0, FC_PF_HINT);
      }
    } else {
      for (int64_t o = 0; o < kb || o < vb; o += 64) {
        if (o < kb) __builtin_prefetch(k + o, 0, FC_PF_HINT);
        if (o < vb) __builtin_prefetch(v + o, 0, FC_PF_HINT);
      }
    }
    pf->kc += kb;
    pf->vc += vb;
    return;
  }
  for (int k = 0; k < KS && pf->j < pf->j_end; k++) {
    fc_prefetch_n(pf->k + pf->j * pf->ks1 + pf->h * pf->ks2, pf->klines);
    fc_prefetch_n(pf->v + pf->j * pf->vs1 + pf->h * pf->vs2, pf->vlines);
    if (++pf->h == pf->nh) {
      pf->h = 0;
      pf->j++;
    }
  }
}

/* A pass's share of the linear prefetch, issued a few lines per inner-loop step
 * rather than in one burst at the start of the pass. Measured (Zen 1, 2 threads,
 * interleaved A/B, 3 runs): 12-19 % faster for F16 decode with one query row per
 * kv head (long 8-key passes of slow conversions), 3-7 % slower for F32 and for 2-key
 * passes, whose bursts are better issued early; so only 8-key passes over a
 * converted K dtype spread (int8 was neutral within the noise). On the Intel Xeon
 * (an -march=x86-64-v3 build) a burst stalls on the line fill buffers as the
 * AVX-512 block's did: spreading the F32 8-key passes too made F32 MHA decode
 * ((16, 16, 128), one row per kv head) 1.065x faster at kv 2048 and 32768 and 1.11x
 * at kv 8192, the rest within 2.5 %; 2-key passes spread were 4-10 % slower there
 * too. So F32 spreads on Intel cores (spread_f32), not on AMD ones. */
typedef struct {
  const char *k, *v;  /* next K / V line */
  int64_t kn, vn;     /* lines left */
  int64_t kper, vper; /* lines per step */
} fc_pf_pass;

/* Take the next block's share for KS keys (as fc_prefetch_step) to spread over
 * `steps` steps; with one step, or for the strided (non-linear) walk, it is issued
 * at once by fc_prefetch_step. */
SDPA_INLINE fc_pf_pass fc_prefetch_take(fc_prefetch *pf, const int KS, int64_t steps) {
  fc_pf_pass pp = {NULL, NULL, 0, 0, 0, 0};
  if (pf == NULL) return pp;
  if (!pf->linear || steps <= 1) {
    fc_prefetch_step(pf, KS);
    return pp;
  }
  const int64_t kb = KS * pf->kbytes, vb = KS * pf->vbytes;
  if (pf->kc + kb > pf->kend || pf->vc + vb > pf->vend) return pp; /* tail: the hardware's */
  /* every pass of a call has the same counts: two 64-bit divisions per pass had
   * cost more than the pass's prefetches (Zen 1: ~40 cycles each) */
  if (pf->memo_ks != KS || pf->memo_steps != steps) {
    pf->memo_ks = KS;
    pf->memo_steps = steps;
    pf->memo_kn = (kb + 63) / 64;
    pf->memo_vn = (vb + 63) / 64;
    pf->memo_kper = (pf->memo_kn + steps - 1) / steps;
    pf->memo_vper = (pf->memo_vn + steps - 1) / steps;
  }
  pp.k = pf->kc;
  pp.v = pf->vc;
  pp.kn = pf->memo_kn;
  pp.vn = pf->memo_vn;
  pp.kper = pf->memo_kper;
  pp.vper = pf->memo_vper;
  pf->kc += kb;
  pf->vc += vb;
  return pp;
}

/* One step's lines of a pass (everything left when kper / vper cover it). */
SDPA_INLINE void fc_prefetch_some(fc_pf_pass *pp, int64_t kper, int64_t vper) {
  /* the counts first, then plain loops: a bound test per line had kept the two
   * cursors, two counts and the bounds live across the scores loop (spills there) */
  const int64_t kc = pp->kn < kper ? pp->kn : kper, vc = pp->vn < vper ? pp->vn : vper;
  for (int64_t i = 0; i < kc; i++) __builtin_prefetch(pp->k + 64 * i, 0, FC_PF_HINT);
  for (int64_t i = 0; i < vc; i++) __builtin_prefetch(pp->v + 64 * i, 0, FC_PF_HINT);
  pp->k += 64 * kc;
  pp->kn -= kc;
  pp->v += 64 * vc;
  pp->vn -= vc;
}

#endif
