"""cffi declarations of the blocks part of the native library (see _cdefs.PARTS).

Mirrors native/include/sdpa_probe_blocks.h (decode building blocks).
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
"""

INCLUDE = '#include "sdpa_probe_blocks.h"\n'
