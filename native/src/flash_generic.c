/* The generic path's key block (any dim stride, any head_dim, and the int8
 * variant that allocates its dequant buffers per key block): K / V converted
 * to F32 unless read in place (into scratch, or into buffers allocated for the
 * block), then row by row the scores, the online softmax and P.V. */
#include <math.h>

#include "flash_internal.h"

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

void flash_generic_block(flash_ctx *c, thread_bufs *tb, int64_t b, int64_t hk, int64_t q0,
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
