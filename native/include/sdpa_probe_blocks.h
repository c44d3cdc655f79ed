/*
 * sdpa_probe_blocks.h -- the decode building blocks: the individual ops a
 * transformer decode step is made of, as separate exported functions, so a
 * decode step can be assembled (and timed) op by op in either of two shapes:
 *
 *   decomposed  what a torch-style export runs: cast the cache to F32 (or copy
 *               it, the concat), re-apply RoPE to the whole cached window,
 *               materialise the GQA repeat-interleave, pack K for the matmul,
 *               QK^T, softmax, PV;
 *   fused       RoPE once at cache write, an SDPA kernel reading the cache.
 *
 * Conventions: sizes are int64_t, arrays are dense row-major float32 unless
 * said otherwise, every function returns SDPA_OK (0) or SDPA_INVALID (2) and
 * never aborts. A size of 0 is a no-op (SDPA_OK). n_threads <= 0 means the
 * library default; small ops run on the calling thread whatever n_threads is.
 * F16 data is carried as uint16_t bit patterns (IEEE binary16).
 */
#ifndef SDPA_PROBE_BLOCKS_H
#define SDPA_PROBE_BLOCKS_H

#include <stdint.h>

#include "sdpa_probe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- normalisation and elementwise ------------------------------------ */

/* y[r,:] = x[r,:] / sqrt(mean(x[r,:]^2) + eps) * w[:] for r < rows; y may be x. */
int sdpa_probe_rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t n,
                       float eps);

/* x[i] += r[i] (the residual add). */
int sdpa_probe_residual_add(float *x, const float *r, int64_t n);

/* out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). out may be gate or up. */
int sdpa_probe_silu_gate(const float *gate, const float *up, float *out, int64_t n,
                         int32_t n_threads);

/* dst[i] = (float)src[i], src IEEE binary16. */
int sdpa_probe_cast_f16_f32(const uint16_t *src, float *dst, int64_t n, int32_t n_threads);

/* dst[i] = (binary16)src[i], round to nearest even. */
int sdpa_probe_cast_f32_f16(const float *src, uint16_t *dst, int64_t n, int32_t n_threads);

/* ---- GEMV: y[o] = sum_i W[o, i] x[i], W [out, in] row-major ------------- */

int sdpa_probe_gemv_f32(const float *w, const float *x, float *y, int64_t out, int64_t in,
                        int32_t n_threads);
int sdpa_probe_gemv_f16(const uint16_t *w, const float *x, float *y, int64_t out, int64_t in,
                        int32_t n_threads);

/* ---- RoPE ----------------------------------------------------------------
 * angle(p, i) = p * theta^(-2i / head_dim), i < head_dim / 2 (head_dim even).
 * HALF rotates pairs (i, i + D/2) (rotate_half: HF Llama, Qwen, NeoX);
 * INTERLEAVED rotates pairs (2i, 2i + 1) (GPT-J, Meta's original Llama). */
enum sdpa_probe_rope_style { SDPA_PROBE_ROPE_HALF = 0, SDPA_PROBE_ROPE_INTERLEAVED = 1 };

/* cos_tab, sin_tab [n_pos, head_dim / 2]: cos/sin of angle(p, i), computed in double. */
int sdpa_probe_rope_table(float *cos_tab, float *sin_tab, int64_t n_pos, int64_t head_dim,
                          float theta);

/* One token: x [n_heads, head_dim] rotated in place to position pos (< n_pos). */
int sdpa_probe_rope(float *x, int64_t n_heads, int64_t head_dim, int64_t pos,
                    const float *cos_tab, const float *sin_tab, int64_t n_pos, int32_t style);

/* A window of tokens: src [len, n_heads, head_dim]; row j is at position
 * positions[j] if positions != NULL, else pos0 + j (each < n_pos). The rotated
 * rows go to dst (same shape; dst == src allowed). */
int sdpa_probe_rope_window(const float *src, float *dst, int64_t len, int64_t n_heads,
                           int64_t head_dim, int64_t pos0, const int64_t *positions,
                           const float *cos_tab, const float *sin_tab, int64_t n_pos,
                           int32_t style, int32_t n_threads);

