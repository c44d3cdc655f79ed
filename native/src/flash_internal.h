/* What the parts of flash_core share: the plan of a call (flash_ctx), the
 * per-thread scratch's layout and the buffers carved from it (thread_bufs), and
 * the entry points of the two block paths. The design is described at the top
 * of flash_core.c. */
#ifndef SDPA_PROBE_FLASH_INTERNAL_H
#define SDPA_PROBE_FLASH_INTERNAL_H

#include "flash_core.h"
#include "flash_prefetch.h"
#include "flash_vec.h"

/* Functions and tables shared by the flash_*.c files alone: not exported from
 * the library, so calls between them are direct, as within one file. */
#define FC_HIDDEN __attribute__((visibility("hidden")))

#define PAD16(n) (((n) + 15) & ~(int64_t)15)
#define FC_TILE 4 /* rows per register tile */
#define FC_TILE_MAX 8 /* rows per tile on the AVX-512 panel (flash_x512_panel.c) */
/* A task takes every kv head when a head has at most this many rows (G x q block). */
#define FLASH_HEADS_TOGETHER_ROWS 16

/* Where each region of a thread's scratch starts, in floats from its start (-1:
 * the call has no such region), and how many floats a thread takes. The one
 * statement of the layout: flash_scratch_bytes and flash_core size the scratch
 * from it, flash_task and merge_task carve it (flash_scratch_bufs). */
typedef struct flash_scratch_layout {
  int64_t Q, acc, m, l, S;  /* every path: [hc * R_max] rows; S: a block's scores */
  int64_t Qp, mk;           /* x512: packed Q, the block's mask */
  int64_t ksc, vsc, kz, vz; /* int8 K / V: a block's per-key scales and zero points */
  int64_t qf, qs, qz;       /* integer Q.K^T: per-row terms (qz: x512 only) */
  int64_t KT;               /* panel: K^T of a block */
  int64_t Kf, Vf;           /* a K / V block as F32 (panel: V; generic: K and V) */
  int64_t amx;              /* BF16 products on the AMX tiles: flash_amx.c's operands */
  int64_t merge_acc, merge_l; /* the split-k merge pass, over the same scratch */
  int64_t floats;           /* per thread: the larger of a task's and the merge's */
} flash_scratch_layout;

typedef struct {
  const sdpa_args *a;
  const flash_cfg *cfg;
  int64_t G, qb, kvb, n_qblocks, n_splits, split_len, R_max, D;
  int64_t hc, n_hchunks;  /* kv heads per task, and chunks of them */
  float scale;
  int k_direct, v_direct; /* F32 with unit dim stride: read in place */
  int fast;               /* the register-tiled block path */
  int iqk;                /* fast path, int8 Q and K: integer Q.K^T */
  int panel;              /* fast path, many rows per head (prefill): K block transposed
                             (and V converted) once per block, GEMM-style score tiles */
  int panel16;            /* panel, AVX-512: the tile's products 16 lanes wide (flash_x512_panel.c) */
  int amx;                /* panel16, BF16 products on the AMX tiles (flash_amx.c; flash_bf16) */
  int x512;               /* decode tasks on the AVX-512 block path (flash_x512_block.h): every kv
                             head of a key block at once, in memory order */
  char *scratch;
  int64_t scratch_stride; /* bytes per thread */
  flash_scratch_layout layout; /* of each thread's scratch */
  float *partial;         /* split-k: [batch, kv head, query block, split][R_max][D + 2] */
  int status;
} flash_ctx;

typedef struct {
  float *Q, *acc, *m, *l, *S, *Kf, *Vf;
  fc_prefetch *pf;   /* fast path: the task's prefetch cursor (NULL: none) */
  float *ksc, *vsc;  /* fast path, I8: per-key scales of the block */
  float *qf;         /* integer Q.K^T: scale * q_scale per row; Q then holds (q - zq) as int16 */
  float *qs;         /* integer Q.K^T: sum of (q - zq) per row (an integer, exact) */
  float *qz;         /* x512, integer Q.K^T: zq per row (flash_x512_pack_q wants q itself) */
  float *KT;         /* panel: the K block transposed, [D][kvp], dequantised */
  float *Qp, *mk;    /* x512: Q packed (flash_x512_pack_q), the block's mask [key][16] */
  int32_t *kz, *vz;  /* fast path, I8: per-key zero points of the block */
  float *amx;        /* amx: the tiles' operands (flash_amx.c) */
} thread_bufs;

static inline int64_t kvb_pad(int64_t kvb) { return PAD16(kvb); }

/* How many of the block's nk keys from j0 on query row i (absolute index in the
 * query range) may see under the causal rule; 0 when none. */
SDPA_INLINE int64_t fc_visible_keys(const sdpa_args *a, int64_t i, int64_t j0, int64_t nk) {
  int64_t l = nk;
  if (a->is_causal && a->start_pos + i + 1 - j0 < l) l = a->start_pos + i + 1 - j0;
  return l < 0 ? 0 : l;
}

/* The plan of a call (flash_plan.c): block sizes, tasks, paths, scratch layout. */
FC_HIDDEN void flash_setup(flash_ctx *c, const sdpa_args *a, const flash_cfg *cfg);
/* A thread's buffers in its scratch at base, as c->layout lays them out (pf: NULL). */
FC_HIDDEN thread_bufs flash_scratch_bufs(const flash_ctx *c, float *base);

/* Keys [j0, j1) of kv head hk for every row of the task (tb: that head's slice),
 * on the fast path (flash_fast.c) or the generic one (flash_generic.c). */
FC_HIDDEN void flash_fast_block(flash_ctx *c, thread_bufs *tb, int64_t b, int64_t hk, int64_t q0,
                                int64_t qbr, int64_t j0, int64_t j1, int mask_is_zero);
FC_HIDDEN void flash_generic_block(flash_ctx *c, thread_bufs *tb, int64_t b, int64_t hk,
                                   int64_t q0, int64_t qbr, int64_t j0, int64_t j1,
                                   int mask_is_zero);

#endif
