/* A decode step assembled from the building blocks, timed op by op in native
 * code. See include/sdpa_probe_decode.h. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <time.h>

#include "blocks_internal.h"
#include "sdpa_probe_decode.h"

/* ---- deterministic random numbers ---------------------------------------- */

static inline uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* uniform in [-1, 1) from a 64-bit state advanced by xorshift64 */
static inline float next_uniform(uint64_t *st) {
  uint64_t x = *st;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  *st = x;
  return (float)((double)(x >> 40) * (1.0 / 8388608.0) - 1.0);
}

static uint64_t tensor_key(uint64_t seed, int64_t layer, int64_t which) {
  return splitmix(splitmix(seed) ^ ((uint64_t)(layer + 1) << 20) ^ (uint64_t)which);
}

#define FILL_CHUNK 65536

typedef struct {
  void *dst;
  int32_t dtype;
  int64_t n;
  uint64_t key;
  float amp, offset;
} fill_ctx;

static void fill_task(void *vc, int64_t t, int thread) {
  fill_ctx *c = (fill_ctx *)vc;
  (void)thread;
  uint64_t st = splitmix(c->key ^ ((uint64_t)t * 0x632BE59BD9B4E019ull)) | 1u;
  int64_t i0 = t * FILL_CHUNK, i1 = i0 + FILL_CHUNK < c->n ? i0 + FILL_CHUNK : c->n;
  if (c->dtype == SDPA_F16) {
    uint16_t *p = (uint16_t *)c->dst;
    for (int64_t i = i0; i < i1; i++) p[i] = sdpa_f32_to_f16(c->offset + c->amp * next_uniform(&st));
  } else {
    float *p = (float *)c->dst;
    for (int64_t i = i0; i < i1; i++) p[i] = c->offset + c->amp * next_uniform(&st);
  }
}

static void fill_random(void *dst, int32_t dtype, int64_t n, uint64_t key, float amp, float offset,
                        int nt) {
  fill_ctx c = {dst, dtype, n, key, amp, offset};
  sdpa_probe_parallel_for(nt, (n + FILL_CHUNK - 1) / FILL_CHUNK, fill_task, &c);
}

/* ---- config and sizes ------------------------------------------------------ */

static int config_ok(const sdpa_probe_decode_config *c) {
  if (!c) return 0;
  if (c->n_layers <= 0 || c->hidden <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 ||
      c->head_dim <= 0 || c->ffn <= 0 || c->vocab <= 0)
    return 0;
  if (c->n_heads % c->n_kv_heads || (c->head_dim & 1)) return 0;
  if (c->weight_dtype != SDPA_F32 && c->weight_dtype != SDPA_F16) return 0;
  if (c->rope_style != SDPA_PROBE_ROPE_HALF && c->rope_style != SDPA_PROBE_ROPE_INTERLEAVED) return 0;
  if (!(c->rope_theta > 0.0f) || isinf(c->rope_theta) || !(c->norm_eps >= 0.0f)) return 0;
  const int64_t lim = (int64_t)1 << 31;
  if (c->n_layers > lim || c->hidden > lim || c->n_heads > lim || c->head_dim > lim ||
      c->ffn > lim || c->vocab > lim)
    return 0;
  return blk_mul_ok(c->n_heads, c->head_dim) && blk_mul_ok(c->hidden, c->ffn) &&
         blk_mul_ok(c->vocab, c->hidden);
}

/* weight elements of one layer */
static int64_t layer_elems(const sdpa_probe_decode_config *c) {
  int64_t qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
  return c->hidden * qd * 2 + c->hidden * kvd * 2 + c->hidden * c->ffn * 3;
}

int64_t sdpa_probe_decode_model_bytes(const sdpa_probe_decode_config *cfg) {
  if (!config_ok(cfg)) return -1;
  int64_t wb = cfg->weight_dtype == SDPA_F16 ? 2 : 4;
  int64_t le = layer_elems(cfg);
  if (!blk_mul_ok(le, cfg->n_layers)) return -1;
  double total = ((double)le * (double)cfg->n_layers + (double)cfg->vocab * cfg->hidden) * wb +
                 (double)(2 * cfg->n_layers + 1) * cfg->hidden * 4;
  if (total > 9.0e18) return -1;
  return (int64_t)total;
}

