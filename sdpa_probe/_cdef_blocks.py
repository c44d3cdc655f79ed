"""cffi declarations of the blocks part of the native library (see _cdefs.PARTS).

Mirrors native/include/sdpa_probe_blocks.h (decode building blocks) and
native/include/sdpa_probe_decode.h (the decode step behind `probe profile`).
"""

CDEF = """
int sdpa_probe_rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t n,
                       float eps);
int sdpa_probe_residual_add(float *x, const float *r, int64_t n);
int sdpa_probe_silu_gate(const float *gate, const float *up, float *out, int64_t n,
                         int32_t n_threads);
int sdpa_probe_cast_f16_f32(const uint16_t *src, float *dst, int64_t n, int32_t n_threads);
int sdpa_probe_cast_f32_f16(const float *src, uint16_t *dst, int64_t n, int32_t n_threads);
int sdpa_probe_gemv_f32(const float *w, const float *x, float *y, int64_t out, int64_t in,
                        int32_t n_threads);
int sdpa_probe_gemv_f16(const uint16_t *w, const float *x, float *y, int64_t out, int64_t in,
                        int32_t n_threads);
enum sdpa_probe_rope_style { SDPA_PROBE_ROPE_HALF = 0, SDPA_PROBE_ROPE_INTERLEAVED = 1 };
int sdpa_probe_rope_table(float *cos_tab, float *sin_tab, int64_t n_pos, int64_t head_dim,
                          float theta);
int sdpa_probe_rope(float *x, int64_t n_heads, int64_t head_dim, int64_t pos,
                    const float *cos_tab, const float *sin_tab, int64_t n_pos, int32_t style);
int sdpa_probe_rope_window(const float *src, float *dst, int64_t len, int64_t n_heads,
                           int64_t head_dim, int64_t pos0, const int64_t *positions,
                           const float *cos_tab, const float *sin_tab, int64_t n_pos,
                           int32_t style, int32_t n_threads);
typedef struct sdpa_probe_kv_cache {
  void *data; float *scale; int8_t *zero_point; int32_t dtype;
  int64_t capacity, n_kv_heads, head_dim; int64_t ring_size;
} sdpa_probe_kv_cache;
int64_t sdpa_probe_kv_slot(const sdpa_probe_kv_cache *c, int64_t pos);
int sdpa_probe_kv_write(const sdpa_probe_kv_cache *c, int64_t pos, const float *src);
int sdpa_probe_kv_read(const sdpa_probe_kv_cache *c, int64_t slot0, int64_t n, float *dst,
                       int32_t n_threads);
int sdpa_probe_kv_tensor(const sdpa_probe_kv_cache *c, sdpa_tensor *t);
int sdpa_probe_gqa_broadcast(const float *src, float *dst, int64_t len, int64_t n_kv_heads,
                             int64_t n_heads, int64_t head_dim, int32_t n_threads);
#define SDPA_PROBE_PACK_NR 8
int64_t sdpa_probe_pack_k_floats(int64_t heads, int64_t len, int64_t head_dim);
int sdpa_probe_pack_k(const float *k, float *dst, int64_t heads, int64_t len, int64_t head_dim,
                      int32_t n_threads);
int sdpa_probe_qk_packed(const float *q, const float *kp, float *scores, int64_t heads,
                         int64_t len, int64_t head_dim, float scale, int32_t n_threads);
int sdpa_probe_softmax(float *x, int64_t rows, int64_t n, int32_t n_threads);
int sdpa_probe_pv(const float *p, const float *v, float *out, int64_t heads, int64_t len,
                  int64_t head_dim, int32_t n_threads);

#define SDPA_PROBE_DECODE_ENOMEM 3
enum sdpa_probe_graph { SDPA_PROBE_GRAPH_DECOMPOSED = 0, SDPA_PROBE_GRAPH_KERNEL = 1 };
typedef struct sdpa_probe_decode_config {
  int64_t n_layers, hidden, n_heads, n_kv_heads, head_dim, ffn, vocab;
  int32_t weight_dtype; int32_t rope_style; float rope_theta, norm_eps;
  uint64_t seed; int32_t n_threads;
} sdpa_probe_decode_config;
typedef struct sdpa_probe_decode_model sdpa_probe_decode_model;
typedef struct sdpa_probe_decode_state sdpa_probe_decode_state;
typedef struct sdpa_probe_op_record { int64_t start_ns, dur_ns, allocs, alloc_bytes; }
  sdpa_probe_op_record;
int64_t sdpa_probe_decode_model_bytes(const sdpa_probe_decode_config *cfg);
int sdpa_probe_decode_model_new(const sdpa_probe_decode_config *cfg,
                                sdpa_probe_decode_model **out);
void sdpa_probe_decode_model_free(sdpa_probe_decode_model *m);
int64_t sdpa_probe_decode_state_bytes(const sdpa_probe_decode_config *cfg, int32_t graph,
                                      int32_t cache_dtype, int64_t capacity);
int sdpa_probe_decode_state_new(const sdpa_probe_decode_model *m, int32_t graph,
                                int64_t kernel_index, int32_t cache_dtype, int64_t capacity,
                                int32_t n_threads, sdpa_probe_decode_state **out);
void sdpa_probe_decode_state_free(sdpa_probe_decode_state *s);
int sdpa_probe_decode_set_forward(sdpa_probe_decode_state *s, sdpa_probe_forward_fn fn);
int64_t sdpa_probe_decode_op_count(const sdpa_probe_decode_state *s);
int sdpa_probe_decode_op_info(const sdpa_probe_decode_state *s, int64_t i, const char **name,
                              const char **kind, int64_t *layer);
int sdpa_probe_decode_fill_history(sdpa_probe_decode_state *s, int64_t begin, int64_t end,
                                   uint64_t seed);
int sdpa_probe_decode_step(sdpa_probe_decode_state *s, int64_t token, int64_t pos,
                           float *logits, int64_t *next_token, sdpa_probe_op_record *records,
                           int64_t *step_ns);
double sdpa_probe_decode_record_cost_ns(int64_t iters);
"""

INCLUDE = '#include "sdpa_probe_blocks.h"\n#include "sdpa_probe_decode.h"\n'
