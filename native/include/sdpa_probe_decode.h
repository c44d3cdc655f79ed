/*
 * sdpa_probe_decode.h -- a transformer decode step assembled from the
 * building blocks (sdpa_probe_blocks.h), with per-op timing taken in native
 * code, for `probe profile`.
 *
 * A model holds random weights (a deterministic function of the seed) for a
 * Llama-style decoder: per layer RMSNorm, Q/K/V GEMV, RoPE, KV-cache write,
 * attention, output GEMV, residual, RMSNorm, gate/up GEMV, SiLU-gate, down
 * GEMV, residual; then final RMSNorm and the LM head (tied with the token
 * embedding). A state holds one attention graph's KV caches and scratch:
 *
 *   SDPA_PROBE_GRAPH_DECOMPOSED  the cache holds un-roped K; every step reads
 *       the window with a cast, re-ropes it, materialises the GQA broadcast,
 *       packs K, then QK^T, softmax, PV (the torch-style export);
 *   SDPA_PROBE_GRAPH_KERNEL  K is roped once at write; a registered SDPA
 *       kernel (sdpa_probe_kernel_forward(kernel_index)), or any sdpa_forward
 *       set with sdpa_probe_decode_set_forward, reads the cache as is.
 *
 * Both graphs see the same logical history (sdpa_probe_decode_fill_history)
 * and so produce the same logits up to rounding.
 * Status codes: SDPA_OK, SDPA_UNSUPPORTED (the kernel refused), SDPA_INVALID,
 * SDPA_PROBE_DECODE_ENOMEM.
 */
#ifndef SDPA_PROBE_DECODE_H
#define SDPA_PROBE_DECODE_H

#include <stdint.h>

#include "sdpa_probe.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SDPA_PROBE_DECODE_ENOMEM 3

enum sdpa_probe_graph { SDPA_PROBE_GRAPH_DECOMPOSED = 0, SDPA_PROBE_GRAPH_KERNEL = 1 };

typedef struct sdpa_probe_decode_config {
  int64_t n_layers, hidden, n_heads, n_kv_heads, head_dim, ffn, vocab;
  int32_t weight_dtype; /* SDPA_F32 or SDPA_F16 */
  int32_t rope_style;   /* enum sdpa_probe_rope_style */
  float rope_theta, norm_eps;
  uint64_t seed;
  int32_t n_threads; /* for weight generation; <= 0: default */
} sdpa_probe_decode_config;

typedef struct sdpa_probe_decode_model sdpa_probe_decode_model;
typedef struct sdpa_probe_decode_state sdpa_probe_decode_state;

/* Per-op record of one step: start (CLOCK_MONOTONIC ns), duration (ns), and the
 * library's counted heap allocations made inside the op. */
typedef struct sdpa_probe_op_record {
  int64_t start_ns, dur_ns, allocs, alloc_bytes;
} sdpa_probe_op_record;

/* Bytes the weights need (-1 if the config is invalid). */
int64_t sdpa_probe_decode_model_bytes(const sdpa_probe_decode_config *cfg);
int sdpa_probe_decode_model_new(const sdpa_probe_decode_config *cfg,
                                sdpa_probe_decode_model **out);
void sdpa_probe_decode_model_free(sdpa_probe_decode_model *m);

/* Bytes a state needs: caches, RoPE tables and scratch (-1 if invalid). */
int64_t sdpa_probe_decode_state_bytes(const sdpa_probe_decode_config *cfg, int32_t graph,
                                      int32_t cache_dtype, int64_t capacity);
/* cache_dtype: SDPA_F32, SDPA_F16 or SDPA_I8 (per token and head, with zero
 * point); capacity: positions the cache holds. kernel_index: a registered
 * kernel for SDPA_PROBE_GRAPH_KERNEL, or -1 when the attention will come from
 * sdpa_probe_decode_set_forward. The state keeps a pointer to m. */
int sdpa_probe_decode_state_new(const sdpa_probe_decode_model *m, int32_t graph,
                                int64_t kernel_index, int32_t cache_dtype, int64_t capacity,
                                int32_t n_threads, sdpa_probe_decode_state **out);
void sdpa_probe_decode_state_free(sdpa_probe_decode_state *s);

/* The attention of an SDPA_PROBE_GRAPH_KERNEL state as a function pointer
 * (e.g. a user kernel's sdpa_forward from another shared library) called
 * instead of the registered kernel; NULL goes back to kernel_index. A state
 * made with kernel_index -1 steps only once a forward is set. SDPA_INVALID
 * for a decomposed state. The caller keeps fn's library loaded. */
int sdpa_probe_decode_set_forward(sdpa_probe_decode_state *s, sdpa_probe_forward_fn fn);

/* The ops of one step, in execution order: name, kind and layer (-1: outside
 * the layers). The pointers live as long as the state. */
int64_t sdpa_probe_decode_op_count(const sdpa_probe_decode_state *s);
int sdpa_probe_decode_op_info(const sdpa_probe_decode_state *s, int64_t i, const char **name,
                              const char **kind, int64_t *layer);

/* Store a pseudo-random history (pre-RoPE keys, values; a function of seed,
 * layer and position only) at positions [begin, end) of every layer's cache,
 * roped at write for SDPA_PROBE_GRAPH_KERNEL. */
int sdpa_probe_decode_fill_history(sdpa_probe_decode_state *s, int64_t begin, int64_t end,
                                   uint64_t seed);

/* One decode step: embed `token`, run every layer at position pos (attending to
 * positions [0, pos], writing pos into the cache), final norm, LM head,
 * argmax. logits [vocab] and next_token may be NULL. records [op_count] NULL
 * runs untimed; step_ns (may be NULL) gets the step's own duration. */
int sdpa_probe_decode_step(sdpa_probe_decode_state *s, int64_t token, int64_t pos,
                           float *logits, int64_t *next_token, sdpa_probe_op_record *records,
                           int64_t *step_ns);

/* Average cost (ns) of the bookkeeping around one op (two clock reads and two
 * allocation-counter reads), from a loop of iters records. */
double sdpa_probe_decode_record_cost_ns(int64_t iters);

#ifdef __cplusplus
}
#endif
#endif /* SDPA_PROBE_DECODE_H */