/* ---- the model --------------------------------------------------------------- */

typedef struct {
  void *wq, *wk, *wv, *wo, *wg, *wu, *wd;
  float *attn_norm, *ffn_norm;
} layer_w;

struct sdpa_probe_decode_model {
  sdpa_probe_decode_config cfg;
  layer_w *layers;
  void *lm_head; /* [vocab, hidden], also the token embedding */
  float *final_norm;
};

void sdpa_probe_decode_model_free(sdpa_probe_decode_model *m) {
  if (!m) return;
  if (m->layers) {
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
      layer_w *w = &m->layers[l];
      void *ps[] = {w->wq, w->wk, w->wv, w->wo, w->wg, w->wu, w->wd, w->attn_norm, w->ffn_norm};
      for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) sdpa_probe_free(ps[i]);
    }
    free(m->layers);
  }
  sdpa_probe_free(m->lm_head);
  sdpa_probe_free(m->final_norm);
  free(m);
}

int sdpa_probe_decode_model_new(const sdpa_probe_decode_config *cfg,
                                sdpa_probe_decode_model **out) {
  if (!out) return SDPA_INVALID;
  *out = NULL;
  if (sdpa_probe_decode_model_bytes(cfg) < 0) return SDPA_INVALID;
  sdpa_probe_decode_model *m = (sdpa_probe_decode_model *)calloc(1, sizeof *m);
  if (!m) return SDPA_PROBE_DECODE_ENOMEM;
  m->cfg = *cfg;
  const sdpa_probe_decode_config *c = &m->cfg;
  const int32_t dt = c->weight_dtype;
  const int64_t wb = dt == SDPA_F16 ? 2 : 4, E = c->hidden;
  const int64_t qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
  const int nt = blk_threads(c->n_threads);
  m->layers = (layer_w *)calloc((size_t)c->n_layers, sizeof(layer_w));
  if (!m->layers) goto oom;
  for (int64_t l = 0; l < c->n_layers; l++) {
    layer_w *w = &m->layers[l];
    struct {
      void **p;
      int64_t rows, cols;
    } mats[] = {{&w->wq, qd, E}, {&w->wk, kvd, E}, {&w->wv, kvd, E}, {&w->wo, E, qd},
                {&w->wg, c->ffn, E}, {&w->wu, c->ffn, E}, {&w->wd, E, c->ffn}};
    for (int i = 0; i < 7; i++) {
      int64_t n = mats[i].rows * mats[i].cols;
      *mats[i].p = sdpa_probe_malloc(n * wb);
      if (!*mats[i].p) goto oom;
      fill_random(*mats[i].p, dt, n, tensor_key(c->seed, l, i), 1.0f / sqrtf((float)mats[i].cols),
                  0.0f, nt);
    }
    w->attn_norm = (float *)sdpa_probe_malloc(E * 4);
    w->ffn_norm = (float *)sdpa_probe_malloc(E * 4);
    if (!w->attn_norm || !w->ffn_norm) goto oom;
    fill_random(w->attn_norm, SDPA_F32, E, tensor_key(c->seed, l, 7), 0.1f, 1.0f, 1);
    fill_random(w->ffn_norm, SDPA_F32, E, tensor_key(c->seed, l, 8), 0.1f, 1.0f, 1);
  }
  m->lm_head = sdpa_probe_malloc(c->vocab * E * wb);
  m->final_norm = (float *)sdpa_probe_malloc(E * 4);
  if (!m->lm_head || !m->final_norm) goto oom;
  fill_random(m->lm_head, dt, c->vocab * E, tensor_key(c->seed, -1, 0), 1.0f / sqrtf((float)E),
              0.0f, nt);
  fill_random(m->final_norm, SDPA_F32, E, tensor_key(c->seed, -1, 1), 0.1f, 1.0f, 1);
  *out = m;
  return SDPA_OK;
oom:
  sdpa_probe_decode_model_free(m);
  return SDPA_PROBE_DECODE_ENOMEM;
}

