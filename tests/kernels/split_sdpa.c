/* A threaded F32 SDPA kernel with the structure of a real flash kernel's, for the
 * fuzzing tests to plant bugs in (tests/fuzz_kernels.py defines one macro each):
 *
 *   - tasks are (batch, head) pairs; with more threads than tasks each task's keys
 *     are split over several threads (split-K) and the partial softmax states
 *     (max, sum, weighted V) merged after the join;
 *   - a per-row table of key blocks (SKIP_BLOCK keys) the mask hides entirely, which
 *     the score loop skips;
 *   - work items claimed from an atomic counter by the calling thread and
 *     n_threads - 1 spawned ones, each with its own scratch row.
 *
 * Other dtypes are SDPA_UNSUPPORTED. Correct as written; each BUG_* macro is a bug
 * such kernels have had:
 *   BUG_SPLIT_MERGE    partial sums added without rescaling to the common max
 *   BUG_MASK_SKIP      a block skipped when its first key is hidden, not all of them
 *   BUG_STATE          K packed once and kept across calls, keyed by its address
 *   BUG_SHARED_SCRATCH the scratch row shared by every thread of a call (a race)
 *   BUG_INIT_RACE      the skip table built after the threads start (a race: a thread
 *                      that starts at once reads it unbuilt) */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "sdpa_probe.h"

#define SKIP_BLOCK 4
#define MAX_THREADS 256

typedef struct {
  const sdpa_args *a;
  int64_t splits, items, nblk, D, group;
  float scale;
  unsigned char *skip;   /* [q_len][nblk]: 1 = every key of the block hidden */
  float *part;           /* [items][q_len][D + 2]: weighted V, max, sum */
  float *scratch;        /* [threads][kv_len] */
  const float *kpacked;  /* BUG_STATE: K as [batch][kv_len][n_kv_heads][D] */
  _Atomic int64_t next;
} plan;

static float ld(const sdpa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d) {
  return ((const float *)t->data)[b * t->stride[0] + s * t->stride[1] + h * t->stride[2] +
                                  d * t->stride[3]];
}

#ifdef BUG_STATE
/* K packed contiguous, kept for the next call on the same K buffer (its address and
 * size): a decode loop's cache is rewritten in place between calls. */
static const float *packed_k(const sdpa_args *a) {
  static float *kept;
  static const void *kept_src;
  static int64_t kept_n;
  const int64_t n = a->batch * a->kv_len * a->n_kv_heads * a->head_dim;
  if (a->k.data == kept_src && n == kept_n) return kept;
  free(kept);
  kept = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  if (kept == NULL) return NULL;
  for (int64_t b = 0; b < a->batch; b++)
    for (int64_t j = 0; j < a->kv_len; j++)
      for (int64_t h = 0; h < a->n_kv_heads; h++)
        for (int64_t d = 0; d < a->head_dim; d++)
          kept[((b * a->kv_len + j) * a->n_kv_heads + h) * a->head_dim + d] = ld(&a->k, b, j, h, d);
  kept_src = a->k.data;
  kept_n = n;
  return kept;
}
#endif

static void build_skip(plan *p) {
  const sdpa_args *a = p->a;
  for (int64_t i = 0; i < a->q_len; i++)
    for (int64_t blk = 0; blk < p->nblk; blk++) {
      int hidden = a->mask != NULL;
      for (int64_t j = blk * SKIP_BLOCK; hidden && j < (blk + 1) * SKIP_BLOCK && j < a->kv_len; j++) {
        hidden = a->mask[i * a->mask_row_stride + j] == -INFINITY;
#ifdef BUG_MASK_SKIP
        break;
#endif
      }
      p->skip[i * p->nblk + blk] = (unsigned char)hidden;
    }
}

/* Work item w: task w / splits, its keys' share w % splits; every query row's partial. */
static void run_item(plan *p, int64_t w, float *sc) {
  const sdpa_args *a = p->a;
  const int64_t task = w / p->splits, part = w % p->splits, b = task / a->n_heads;
  const int64_t h = task % a->n_heads, hk = h / p->group, D = p->D;
  const int64_t per = (a->kv_len + p->splits - 1) / p->splits;
  const int64_t lo = part * per, hi = lo + per < a->kv_len ? lo + per : a->kv_len;
  for (int64_t i = 0; i < a->q_len; i++) {
    float *out = p->part + (w * a->q_len + i) * (D + 2);
    int64_t end = hi;
    if (a->is_causal && a->start_pos + i + 1 < end) end = a->start_pos + i + 1;
    float mx = -INFINITY, sum = 0.0f;
    for (int64_t j = lo; j < end; j++) {
      sc[j] = -INFINITY;
      if (p->skip[i * p->nblk + j / SKIP_BLOCK]) continue;
      float s = 0.0f;
#ifdef BUG_STATE
      const float *kr = p->kpacked + ((b * a->kv_len + j) * a->n_kv_heads + hk) * D;
      for (int64_t d = 0; d < D; d++) s += ld(&a->q, b, i, h, d) * kr[d];
#else
      for (int64_t d = 0; d < D; d++) s += ld(&a->q, b, i, h, d) * ld(&a->k, b, j, hk, d);
#endif
      s *= p->scale;
      if (a->mask) s += a->mask[i * a->mask_row_stride + j];
      sc[j] = s;
      if (s > mx || s != s) mx = s;
    }
    memset(out, 0, (size_t)D * sizeof(float));
    if (mx != -INFINITY)
      for (int64_t j = lo; j < end; j++) {
        if (sc[j] == -INFINITY) continue;
        const float wgt = expf(sc[j] - mx);
        sum += wgt;
        for (int64_t d = 0; d < D; d++) out[d] += wgt * ld(&a->v, b, j, hk, d);
      }
    out[D] = mx;
    out[D + 1] = sum;
  }
}