/* ---- KV cache ------------------------------------------------------------
 * One cache tensor (K or V of one layer): data [capacity, n_kv_heads, head_dim]
 * of dtype SDPA_F32, SDPA_F16 or SDPA_I8. For SDPA_I8, scale and zero_point
 * [capacity, n_kv_heads] hold one (scale, zero point) per token and head:
 * real = (x - zero_point) * scale (asymmetric, the range always includes 0).
 * ring_size == 0: linear, slot = pos (pos < capacity);
 * ring_size > 0:  ring, slot = pos % ring_size (ring_size <= capacity). */
typedef struct sdpa_probe_kv_cache {
  void *data;
  float *scale;
  int8_t *zero_point;
  int32_t dtype;
  int64_t capacity, n_kv_heads, head_dim;
  int64_t ring_size;
} sdpa_probe_kv_cache;

/* The slot position pos is stored in, or -1 if pos < 0 or (linear) pos >= capacity
 * or the cache is malformed. */
int64_t sdpa_probe_kv_slot(const sdpa_probe_kv_cache *c, int64_t pos);

/* Store src [n_kv_heads, head_dim] (F32) as position pos (converted / quantised). */
int sdpa_probe_kv_write(const sdpa_probe_kv_cache *c, int64_t pos, const float *src);

/* The cache-read cast: slots [slot0, slot0 + n) to F32 dst [n, n_kv_heads, head_dim]
 * (a plain copy for an F32 cache: the concat a torch export does). */
int sdpa_probe_kv_read(const sdpa_probe_kv_cache *c, int64_t slot0, int64_t n, float *dst,
                       int32_t n_threads);

/* Fill an sdpa_tensor (batch stride 0) viewing the cache slots, for the kernel ABI. */
int sdpa_probe_kv_tensor(const sdpa_probe_kv_cache *c, sdpa_tensor *t);

/* ---- the decomposed attention graph ------------------------------------- */

/* GQA repeat-interleave: dst [n_heads, len, head_dim], dst[h, j] = src[j, h / G],
 * G = n_heads / n_kv_heads, from src [len, n_kv_heads, head_dim]. */
int sdpa_probe_gqa_broadcast(const float *src, float *dst, int64_t len, int64_t n_kv_heads,
                             int64_t n_heads, int64_t head_dim, int32_t n_threads);

/* Matmul packing of K [heads, len, head_dim] for scores = Q K^T, into panels of
 * SDPA_PROBE_PACK_NR keys: dst[h][p][d][r] = K[h][p * NR + r][d], zero padded.
 * sdpa_probe_pack_k_floats() is the size of dst in floats (-1 if invalid). */
#define SDPA_PROBE_PACK_NR 8
int64_t sdpa_probe_pack_k_floats(int64_t heads, int64_t len, int64_t head_dim);
int sdpa_probe_pack_k(const float *k, float *dst, int64_t heads, int64_t len, int64_t head_dim,
                      int32_t n_threads);

/* scores[h, j] = scale * q[h, :] . K[h, j, :] with K packed by sdpa_probe_pack_k;
 * q [heads, head_dim], scores [heads, len]. scale <= 0: 1 / sqrt(head_dim). */
int sdpa_probe_qk_packed(const float *q, const float *kp, float *scores, int64_t heads,
                         int64_t len, int64_t head_dim, float scale, int32_t n_threads);

/* Row softmax in place over x [rows, n] (a row of -inf becomes zeros). */
int sdpa_probe_softmax(float *x, int64_t rows, int64_t n, int32_t n_threads);

/* out[h, :] = sum_j p[h, j] v[h, j, :]; p [heads, len], v [heads, len, head_dim]. */
int sdpa_probe_pv(const float *p, const float *v, float *out, int64_t heads, int64_t len,
                  int64_t head_dim, int32_t n_threads);

#ifdef __cplusplus
}
#endif
#endif /* SDPA_PROBE_BLOCKS_H */