/* ---- the state ------------------------------------------------------------------ */

typedef struct {
  const char *name, *kind;
  int64_t layer;
} op_info;

struct sdpa_probe_decode_state {
  const sdpa_probe_decode_model *m;
  int32_t graph, cache_dtype;
  int64_t kernel_index, capacity;
  int nt;
  sdpa_probe_kv_cache *kc, *vc; /* [n_layers] */
  float *cos_tab, *sin_tab;
  float *x, *xn, *q, *k, *v, *attn, *tmp, *gate, *up, *logits;
  float *kf, *vf, *kb, *vb, *kp, *sc; /* the decomposed graph's intermediates */
  op_info *ops;
  int64_t n_ops, ops_cap, next_token;
  int enumerating;
  sdpa_probe_forward_fn forward; /* set: called instead of the registered kernel */
};

/* sizes (in floats) of the scratch buffers, in the order of the state's fields */
enum { B_COS, B_SIN, B_X, B_XN, B_Q, B_K, B_V, B_ATTN, B_TMP, B_GATE, B_UP, B_LOGITS,
       B_KF, B_VF, B_KB, B_VB, B_KP, B_SC, B_COUNT };

static int plan_sizes(const sdpa_probe_decode_config *c, int32_t graph, int64_t cap,
                      int64_t sz[B_COUNT]) {
  const int64_t H = c->n_heads, Hkv = c->n_kv_heads, D = c->head_dim;
  if (!blk_mul_ok(cap, H * D) || !blk_mul_ok(cap * H, D)) return 0;
  memset(sz, 0, sizeof(int64_t) * B_COUNT);
  sz[B_COS] = sz[B_SIN] = cap * (D / 2);
  sz[B_X] = sz[B_XN] = sz[B_TMP] = c->hidden;
  sz[B_Q] = sz[B_ATTN] = H * D;
  sz[B_K] = sz[B_V] = Hkv * D;
  sz[B_GATE] = sz[B_UP] = c->ffn;
  sz[B_LOGITS] = c->vocab;
  if (graph == SDPA_PROBE_GRAPH_DECOMPOSED) {
    sz[B_KF] = sz[B_VF] = cap * Hkv * D;
    sz[B_KB] = sz[B_VB] = H * cap * D;
    sz[B_KP] = sdpa_probe_pack_k_floats(H, cap, D);
    sz[B_SC] = H * cap;
    if (sz[B_KP] < 0) return 0;
  }
  return 1;
}

static int64_t cache_elem_bytes(int32_t dt) { return dt == SDPA_F32 ? 4 : (dt == SDPA_F16 ? 2 : 1); }

int64_t sdpa_probe_decode_state_bytes(const sdpa_probe_decode_config *cfg, int32_t graph,
                                      int32_t cache_dtype, int64_t capacity) {
  if (!config_ok(cfg) || capacity <= 0) return -1;
  if (graph != SDPA_PROBE_GRAPH_DECOMPOSED && graph != SDPA_PROBE_GRAPH_KERNEL) return -1;
  if (cache_dtype != SDPA_F32 && cache_dtype != SDPA_F16 && cache_dtype != SDPA_I8) return -1;
  int64_t sz[B_COUNT];
  if (!plan_sizes(cfg, graph, capacity, sz)) return -1;
  double total = 0;
  for (int i = 0; i < B_COUNT; i++) total += (double)sz[i] * 4;
  double per_tensor = (double)capacity * cfg->n_kv_heads * cfg->head_dim * cache_elem_bytes(cache_dtype);
  if (cache_dtype == SDPA_I8) per_tensor += (double)capacity * cfg->n_kv_heads * 5;
  total += per_tensor * 2 * (double)cfg->n_layers;
  if (total > 9.0e18) return -1;
  return (int64_t)total;
}

