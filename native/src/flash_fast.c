/* The fast path's key block: every row of a task's kv head, in register tiles
 * of up to 4 rows (8 on the AVX-512 panel): the tile's scores (flash_tiles.c),
 * the K scales and the mask applied, the tile's online softmax, its P.V. On the
 * panel path the block's K is first transposed and its V converted to F32, once
 * for every tile. */
#include <math.h>

#include "flash_amx.h"
#include "flash_tiles.h"
#include "flash_x512.h"

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

void flash_fast_block(flash_ctx *c, thread_bufs *tb, int64_t b, int64_t hk, int64_t q0,
                      int64_t qbr, int64_t j0, int64_t j1, int mask_is_zero) {
  if (c->amx) {
    flash_amx_block(c, tb, b, hk, q0, qbr, j0, j1, mask_is_zero);
    return;
  }
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
      fc_k_pack_kt[kdt](K, ks, tb->kz, tb->ksc, nk, D, tb->KT, kvp, tb->pf);
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
        fc_k_scores_panel[nr](tb->Q + t0 * D, D, tb->KT, kvp, n, S, kvp);
#ifdef FC_X86
      else if (c->iqk)
        fc_k_scores_iq[nr]((const int16_t *)tb->Q + t0 * D, D, K, ks, n, S, kvp,
                           t0 == 0 ? tb->pf : NULL);
#endif
      else
        fc_k_scores[kdt][nr](tb->Q + t0 * D, D, K, ks, tb->kz, n, S, kvp,
                             t0 == 0 ? tb->pf : NULL);
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
        fc_k_pv[pvdt][nr](tb->acc + t0 * D, D, Vp, vps, tb->vz, n, S, kvp);
    }
  }
}