typedef struct {
  plan *p;
  int id;
} worker;

static void *work(void *arg) {
  worker *wk = arg;
  plan *p = wk->p;
#ifdef BUG_SHARED_SCRATCH
  float *sc = p->scratch;
#else
  float *sc = p->scratch + (int64_t)wk->id * (p->a->kv_len > 0 ? p->a->kv_len : 1);
#endif
  for (int64_t w; (w = atomic_fetch_add(&p->next, 1)) < p->items;) run_item(p, w, sc);
  return NULL;
}

static void merge(plan *p) {
  const sdpa_args *a = p->a;
  const int64_t D = p->D;
  for (int64_t task = 0; task < a->batch * a->n_heads; task++)
    for (int64_t i = 0; i < a->q_len; i++) {
      float m = -INFINITY, sum = 0.0f, acc[4096];
      for (int64_t s = 0; s < p->splits; s++) {
        const float pm = p->part[((task * p->splits + s) * a->q_len + i) * (D + 2) + D];
        if (pm > m || pm != pm) m = pm; /* a NaN row stays NaN */
      }
      memset(acc, 0, (size_t)D * sizeof(float));
      for (int64_t s = 0; s < p->splits && m != -INFINITY; s++) {
        const float *pt = p->part + ((task * p->splits + s) * a->q_len + i) * (D + 2);
        if (pt[D] == -INFINITY) continue;
#ifdef BUG_SPLIT_MERGE
        const float r = 1.0f;
#else
        const float r = expf(pt[D] - m);
#endif
        sum += r * pt[D + 1];
        for (int64_t d = 0; d < D; d++) acc[d] += r * pt[d];
      }
      float *o = (float *)a->out.data;
      const int64_t b = task / a->n_heads, h = task % a->n_heads;
      for (int64_t d = 0; d < D; d++)
        o[b * a->out.stride[0] + i * a->out.stride[1] + h * a->out.stride[2] +
          d * a->out.stride[3]] = sum != 0.0f ? acc[d] / sum : 0.0f; /* NaN: NaN */
    }
}

int sdpa_forward(const sdpa_args *a) {
  int st = sdpa_validate_args(a);
  if (st != SDPA_OK) return st;
  if (a->q.dtype != SDPA_F32 || a->k.dtype != SDPA_F32 || a->head_dim > 4096)
    return SDPA_UNSUPPORTED;
  if (a->batch == 0 || a->q_len == 0) return SDPA_OK;
  plan p = {.a = a, .D = a->head_dim, .group = a->n_heads / a->n_kv_heads};
  int threads = a->n_threads > 0 ? a->n_threads : 1;
  if (threads > MAX_THREADS) threads = MAX_THREADS;
  const int64_t tasks = a->batch * a->n_heads;
  p.splits = threads > tasks && a->kv_len > 1 ? (threads + tasks - 1) / tasks : 1;
  p.items = tasks * p.splits;
  p.nblk = (a->kv_len + SKIP_BLOCK - 1) / SKIP_BLOCK;
  p.scale = a->scale > 0 ? a->scale : 1.0f / sqrtf((float)p.D);
  const int64_t kv1 = a->kv_len > 0 ? a->kv_len : 1;
  p.skip = malloc((size_t)(a->q_len * (p.nblk > 0 ? p.nblk : 1)));
  p.part = malloc((size_t)(p.items * a->q_len * (p.D + 2)) * sizeof(float));
  p.scratch = malloc((size_t)(threads * kv1) * sizeof(float));
  pthread_t tid[MAX_THREADS];
  worker wk[MAX_THREADS];
  int started = 0;
  if (!p.skip || !p.part || !p.scratch) goto done;
#ifdef BUG_STATE
  p.kpacked = packed_k(a);
#endif
#ifndef BUG_INIT_RACE
  build_skip(&p);
#endif
  atomic_store(&p.next, 0);
  for (int t = 1; t < threads; t++) {
    wk[t] = (worker){&p, t};
    if (pthread_create(&tid[t], NULL, work, &wk[t]) == 0) started = t;
    else break;
  }
#ifdef BUG_INIT_RACE
  build_skip(&p);
#endif
  wk[0] = (worker){&p, 0};
  work(&wk[0]);
  for (int t = 1; t <= started; t++) pthread_join(tid[t], NULL);
  merge(&p);
done:
  st = p.skip && p.part && p.scratch ? SDPA_OK : SDPA_UNSUPPORTED;
  free(p.skip);
  free(p.part);
  free(p.scratch);
  return st;
}