#define STATE_BUFS(s)                                                                        \
  {&(s)->cos_tab, &(s)->sin_tab, &(s)->x, &(s)->xn, &(s)->q, &(s)->k, &(s)->v, &(s)->attn,   \
   &(s)->tmp, &(s)->gate, &(s)->up, &(s)->logits, &(s)->kf, &(s)->vf, &(s)->kb, &(s)->vb,    \
   &(s)->kp, &(s)->sc}

void sdpa_probe_decode_state_free(sdpa_probe_decode_state *s) {
  if (!s) return;
  int64_t L = s->m ? s->m->cfg.n_layers : 0;
  for (int64_t l = 0; l < L; l++) {
    sdpa_probe_kv_cache *cs[2] = {s->kc ? &s->kc[l] : NULL, s->vc ? &s->vc[l] : NULL};
    for (int i = 0; i < 2; i++) {
      if (!cs[i]) continue;
      sdpa_probe_free(cs[i]->data);
      sdpa_probe_free(cs[i]->scale);
      sdpa_probe_free(cs[i]->zero_point);
    }
  }
  free(s->kc);
  free(s->vc);
  float **bufs[B_COUNT] = STATE_BUFS(s);
  for (int i = 0; i < B_COUNT; i++) sdpa_probe_free(*bufs[i]);
  free(s->ops);
  free(s);
}

static int run_step(sdpa_probe_decode_state *s, int64_t token, int64_t pos,
                    sdpa_probe_op_record *rec);

int sdpa_probe_decode_state_new(const sdpa_probe_decode_model *m, int32_t graph,
                                int64_t kernel_index, int32_t cache_dtype, int64_t capacity,
                                int32_t n_threads, sdpa_probe_decode_state **out) {
  if (!out) return SDPA_INVALID;
  *out = NULL;
  if (!m || sdpa_probe_decode_state_bytes(&m->cfg, graph, cache_dtype, capacity) < 0)
    return SDPA_INVALID;
  /* -1: no registered kernel; the attention comes from sdpa_probe_decode_set_forward */
  if (graph == SDPA_PROBE_GRAPH_KERNEL &&
      (kernel_index < -1 || kernel_index >= sdpa_probe_kernel_count()))
    return SDPA_INVALID;
  const sdpa_probe_decode_config *c = &m->cfg;
  sdpa_probe_decode_state *s = (sdpa_probe_decode_state *)calloc(1, sizeof *s);
  if (!s) return SDPA_PROBE_DECODE_ENOMEM;
  s->m = m;
  s->graph = graph;
  s->cache_dtype = cache_dtype;
  s->kernel_index = kernel_index;
  s->capacity = capacity;
  s->nt = blk_threads(n_threads);
  int64_t sz[B_COUNT];
  plan_sizes(c, graph, capacity, sz);
  float **bufs[B_COUNT] = STATE_BUFS(s);
  for (int i = 0; i < B_COUNT; i++) {
    if (sz[i] == 0) continue;
    *bufs[i] = (float *)sdpa_probe_malloc(sz[i] * 4);
    if (!*bufs[i]) goto oom;
    memset(*bufs[i], 0, (size_t)sz[i] * 4); /* touch the pages now, not in the first step */
  }
  s->kc = (sdpa_probe_kv_cache *)calloc((size_t)c->n_layers, sizeof(sdpa_probe_kv_cache));
  s->vc = (sdpa_probe_kv_cache *)calloc((size_t)c->n_layers, sizeof(sdpa_probe_kv_cache));
  if (!s->kc || !s->vc) goto oom;
  const int64_t per = capacity * c->n_kv_heads * c->head_dim;
  for (int64_t l = 0; l < c->n_layers; l++) {
    sdpa_probe_kv_cache *cs[2] = {&s->kc[l], &s->vc[l]};
    for (int i = 0; i < 2; i++) {
      sdpa_probe_kv_cache *kv = cs[i];
      kv->dtype = cache_dtype;
      kv->capacity = capacity;
      kv->n_kv_heads = c->n_kv_heads;
      kv->head_dim = c->head_dim;
      kv->ring_size = 0;
      kv->data = sdpa_probe_malloc(per * cache_elem_bytes(cache_dtype));
      if (!kv->data) goto oom;
      memset(kv->data, 0, (size_t)(per * cache_elem_bytes(cache_dtype)));
      if (cache_dtype == SDPA_I8) {
        kv->scale = (float *)sdpa_probe_malloc(capacity * c->n_kv_heads * 4);
        kv->zero_point = (int8_t *)sdpa_probe_malloc(capacity * c->n_kv_heads);
        if (!kv->scale || !kv->zero_point) goto oom;
        for (int64_t j = 0; j < capacity * c->n_kv_heads; j++) kv->scale[j] = 1.0f;
        memset(kv->zero_point, 0, (size_t)(capacity * c->n_kv_heads));
      }
    }
  }
  if (sdpa_probe_rope_table(s->cos_tab, s->sin_tab, capacity, c->head_dim, c->rope_theta) != SDPA_OK)
    goto invalid;
  /* enumerate the ops once: the step body with every op skipped */
  s->enumerating = 1;
  int st = run_step(s, 0, 0, NULL);
  s->enumerating = 0;
  if (st != SDPA_OK) {
    sdpa_probe_decode_state_free(s);
    return st;
  }
  *out = s;
  return SDPA_OK;
oom:
  sdpa_probe_decode_state_free(s);
  return SDPA_PROBE_DECODE_ENOMEM;
invalid:
  sdpa_probe_decode_state_free(s);
  return SDPA_INVALID;
}

