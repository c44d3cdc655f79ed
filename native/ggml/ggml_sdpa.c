/*
 * ggml_sdpa.c -- ggml's CPU attention graph for one shape, built as llama.cpp's
 * llm_graph_context::build_attn_mha builds it (see ggml_sdpa.h for the layouts).
 *
 * Q, K and V are made in the layouts of llama.cpp's decode inputs and KV cache and
 * permuted (0, 2, 1, 3) into [head_dim, tokens, heads, batch] views; GQA is ggml's own
 * broadcast (n_heads a multiple of n_kv_heads: head h reads kv head h / (n_heads /
 * n_kv_heads)). Everything is in one ggml context whose memory is allocated here, so
 * that the tensors' data stay where the caller wrote them between computes.
 */
#define _POSIX_C_SOURCE 200809L
#include "ggml_sdpa.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-cpu.h"
#include "ggml.h"

struct ggml_sdpa_pool {
  struct ggml_threadpool *tp;
  int32_t n_threads;
};

struct ggml_sdpa {
  ggml_sdpa_shape shape;
  ggml_sdpa_pool *pool;
  void *mem;
  struct ggml_context *ctx;
  struct ggml_cgraph *graph;
  struct ggml_cplan plan;
  void *work;
  struct ggml_tensor *parts[5]; /* enum ggml_sdpa_part */
};

#define ALIGN 64

ggml_sdpa_pool *ggml_sdpa_pool_new(int32_t n_threads) {
  if (n_threads < 1 || n_threads > GGML_MAX_N_THREADS) return NULL;
  ggml_sdpa_pool *pool = calloc(1, sizeof(*pool));
  if (!pool) return NULL;
  /* the defaults llama.cpp's threadpools start from: inherited affinity and priority */
  struct ggml_threadpool_params params = ggml_threadpool_params_default(n_threads);
  pool->tp = ggml_threadpool_new(&params);
  if (!pool->tp) {
    free(pool);
    return NULL;
  }
  pool->n_threads = n_threads;
  return pool;
}

void ggml_sdpa_pool_free(ggml_sdpa_pool *pool) {
  if (!pool) return;
  ggml_threadpool_free(pool->tp);
  free(pool);
}

static enum ggml_type kv_ggml_type(int32_t t) {
  return t == GGML_SDPA_F16 ? GGML_TYPE_F16 : t == GGML_SDPA_BF16 ? GGML_TYPE_BF16
                                                                  : GGML_TYPE_F32;
}

static size_t padded(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN + ALIGN; }

/* The context's bytes: tensor headers, the graph, and every tensor's data. */
static size_t context_bytes(const ggml_sdpa_shape *s) {
  const size_t B = (size_t)s->batch, H = (size_t)s->n_heads, Hkv = (size_t)s->n_kv_heads;
  const size_t Lq = (size_t)s->q_len, Lkv = (size_t)s->kv_len, D = (size_t)s->head_dim;
  const size_t kv_elt = ggml_type_size(kv_ggml_type(s->kv_type));
  const size_t rows = B * Lq * H; /* output rows of head_dim */
  size_t n = 16 * ggml_tensor_overhead() + ggml_graph_overhead() + ALIGN;
  n += padded(rows * D * 4) + 2 * padded(B * Lkv * Hkv * D * kv_elt);
  n += padded(Lq * Lkv * (s->flash ? 2 : 4));
  if (s->flash) {
    n += padded(rows * D * 4);
  } else { /* kq and its softmax, kqv and its contiguous copy */
    n += 2 * padded(rows * Lkv * 4) + 2 * padded(rows * D * 4);
  }
  return n;
}

static struct ggml_tensor *build_graph(ggml_sdpa *g) {
  const ggml_sdpa_shape *s = &g->shape;
  struct ggml_context *ctx = g->ctx;
  const enum ggml_type kvt = kv_ggml_type(s->kv_type);
  struct ggml_tensor *q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, s->head_dim, s->n_heads,
                                             s->q_len, s->batch);
  struct ggml_tensor *k = ggml_new_tensor_4d(ctx, kvt, s->head_dim, s->n_kv_heads,
                                             s->kv_len, s->batch);
  struct ggml_tensor *v = s->flash
      ? ggml_new_tensor_4d(ctx, kvt, s->head_dim, s->n_kv_heads, s->kv_len, s->batch)
      : ggml_new_tensor_4d(ctx, kvt, s->kv_len, s->head_dim, s->n_kv_heads, s->batch);
  /* one mask row per query, broadcast over heads and batch */
  struct ggml_tensor *mask = ggml_new_tensor_4d(
      ctx, s->flash ? GGML_TYPE_F16 : GGML_TYPE_F32, s->kv_len, s->q_len, 1, 1);
  if (!q || !k || !v || !mask) return NULL;
  g->parts[GGML_SDPA_Q] = q;
  g->parts[GGML_SDPA_K] = k;
  g->parts[GGML_SDPA_V] = v;
  g->parts[GGML_SDPA_MASK] = mask;

  struct ggml_tensor *qp = ggml_permute(ctx, q, 0, 2, 1, 3); /* [D, Lq, H, B] */
  struct ggml_tensor *kp = ggml_permute(ctx, k, 0, 2, 1, 3); /* [D, Lkv, Hkv, B] */
  struct ggml_tensor *cur;
  if (s->flash) {
    struct ggml_tensor *vp = ggml_permute(ctx, v, 0, 2, 1, 3);
    cur = ggml_flash_attn_ext(ctx, qp, kp, vp, mask, s->scale, 0.0f, 0.0f);
    ggml_prec_set_acc(cur, GGML_PREC_F32);
    /* (its result is [D, H, Lq, B] already: permuted, contiguous) */
  } else {
    struct ggml_tensor *kq = ggml_mul_mat(ctx, kp, qp); /* [Lkv, Lq, H, B] */
    ggml_prec_set_acc(kq, GGML_PREC_F32);
    kq = ggml_soft_max_ext(ctx, kq, mask, s->scale, 0.0f);
    struct ggml_tensor *kqv = ggml_mul_mat(ctx, v, kq); /* [D, Lq, H, B] */
    cur = ggml_cont(ctx, ggml_permute(ctx, kqv, 0, 2, 1, 3));
  }
  g->parts[GGML_SDPA_OUT] = cur;
  return cur;
}

