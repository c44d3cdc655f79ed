/*
 * sdpa_probe.h -- the kernel ABI of sdpa_probe.
 *
 * One call computes, for every batch b, query row i and head h:
 *
 *   out[b,i,h,:] = sum_j softmax_j(scale * q[b,i,h,:] . k[b,j,g(h),:] + bias(i,j)) * v[b,j,g(h),:]
 *
 *   g(h)      = h / (n_heads / n_kv_heads)            (grouped-query attention)
 *   bias(i,j) = mask[i*mask_row_stride + j]           (if mask != NULL)
 *             + (-inf if is_causal and j > start_pos + i)
 *
 * Query row i sits at absolute position start_pos + i (bottom-right causal
 * alignment, as in decode with a KV cache). A query row that sees no key
 * yields zeros, never NaN. scale <= 0 means 1/sqrt(head_dim). kv_len 0 (an
 * empty cache) is valid: K's and V's pointers may be NULL, their dtype is set.
 *
 * A kernel library exports `int sdpa_forward(const sdpa_args *)` and returns
 * an sdpa_status; it never aborts the process. sdpa_validate_args() below is
 * the one shared argument check: call it first.
 *
 * It may be called from several threads at once and from a small stack; the
 * same buffers come back every decode step with new contents (keep nothing by
 * a buffer's address); it touches no byte outside the elements it is given, not
 * even to discard it (a buffer may end a mapping: mask or predicate its tails);
 * a call frees what it allocates; it leaves the caller's
 * floating-point environment, thread (affinity, signal mask, name) and process
 * (signal handlers, locale, environment, ...) as it found them (docs/abi.md).
 */
#ifndef SDPA_PROBE_H
#define SDPA_PROBE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SDPA_ABI_VERSION 1

enum sdpa_dtype { SDPA_F32 = 0, SDPA_F16 = 1, SDPA_BF16 = 2, SDPA_I8 = 3 };
enum sdpa_status { SDPA_OK = 0, SDPA_UNSUPPORTED = 1, SDPA_INVALID = 2 };

typedef struct sdpa_tensor {
  void *data;
  int32_t dtype;               /* enum sdpa_dtype */
  int64_t stride[4];           /* element strides for (batch, seq, head, dim) */
  const float *scale;          /* SDPA_I8 only: real = (x - zero_point) * scale */
  const int8_t *zero_point;    /* one per (batch, seq, head); NULL means 0 */
  int64_t qstride[3];          /* element strides of scale / zero_point for (batch, seq, head) */
} sdpa_tensor;

typedef struct sdpa_args {
  int32_t abi_version;         /* SDPA_ABI_VERSION */
  int64_t batch, n_heads, n_kv_heads, q_len, kv_len, head_dim;
  sdpa_tensor q, k, v, out;    /* out is F32, F16 or BF16 */
  const float *mask;           /* additive [q_len, kv_len], or NULL */
  int64_t mask_row_stride;
  int32_t is_causal;
  int64_t start_pos;
  float scale;
  int32_t n_threads;           /* <= 0: the kernel's default */
} sdpa_args;

int sdpa_forward(const sdpa_args *args);
/* sdpa_forward as a pointer: the harness calls a user kernel's from its own module. */
typedef int (*sdpa_probe_forward_fn)(const sdpa_args *args);

/* ---- the shared argument check -------------------------------------- */

static inline int sdpa_dtype_valid_(int32_t dt) {
  return dt == SDPA_F32 || dt == SDPA_F16 || dt == SDPA_BF16 || dt == SDPA_I8;
}

static inline int sdpa_tensor_valid_(const sdpa_tensor *t, int64_t seq, int64_t heads,
                                     int64_t dim) {
  if (t->data == NULL || !sdpa_dtype_valid_(t->dtype)) return 0;
  /* strides may be any sign but not all-zero over a non-trivial extent */
  if (dim > 1 && t->stride[3] == 0) return 0;
  if (t->dtype == SDPA_I8 && t->scale == NULL) return 0;
  (void)seq; (void)heads;
  return 1;
}

/* Returns SDPA_OK, or SDPA_INVALID for an argument no kernel can accept. */
static inline int sdpa_validate_args(const sdpa_args *a) {
  if (a == NULL) return SDPA_INVALID;
  if (a->abi_version != SDPA_ABI_VERSION) return SDPA_INVALID;
  if (a->batch < 0 || a->n_heads <= 0 || a->n_kv_heads <= 0 || a->q_len < 0 ||
      a->kv_len < 0 || a->head_dim <= 0)
    return SDPA_INVALID;
  if (a->n_heads % a->n_kv_heads != 0) return SDPA_INVALID;
  if (a->start_pos < 0) return SDPA_INVALID;
  if (isnan(a->scale) || isinf(a->scale)) return SDPA_INVALID;
  if (a->batch == 0 || a->q_len == 0) return SDPA_OK; /* nothing to write */
  if (!sdpa_tensor_valid_(&a->q, a->q_len, a->n_heads, a->head_dim)) return SDPA_INVALID;
  if (!sdpa_tensor_valid_(&a->out, a->q_len, a->n_heads, a->head_dim)) return SDPA_INVALID;
  if (a->out.dtype == SDPA_I8) return SDPA_INVALID;
  if (a->kv_len > 0) {
    if (!sdpa_tensor_valid_(&a->k, a->kv_len, a->n_kv_heads, a->head_dim)) return SDPA_INVALID;
    if (!sdpa_tensor_valid_(&a->v, a->kv_len, a->n_kv_heads, a->head_dim)) return SDPA_INVALID;
  }
  if (a->mask != NULL && a->kv_len > 0 && a->q_len > 1 && a->mask_row_stride < a->kv_len)
    return SDPA_INVALID;
  return SDPA_OK;
}

#ifdef __cplusplus
}
#endif
#endif /* SDPA_PROBE_H */