int sdpa_probe_decode_set_forward(sdpa_probe_decode_state *s, sdpa_probe_forward_fn fn) {
  if (!s || s->graph != SDPA_PROBE_GRAPH_KERNEL) return SDPA_INVALID;
  s->forward = fn;
  return SDPA_OK;
}

int64_t sdpa_probe_decode_op_count(const sdpa_probe_decode_state *s) { return s ? s->n_ops : -1; }

int sdpa_probe_decode_op_info(const sdpa_probe_decode_state *s, int64_t i, const char **name,
                              const char **kind, int64_t *layer) {
  if (!s || i < 0 || i >= s->n_ops) return SDPA_INVALID;
  if (name) *name = s->ops[i].name;
  if (kind) *kind = s->ops[i].kind;
  if (layer) *layer = s->ops[i].layer;
  return SDPA_OK;
}

static int add_op(sdpa_probe_decode_state *s, const char *name, const char *kind, int64_t layer) {
  if (s->n_ops == s->ops_cap) {
    int64_t cap = s->ops_cap ? 2 * s->ops_cap : 64;
    op_info *p = (op_info *)realloc(s->ops, (size_t)cap * sizeof(op_info));
    if (!p) return SDPA_PROBE_DECODE_ENOMEM;
    s->ops = p;
    s->ops_cap = cap;
  }
  s->ops[s->n_ops++] = (op_info){name, kind, layer};
  return SDPA_OK;
}

/* ---- history ------------------------------------------------------------------ */

int sdpa_probe_decode_fill_history(sdpa_probe_decode_state *s, int64_t begin, int64_t end,
                                   uint64_t seed) {
  if (!s || begin < 0 || end < begin || end > s->capacity) return SDPA_INVALID;
  const sdpa_probe_decode_config *c = &s->m->cfg;
  const int64_t Hkv = c->n_kv_heads, D = c->head_dim, row = Hkv * D;
  for (int64_t l = 0; l < c->n_layers; l++) {
    uint64_t kk = tensor_key(seed, l, 100), vk = tensor_key(seed, l, 101);
    for (int64_t p = begin; p < end; p++) {
      uint64_t a = splitmix(kk ^ (uint64_t)p) | 1u, b = splitmix(vk ^ (uint64_t)p) | 1u;
      for (int64_t i = 0; i < row; i++) {
        s->k[i] = next_uniform(&a);
        s->v[i] = next_uniform(&b);
      }
      int st = SDPA_OK;
      if (s->graph == SDPA_PROBE_GRAPH_KERNEL)
        st = sdpa_probe_rope(s->k, Hkv, D, p, s->cos_tab, s->sin_tab, s->capacity, c->rope_style);
      if (st == SDPA_OK) st = sdpa_probe_kv_write(&s->kc[l], p, s->k);
      if (st == SDPA_OK) st = sdpa_probe_kv_write(&s->vc[l], p, s->v);
      if (st != SDPA_OK) return st;
    }
  }
  return SDPA_OK;
}

