/*
 * sdpa_probe_lib.h -- what the built-in kernel library exports beyond the
 * kernel ABI: the kernel registry, tuning entry points, runtime helpers and
 * counters. Every exported symbol is prefixed sdpa_probe_.
 * The Python cdef in sdpa_probe/native.py mirrors this file.
 */
#ifndef SDPA_PROBE_LIB_H
#define SDPA_PROBE_LIB_H

#include <stdint.h>

#include "sdpa_probe.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SDPA_PROBE_MAX_THREADS 64

/* Kernel features, for `probe kernels`. */
enum sdpa_probe_feature {
  SDPA_FEAT_GQA_IN_KERNEL = 1 << 0,   /* query heads of a group share one K/V pass */
  SDPA_FEAT_GQA_BROADCAST = 1 << 1,   /* materialises the repeat-interleaved K/V */
  SDPA_FEAT_CAUSAL = 1 << 2,
  SDPA_FEAT_MASK = 1 << 3,
  SDPA_FEAT_STRIDED = 1 << 4,
  SDPA_FEAT_ONLINE_SOFTMAX = 1 << 5,
  SDPA_FEAT_MASK_SKIP = 1 << 6,       /* skips key blocks the mask hides */
  SDPA_FEAT_SPLIT_K = 1 << 7,         /* splits long kv across threads, merges partial softmax */
  SDPA_FEAT_PER_TOKEN_I8 = 1 << 8,
  SDPA_FEAT_ALLOC_PER_BLOCK = 1 << 9, /* allocates its dequant buffer per key block */
  SDPA_FEAT_FULL_SCORES = 1 << 10,    /* materialises the [q_len, kv_len] score matrix */
  SDPA_FEAT_BF16_PRODUCTS = 1 << 11   /* rounds Q, K, P and V to BF16 for its products */
};

typedef struct sdpa_probe_kernel_info {
  const char *name;
  const char *description;
  uint32_t dtypes;   /* bit (1 << sdpa_dtype) for each accepted q/k/v storage dtype */
  uint32_t features; /* enum sdpa_probe_feature bits */
} sdpa_probe_kernel_info;

int64_t sdpa_probe_kernel_count(void);
const sdpa_probe_kernel_info *sdpa_probe_kernel_get(int64_t index);
int sdpa_probe_kernel_forward(int64_t index, const sdpa_args *args);
/* Per-thread scratch bytes the kernel allocates for these arguments (0 if none). */
int64_t sdpa_probe_kernel_scratch_bytes(int64_t index, const sdpa_args *args);

/* flash with explicit block sizes (<= 0: defaults). */
typedef struct sdpa_probe_flash_opts {
  int64_t q_block;
  int64_t kv_block;
  int32_t n_splits; /* split-k factor over kv; <= 0: chosen from the shape and threads */
} sdpa_probe_flash_opts;
int sdpa_probe_flash_forward_ex(const sdpa_args *args, const sdpa_probe_flash_opts *opts);
int sdpa_probe_flash_maskskip_forward_ex(const sdpa_args *args, const sdpa_probe_flash_opts *opts);
/* Why flash_bf16 refuses every call here (no AMX-BF16 tiles for this process), or NULL. */
const char *sdpa_probe_flash_bf16_why(void);

/* Runtime. */
int sdpa_probe_default_threads(void);
int64_t sdpa_probe_align_up(int64_t x, int64_t a); /* a a power of two > 0; -1 otherwise */
void sdpa_probe_alloc_stats(int64_t *count, int64_t *bytes);
void sdpa_probe_alloc_reset(void);
/* Every heap allocation of the process (malloc, calloc, realloc, the aligned
 * ones; every thread), counted by native/preload/alloc_count.c when it is
 * preloaded: allocations, bytes asked for, frees and threads started since the
 * process started.
 * SDPA_UNSUPPORTED (and nothing written) when it is not. */
int sdpa_probe_process_alloc_stats(int64_t *allocs, int64_t *bytes, int64_t *frees,
                                   int64_t *threads);
/* The calling thread's floating-point control state (x86: MXCSR control bits and the
 * x87 control word; AArch64: FPCR; else the rounding mode), and its restore. */
int64_t sdpa_probe_fp_control(void);
void sdpa_probe_fp_control_set(int64_t v);
/* Bytes the C allocator has handed out and not taken back (-1: unknown here). */
int64_t sdpa_probe_heap_in_use(void);
/* The program break (sbrk(0)) as an address, 0 where there is none: the allocator's
 * main heap grows by moving it, which the address space counts too. */
int64_t sdpa_probe_program_break(void);

/* Guarded allocation, opt-in (scratch-sizing checks). While on, every
 * sdpa_probe_malloc block gets a front and a tail canary and a filled body; on
 * free it is checked and one record kept per block, in free order. */
typedef struct sdpa_probe_alloc_record {
  int64_t seq;        /* free order since the guard was switched on */
  int64_t bytes;      /* size asked for */
  int64_t high_water; /* 1 + offset of the last body byte written (0: none written) */
  int64_t touched;    /* body bytes written */
  int64_t overrun;    /* tail canary bytes changed: writes past the end */
  int64_t underrun;   /* head canary bytes changed: writes before the start */
} sdpa_probe_alloc_record;
void sdpa_probe_alloc_guard(int on); /* on != 0 also clears the records */
/* Copies up to max records into out (may be NULL); returns how many blocks were
 * recorded (more than fit when the count exceeds the record table). */
int64_t sdpa_probe_alloc_guard_records(sdpa_probe_alloc_record *out, int64_t max);
/* Self-test of the guard: allocates `bytes`, writes body bytes [from, to) (from
 * may be down to -48, to up to bytes + 256: inside the canaries), frees. Needs
 * the guard on; returns an sdpa_status. */
int sdpa_probe_alloc_guard_test(int64_t bytes, int64_t write_from, int64_t write_to);

/* fn(a) (or registered kernel kernel_index when fn is NULL), then nbytes of watch
 * copied to copy at once: the output as it was when the call returned (call_watch.c).
 * Returns the call's status; SDPA_INVALID for a NULL a or buffer. */
int sdpa_probe_call_watched(sdpa_probe_forward_fn fn, int64_t kernel_index, const sdpa_args *a,
                            const void *watch, void *copy, int64_t nbytes);

/* Benchmark loop (`probe bench`): calls kernel `kernel_index` `iters` times, call i
 * with args[i % n_args] (several argument sets rotate through buffers larger than
 * the last-level cache), and stores each call's wall time in seconds_out[i] (may
 * be NULL). Returns the first status other than SDPA_OK, or SDPA_OK. */
int sdpa_probe_bench_loop(int64_t kernel_index, const sdpa_args *args, int64_t n_args,
                          int64_t iters, double *seconds_out);
/* The same loop over any sdpa_forward (a user kernel's, from its own module). */
int sdpa_probe_bench_loop_fn(sdpa_probe_forward_fn fn, const sdpa_args *args, int64_t n_args,
                             int64_t iters, double *seconds_out);

/* Internal (not for Python): counted allocation and the thread pool. */
void *sdpa_probe_malloc(int64_t bytes);
void sdpa_probe_free(void *p);
typedef void (*sdpa_probe_task_fn)(void *ctx, int64_t task, int thread);
void sdpa_probe_parallel_for(int n_threads, int64_t n_tasks, sdpa_probe_task_fn fn, void *ctx);

#ifdef __cplusplus
}
#endif
#endif
