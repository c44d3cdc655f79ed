/* flash_bf16's prefill block: Q.K^T and P.V as BF16 products on the AMX tiles,
 * the online softmax and the accumulators in F32 (flash_amx.c). */
#ifndef SDPA_PROBE_FLASH_AMX_H
#define SDPA_PROBE_FLASH_AMX_H

#include "flash_internal.h"

/* 1 when this build has the AMX block and this CPU and kernel let this process use
 * the AMX-BF16 tiles (asked for once per process: Linux's ARCH_REQ_XCOMP_PERM). */
FC_HIDDEN int flash_amx_available(void);
/* Why not, in one line (NULL when available). */
FC_HIDDEN const char *flash_amx_why(void);
/* Floats of a thread's AMX scratch for R_max rows, head_dim D, kv_block keys. */
FC_HIDDEN int64_t flash_amx_scratch_floats(int64_t R_max, int64_t D, int64_t kv_block);
/* Q's R rows (F32, pre-scaled, row stride D) as the tiles' BF16 B operands, once a task. */
FC_HIDDEN void flash_amx_pack_q(const float *Q, int64_t R, int64_t D, float *amx);
/* Keys [j0, j1) of kv head hk for every row of the task (flash_fast_block's contract). */
FC_HIDDEN void flash_amx_block(flash_ctx *c, thread_bufs *tb, int64_t b, int64_t hk, int64_t q0,
                               int64_t qbr, int64_t j0, int64_t j1, int mask_is_zero);

#endif