/* ---- ops ------------------------------------------------------------------------ */

static inline int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int gemv(const sdpa_probe_decode_state *s, const void *w, const float *x, float *y,
                int64_t out, int64_t in) {
  if (s->m->cfg.weight_dtype == SDPA_F16)
    return sdpa_probe_gemv_f16((const uint16_t *)w, x, y, out, in, s->nt);
  return sdpa_probe_gemv_f32((const float *)w, x, y, out, in, s->nt);
}

static int op_embed(sdpa_probe_decode_state *s, int64_t token) {
  const int64_t E = s->m->cfg.hidden;
  if (s->m->cfg.weight_dtype == SDPA_F16)
    return sdpa_probe_cast_f16_f32((const uint16_t *)s->m->lm_head + token * E, s->x, E, 1);
  memcpy(s->x, (const float *)s->m->lm_head + token * E, (size_t)E * sizeof(float));
  return SDPA_OK;
}

static int op_rope_qk(sdpa_probe_decode_state *s, int64_t pos, int with_k) {
  const sdpa_probe_decode_config *c = &s->m->cfg;
  int st = sdpa_probe_rope(s->q, c->n_heads, c->head_dim, pos, s->cos_tab, s->sin_tab,
                           s->capacity, c->rope_style);
  if (st == SDPA_OK && with_k)
    st = sdpa_probe_rope(s->k, c->n_kv_heads, c->head_dim, pos, s->cos_tab, s->sin_tab,
                         s->capacity, c->rope_style);
  return st;
}

static int op_kv_write(sdpa_probe_decode_state *s, int64_t l, int64_t pos) {
  int st = sdpa_probe_kv_write(&s->kc[l], pos, s->k);
  return st == SDPA_OK ? sdpa_probe_kv_write(&s->vc[l], pos, s->v) : st;
}

static int op_kv_read(sdpa_probe_decode_state *s, int64_t l, int64_t len) {
  int st = sdpa_probe_kv_read(&s->kc[l], 0, len, s->kf, s->nt);
  return st == SDPA_OK ? sdpa_probe_kv_read(&s->vc[l], 0, len, s->vf, s->nt) : st;
}

static int op_broadcast(sdpa_probe_decode_state *s, int64_t len) {
  const sdpa_probe_decode_config *c = &s->m->cfg;
  int st = sdpa_probe_gqa_broadcast(s->kf, s->kb, len, c->n_kv_heads, c->n_heads, c->head_dim, s->nt);
  if (st != SDPA_OK) return st;
  return sdpa_probe_gqa_broadcast(s->vf, s->vb, len, c->n_kv_heads, c->n_heads, c->head_dim, s->nt);
}