static const char *check_shape(const ggml_sdpa_shape *s) {
  /* (no keys is a cache not yet written: every row sees none) */
  if (s->batch < 1 || s->n_heads < 1 || s->n_kv_heads < 1 || s->q_len < 1 || s->kv_len < 0 ||
      s->head_dim < 1)
    return "every dimension but kv_len must be at least 1";
  /* (ggml_mul_mat asserts on it: a [0, D] view's strides read as transposed) */
  if (!s->flash && s->kv_len == 0) return "flash attention off takes no V of 0 keys";
  if (s->n_heads % s->n_kv_heads) return "n_heads must be a multiple of n_kv_heads";
  if (s->kv_type < GGML_SDPA_F32 || s->kv_type > GGML_SDPA_BF16) return "unknown kv_type";
  return NULL;
}

ggml_sdpa *ggml_sdpa_new(const ggml_sdpa_shape *shape, ggml_sdpa_pool *pool, char *err,
                         size_t err_len) {
  const char *why = check_shape(shape);
  if (!why && !pool) why = "no threadpool";
  if (why) {
    snprintf(err, err_len, "%s", why);
    return NULL;
  }
  ggml_sdpa *g = calloc(1, sizeof(*g));
  if (!g) {
    snprintf(err, err_len, "out of memory");
    return NULL;
  }
  g->shape = *shape;
  g->pool = pool;
  const size_t bytes = context_bytes(shape);
  g->mem = aligned_alloc(ALIGN, padded(bytes));
  if (!g->mem) {
    snprintf(err, err_len, "cannot allocate %zu bytes for the graph's tensors", bytes);
    ggml_sdpa_free(g);
    return NULL;
  }
  struct ggml_init_params params = {bytes, g->mem, false};
  g->ctx = ggml_init(params);
  if (!g->ctx || !build_graph(g)) {
    snprintf(err, err_len, "ggml could not make the graph's tensors");
    ggml_sdpa_free(g);
    return NULL;
  }
  g->graph = ggml_new_graph(g->ctx);
  ggml_build_forward_expand(g->graph, g->parts[GGML_SDPA_OUT]);
  g->plan = ggml_graph_plan(g->graph, pool->n_threads, pool->tp);
  if (g->plan.work_size) {
    g->work = aligned_alloc(ALIGN, padded(g->plan.work_size));
    if (!g->work) {
      snprintf(err, err_len, "cannot allocate the %zu-byte work buffer", g->plan.work_size);
      ggml_sdpa_free(g);
      return NULL;
    }
    g->plan.work_data = g->work;
  }
  return g;
}

void ggml_sdpa_free(ggml_sdpa *g) {
  if (!g) return;
  if (g->ctx) ggml_free(g->ctx);
  free(g->mem);
  free(g->work);
  free(g);
}

void *ggml_sdpa_data(ggml_sdpa *g, int32_t part) {
  return part >= 0 && part <= GGML_SDPA_OUT ? g->parts[part]->data : NULL;
}

size_t ggml_sdpa_nbytes(ggml_sdpa *g, int32_t part) {
  return part >= 0 && part <= GGML_SDPA_OUT ? ggml_nbytes(g->parts[part]) : 0;
}

int32_t ggml_sdpa_compute(ggml_sdpa *g) {
  return (int32_t)ggml_graph_compute(g->graph, &g->plan);
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int32_t ggml_sdpa_compute_loop(ggml_sdpa *const *graphs, int32_t n_graphs, int32_t first,
                               int32_t n, double *seconds) {
  for (int32_t i = 0; i < n; i++) {
    ggml_sdpa *g = graphs[(first + i) % n_graphs];
    const double t0 = now_seconds();
    const int32_t status = (int32_t)ggml_graph_compute(g->graph, &g->plan);
    const double t1 = now_seconds();
    if (seconds) seconds[i] = t1 - t0;
    if (status != 0) return status;
  }
  return 0;
}

const char *ggml_sdpa_ggml_version(void) { return ggml_version(); }
