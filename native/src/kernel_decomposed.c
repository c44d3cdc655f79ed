/* `decomposed`: the graph a torch-style export runs, kept as the baseline the
 * fused kernels are measured against. Per batch entry it materialises the
 * GQA repeat-interleave broadcast of K and V (converted to F32), the full
 * [heads, q_len, kv_len] score matrix, adds the mask, runs a row softmax and
 * multiplies by V. */
#include <math.h>

#include "common.h"

typedef struct {
  const sdpa_args *a;
  int64_t b, G;
  float scale;
  float *Kb, *Vb; /* [n_heads][kv_len][D] */
  float *S;       /* [n_heads][q_len][kv_len] */
  float *Qrow;    /* [threads][D] */
} dec_ctx;

static void broadcast_task(void *vctx, int64_t h, int thread) {
  dec_ctx *c = (dec_ctx *)vctx;
  const sdpa_args *a = c->a;
  const int64_t D = a->head_dim, kv = a->kv_len, hk = h / c->G;
  (void)thread;
  for (int64_t j = 0; j < kv; j++) {
    sdpa_load_token(&a->k, c->b, j, hk, D, c->Kb + (h * kv + j) * D);
    sdpa_load_token(&a->v, c->b, j, hk, D, c->Vb + (h * kv + j) * D);
  }
}

static void attend_task(void *vctx, int64_t t, int thread) {
  dec_ctx *c = (dec_ctx *)vctx;
  const sdpa_args *a = c->a;
  const int64_t D = a->head_dim, kv = a->kv_len;
  const int64_t h = t / a->q_len, i = t % a->q_len;
  float *q = c->Qrow + (int64_t)thread * D;
  float *s = c->S + (h * a->q_len + i) * kv;
  sdpa_load_token(&a->q, c->b, i, h, D, q);
  const float *K = c->Kb + h * kv * D, *V = c->Vb + h * kv * D;
  float mx = -INFINITY;
  int has_nan = 0;
  for (int64_t j = 0; j < kv; j++) {
    float x = c->scale * sdpa_dot(q, K + j * D, D);
    if (a->mask) x += a->mask[i * a->mask_row_stride + j];
    if (a->is_causal && j > a->start_pos + i) x = -INFINITY;
    s[j] = x;
    mx = x > mx ? x : mx;
    has_nan |= x != x;
  }
  /* q is reused as the output row */
  memset(q, 0, (size_t)D * sizeof(float));
  if (has_nan) {
    for (int64_t d = 0; d < D; d++) q[d] = NAN;
  } else if (mx != -INFINITY) {
    float sum = 0.0f;
    for (int64_t j = 0; j < kv; j++) {
      s[j] = expf(s[j] - mx);
      sum += s[j];
    }
    for (int64_t j = 0; j < kv; j++)
      if (s[j] != 0.0f) sdpa_axpy(q, s[j] / sum, V + j * D, D);
  } /* else: no visible key, zeros */
  sdpa_store_row(a->out.data, a->out.dtype, sdpa_row_offset(&a->out, c->b, i, h), a->out.stride[3],
                 D, q);
}

int sdpa_probe_decomposed_forward(const sdpa_args *a) {
  int st = sdpa_validate_args(a);
  if (st != SDPA_OK) return st;
  if (a->batch == 0 || a->q_len == 0) return SDPA_OK;
  const int64_t H = a->n_heads, D = a->head_dim, kv = a->kv_len;
  int nt = sdpa_threads(a);
  dec_ctx c = {0};
  c.a = a;
  c.G = H / a->n_kv_heads;
  c.scale = sdpa_effective_scale(a);
  int64_t kvb = H * kv * D * (int64_t)sizeof(float);
  c.Kb = (float *)sdpa_probe_malloc(kvb);
  c.Vb = (float *)sdpa_probe_malloc(kvb);
  c.S = (float *)sdpa_probe_malloc(H * a->q_len * kv * (int64_t)sizeof(float));
  c.Qrow = (float *)sdpa_probe_malloc((int64_t)nt * D * (int64_t)sizeof(float));
  if (!c.Kb || !c.Vb || !c.S || !c.Qrow) {
    st = SDPA_UNSUPPORTED;
  } else {
    for (c.b = 0; c.b < a->batch; c.b++) {
      if (kv > 0) sdpa_probe_parallel_for(nt, H, broadcast_task, &c);
      sdpa_probe_parallel_for(nt, H * a->q_len, attend_task, &c);
    }
  }
  sdpa_probe_free(c.Kb);
  sdpa_probe_free(c.Vb);
  sdpa_probe_free(c.S);
  sdpa_probe_free(c.Qrow);
  return st;
}

int64_t sdpa_probe_decomposed_scratch(const sdpa_args *a) {
  return a->head_dim * (int64_t)sizeof(float);
}