static int op_sdpa_kernel(sdpa_probe_decode_state *s, int64_t l, int64_t len) {
  const sdpa_probe_decode_config *c = &s->m->cfg;
  const int64_t H = c->n_heads, D = c->head_dim;
  sdpa_args a;
  memset(&a, 0, sizeof a);
  a.abi_version = SDPA_ABI_VERSION;
  a.batch = 1;
  a.n_heads = H;
  a.n_kv_heads = c->n_kv_heads;
  a.q_len = 1;
  a.kv_len = len;
  a.head_dim = D;
  a.q.data = s->q;
  a.q.dtype = SDPA_F32;
  a.q.stride[0] = a.q.stride[1] = H * D;
  a.q.stride[2] = D;
  a.q.stride[3] = 1;
  a.out = a.q;
  a.out.data = s->attn;
  if (sdpa_probe_kv_tensor(&s->kc[l], &a.k) != SDPA_OK) return SDPA_INVALID;
  if (sdpa_probe_kv_tensor(&s->vc[l], &a.v) != SDPA_OK) return SDPA_INVALID;
  a.is_causal = 0;
  a.start_pos = len - 1;
  a.scale = 0.0f;
  a.n_threads = s->nt;
  if (s->forward) return s->forward(&a);
  return sdpa_probe_kernel_forward(s->kernel_index, &a);
}

static int op_argmax(const float *x, int64_t n, int64_t *out) {
  int64_t best = 0;
  float bv = x[0];
  for (int64_t i = 1; i < n; i++)
    if (x[i] > bv) {
      bv = x[i];
      best = i;
    }
  *out = best;
  return SDPA_OK;
}

/* Run one op: register it (enumeration) or time it and its allocations. */
#define OP(NAME, KIND, LAYER, CALL)                                           \
  do {                                                                        \
    if (s->enumerating) {                                                     \
      int st_ = add_op(s, NAME, KIND, LAYER);                                 \
      if (st_ != SDPA_OK) return st_;                                         \
      break;                                                                  \
    }                                                                         \
    int64_t c0_ = 0, b0_ = 0, t0_ = 0;                                        \
    if (rec) {                                                                \
      sdpa_probe_alloc_stats(&c0_, &b0_);                                     \
      t0_ = now_ns();                                                         \
    }                                                                         \
    int st_ = (CALL);                                                         \
    if (rec) {                                                                \
      int64_t t1_ = now_ns(), c1_, b1_;                                       \
      sdpa_probe_alloc_stats(&c1_, &b1_);                                     \
      rec[k_].start_ns = t0_;                                                 \
      rec[k_].dur_ns = t1_ - t0_;                                             \
      rec[k_].allocs = c1_ - c0_;                                             \
      rec[k_].alloc_bytes = b1_ - b0_;                                        \
    }                                                                         \
    k_++;                                                                     \
    if (st_ != SDPA_OK) return st_;                                           \
  } while (0)

