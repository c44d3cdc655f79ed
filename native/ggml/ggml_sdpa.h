/*
 * ggml_sdpa.h -- ggml's CPU attention as llama.cpp builds it at decode, one graph per
 * shape: ggml_flash_attn_ext, or (flash off) mul_mat K.Q, ggml_soft_max_ext with the KQ
 * mask and scale, mul_mat V.P. The graph, its tensors and its work buffer are made once
 * (ggml_sdpa_new); the caller writes the inputs into the graph's own tensors (ggml's
 * layouts below), then ggml_sdpa_compute runs the graph alone.
 *
 * Layouts (C order, outermost first), as llama.cpp's KV cache holds them:
 *   Q     float32 [batch][q_len][n_heads][head_dim]
 *   K     kv_type [batch][kv_len][n_kv_heads][head_dim]
 *   V     flash:  as K; flash off: [batch][n_kv_heads][head_dim][kv_len] (the
 *         transposed V cache llama.cpp keeps when flash attention is off)
 *   mask  [q_len][kv_len], F16 for flash (ggml_flash_attn_ext takes no other), F32
 *         otherwise (llama.cpp's choice); 0 where a key is seen, -inf where not
 *   out   float32 [batch][q_len][n_heads][head_dim]
 */
#ifndef GGML_SDPA_H
#define GGML_SDPA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum ggml_sdpa_kv_type { GGML_SDPA_F32 = 0, GGML_SDPA_F16 = 1, GGML_SDPA_BF16 = 2 };
enum ggml_sdpa_part { GGML_SDPA_Q = 0, GGML_SDPA_K = 1, GGML_SDPA_V = 2, GGML_SDPA_MASK = 3,
                      GGML_SDPA_OUT = 4 };

typedef struct ggml_sdpa_shape {
  int32_t batch, n_heads, n_kv_heads, q_len, kv_len, head_dim;
  int32_t kv_type; /* enum ggml_sdpa_kv_type */
  int32_t flash;   /* 1: ggml_flash_attn_ext; 0: mul_mat + soft_max_ext + mul_mat */
  float scale;     /* applied to K.Q before the mask */
} ggml_sdpa_shape;

typedef struct ggml_sdpa_pool ggml_sdpa_pool; /* a ggml threadpool of n_threads */
typedef struct ggml_sdpa ggml_sdpa;           /* one shape's graph and buffers */

ggml_sdpa_pool *ggml_sdpa_pool_new(int32_t n_threads);
void ggml_sdpa_pool_free(ggml_sdpa_pool *pool);

/* NULL on failure, with the reason in err. The pool must outlive the graph. */
ggml_sdpa *ggml_sdpa_new(const ggml_sdpa_shape *shape, ggml_sdpa_pool *pool, char *err,
                         size_t err_len);
void ggml_sdpa_free(ggml_sdpa *g);
void *ggml_sdpa_data(ggml_sdpa *g, int32_t part);   /* enum ggml_sdpa_part */
size_t ggml_sdpa_nbytes(ggml_sdpa *g, int32_t part);

/* ggml_graph_compute's status: 0 is GGML_STATUS_SUCCESS */
int32_t ggml_sdpa_compute(ggml_sdpa *g);
/* n computes, graph (first + i) % n_graphs for the i-th, each one's seconds into seconds
 * (may be NULL); the first status that is not success ends it and is returned */
int32_t ggml_sdpa_compute_loop(ggml_sdpa *const *graphs, int32_t n_graphs, int32_t first,
                               int32_t n, double *seconds);

const char *ggml_sdpa_ggml_version(void);

#ifdef __cplusplus
}
#endif

#endif
