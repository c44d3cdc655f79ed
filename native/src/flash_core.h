/* The tiled online-softmax core shared by flash, flash_maskskip and the
 * int8 kernels. */
#ifndef SDPA_PROBE_FLASH_CORE_H
#define SDPA_PROBE_FLASH_CORE_H

#include "common.h"

/* Key ranges worth visiting, per query block, from a scan of the mask. */
typedef struct flash_mask_plan {
  int64_t n_qblocks;
  const int64_t *seg_begin;   /* [n_qblocks + 1]: segment index range per query block */
  const int64_t *segs;        /* [2 * n_segs]: [start, end) key ranges, ascending */
  const int32_t *zero_prefix; /* [n_qblocks][kv_len + 1]: prefix count of columns whose
                                 mask is exactly 0 for every row of the block */
} flash_mask_plan;

typedef struct flash_cfg {
  int64_t q_block;
  int32_t q_block_auto;    /* q_block not asked for: FLASH_PANEL_ROWS where that applies */
  int64_t kv_block;        /* 0: chosen from the shape (see below) */
  int32_t n_splits;        /* <= 0: choose */
  int32_t alloc_per_block; /* dequant buffers malloc'd per key block (ExecuTorch PR 15610) */
  int32_t bf16_products;   /* prefill Q.K^T and P.V as BF16 products on the AMX tiles */
  const flash_mask_plan *plan;
} flash_cfg;

#define FLASH_DEFAULT_Q_BLOCK 32
/* Rows (query heads of a kv head's group x query rows) a prefill task aims at when no
 * query block is asked for and no mask plan fixes them: one K block's transpose then
 * serves this many rows, so the query block is FLASH_PANEL_ROWS / group size, at least
 * FLASH_DEFAULT_Q_BLOCK. With one query head per kv head (16, 16, 128), causal prefill
 * 512 ran 1.28-1.30x faster with 128-row blocks than with 32 on the AVX-512 panel
 * (F32, int8) and 1.11-1.16x on the AVX2 one (the Xeon, -march=haswell); at
 * (32, 8, 64), 4 x 32 rows already, 128-row blocks were 1.03x (AVX-512) and
 * 0.97-0.99x (AVX2). */
#define FLASH_PANEL_ROWS 128
#define FLASH_DEFAULT_KV_BLOCK 128 /* tasks of one kv head (prefill) */
/* tasks spanning every kv head (decode), 4-byte K/V; 2-byte: 32 keys, int8: 64 (the same
 * bytes) at most; and K + V of a block over the task's heads */
#ifndef FLASH_DECODE_KV_BLOCK
#define FLASH_DECODE_KV_BLOCK 16
#endif
#ifndef FLASH_DECODE_BLOCK_BYTES
#define FLASH_DECODE_BLOCK_BYTES (64 << 10)
#endif
/* ... but at least this many keys: with many kv heads of head_dim 128 the byte
 * budget had left 4 keys a block, and each (block, head) visit's fixed work (the
 * AVX2 scores reduce 8 keys at a time, the softmax tile, the P.V setup) then
 * outweighed its keys. AVX2 build (-march=x86-64-v3) on the Xeon, F32 MHA decode
 * (16 and 32 kv heads, head_dim 64-128): 1.4-2.0x faster warm, 1.23x cold at
 * (16, 16, 128) kv 8192, where it had run at 0.54-0.67x torch (ATEN_CPU_CAPABILITY=avx2);
 * 8 keys gave 1.26-1.87x. F16 / int8 shapes already had 16 or more. */
#define FLASH_DECODE_MIN_KEYS 16

void flash_cfg_defaults(flash_cfg *cfg, const sdpa_probe_flash_opts *opts);
int flash_core(const sdpa_args *a, const flash_cfg *cfg);
int64_t flash_scratch_bytes(const sdpa_args *a, const flash_cfg *cfg);

#endif