static int run_step(sdpa_probe_decode_state *s, int64_t token, int64_t pos,
                    sdpa_probe_op_record *rec) {
  const sdpa_probe_decode_model *m = s->m;
  const sdpa_probe_decode_config *c = &m->cfg;
  const int64_t E = c->hidden, H = c->n_heads, Hkv = c->n_kv_heads, D = c->head_dim;
  const int64_t qd = H * D, kvd = Hkv * D, F = c->ffn, len = pos + 1;
  const int nt = s->nt;
  const int dec = s->graph == SDPA_PROBE_GRAPH_DECOMPOSED;
  int64_t k_ = 0;

  OP("embed", "embed", -1, op_embed(s, token));
  for (int64_t l = 0; l < c->n_layers; l++) {
    const layer_w *w = &m->layers[l];
    OP("attn_norm", "norm", l, sdpa_probe_rmsnorm(s->x, w->attn_norm, s->xn, 1, E, c->norm_eps));
    OP("q_proj", "gemv", l, gemv(s, w->wq, s->xn, s->q, qd, E));
    OP("k_proj", "gemv", l, gemv(s, w->wk, s->xn, s->k, kvd, E));
    OP("v_proj", "gemv", l, gemv(s, w->wv, s->xn, s->v, kvd, E));
    if (dec) {
      OP("rope_q", "rope", l, op_rope_qk(s, pos, 0));
      OP("kv_write", "cache", l, op_kv_write(s, l, pos));
      OP("kv_read_cast", "cast", l, op_kv_read(s, l, len));
      OP("rope_window", "rope", l,
         sdpa_probe_rope_window(s->kf, s->kf, len, Hkv, D, 0, NULL, s->cos_tab, s->sin_tab,
                                s->capacity, c->rope_style, nt));
      OP("gqa_broadcast", "broadcast", l, op_broadcast(s, len));
      OP("pack_k", "pack", l, sdpa_probe_pack_k(s->kb, s->kp, H, len, D, nt));
      OP("qk_matmul", "matmul", l, sdpa_probe_qk_packed(s->q, s->kp, s->sc, H, len, D, 0.0f, nt));
      OP("softmax", "softmax", l, sdpa_probe_softmax(s->sc, H, len, nt));
      OP("pv_matmul", "matmul", l, sdpa_probe_pv(s->sc, s->vb, s->attn, H, len, D, nt));
    } else {
      OP("rope_qk", "rope", l, op_rope_qk(s, pos, 1));
      OP("kv_write", "cache", l, op_kv_write(s, l, pos));
      OP("sdpa", "attention", l, op_sdpa_kernel(s, l, len));
    }
    OP("o_proj", "gemv", l, gemv(s, w->wo, s->attn, s->tmp, E, qd));
    OP("attn_residual", "elementwise", l, sdpa_probe_residual_add(s->x, s->tmp, E));
    OP("ffn_norm", "norm", l, sdpa_probe_rmsnorm(s->x, w->ffn_norm, s->xn, 1, E, c->norm_eps));
    OP("gate_proj", "gemv", l, gemv(s, w->wg, s->xn, s->gate, F, E));
    OP("up_proj", "gemv", l, gemv(s, w->wu, s->xn, s->up, F, E));
    OP("silu_gate", "elementwise", l, sdpa_probe_silu_gate(s->gate, s->up, s->gate, F, nt));
    OP("down_proj", "gemv", l, gemv(s, w->wd, s->gate, s->tmp, E, F));
    OP("ffn_residual", "elementwise", l, sdpa_probe_residual_add(s->x, s->tmp, E));
  }
  OP("final_norm", "norm", -1, sdpa_probe_rmsnorm(s->x, m->final_norm, s->xn, 1, E, c->norm_eps));
  OP("lm_head", "gemv", -1, gemv(s, m->lm_head, s->xn, s->logits, c->vocab, E));
  OP("argmax", "sample", -1, op_argmax(s->logits, c->vocab, &s->next_token));
  return SDPA_OK;
}

int sdpa_probe_decode_step(sdpa_probe_decode_state *s, int64_t token, int64_t pos,
                           float *logits, int64_t *next_token, sdpa_probe_op_record *records,
                           int64_t *step_ns) {
  if (!s || token < 0 || token >= s->m->cfg.vocab || pos < 0 || pos >= s->capacity)
    return SDPA_INVALID;
  if (s->graph == SDPA_PROBE_GRAPH_KERNEL && !s->forward && s->kernel_index < 0)
    return SDPA_INVALID; /* neither a registered kernel nor a forward */
  int64_t t0 = now_ns();
  int st = run_step(s, token, pos, records);
  int64_t t1 = now_ns();
  if (step_ns) *step_ns = t1 - t0;
  if (st != SDPA_OK) return st;
  if (logits) memcpy(logits, s->logits, (size_t)s->m->cfg.vocab * sizeof(float));
  if (next_token) *next_token = s->next_token;
  return SDPA_OK;
}

double sdpa_probe_decode_record_cost_ns(int64_t iters) {
  if (iters <= 0) iters = 1;
  volatile int64_t sink = 0;
  int64_t t0 = now_ns();
  for (int64_t i = 0; i < iters; i++) {
    int64_t c0, b0, c1, b1;
    sdpa_probe_alloc_stats(&c0, &b0);
    int64_t a = now_ns();
    int64_t b = now_ns();
    sdpa_probe_alloc_stats(&c1, &b1);
    sink += (b - a) + (c1 - c0) + (b1 - b0);
  }
  int64_t t1 = now_ns();
  (void)sink;
  return (double)(t1 - t0) / (double)iters;
}
