/* flash_core's AVX-512 block path for decode tasks: one key block for every
 * kv head of the task, read in memory order. Built when the compiler targets
 * AVX-512 (F, BW, DQ, VL); flash_x512_available() says whether this build has
 * it.
 *
 * Rows: a task's rows are f = h * R + r for kv head h (of nh) and row r (of R
 * per head: query head g of the group, query row i: r = g * qbr + i). R
 * divides 16, so a 16-lane vector holds the rows of 16 / R whole heads. */
#ifndef SDPA_PROBE_FLASH_X512_H
#define SDPA_PROBE_FLASH_X512_H

#include "common.h"

#define FLASH_X512_KV_BLOCK 32 /* keys per block (X512_KV_BLOCK in sdpa_probe/cases/kernel_blocks.py) */

/* Cross prefetches (a block's V rows while its scores run, the next block's K
 * rows while P.V runs) go to L2 rather than L1 when a block's K rows take 32 KiB
 * or more (two thirds of a 48 KiB L1d, beside the lines in use) and the task's K
 * and V are more than an L2 holds (so that they stream from L3 or DRAM): to L2,
 * more misses are in flight (the L2's queue, not the L1's fill buffers). On the
 * Xeon (2 MiB L2): (16, 16, 128) kv 8192 (64-256 KiB blocks) 14-20 % faster
 * cold and 4-23 % faster warm for F16, F32 and int8; (32, 8, 64) kv 8192 F32
 * (64 KiB) 16 % faster cold, F16 (32 KiB) 10 % cold, 3 % warm; at kv 512
 * (L2-resident) to L2 was 7 % slower, and int8 (32, 8, 64) (16 KiB blocks)
 * 0-3 % slower. (To L1 had measured 2-3 % ahead of L2 on Zen 5 at (32, 8, 64).) */
#define FLASH_X512_PF_L2(block_bytes, task_bytes) ((block_bytes) >= (32 << 10) && (task_bytes) > (2 << 20))

typedef struct flash_x512_block {
  int64_t nh, R, qbr; /* kv heads, rows per head (1, 2, 4, 8 or 16), query rows */
  int64_t D;          /* head_dim, a multiple of 16 */
  int64_t n;          /* keys in the block (<= FLASH_X512_KV_BLOCK) */
  int kdt, vdt;       /* K / V storage dtypes */
  int iqk;            /* int8 Q and K: integer Q.K^T */
  const void *Qp;     /* Q packed by flash_x512_pack_q (pre-scaled F32, or int8 Q's layouts) */
  const float *qf;    /* iqk, [nh * R]: scale * q_scale per row */
  const float *qs;    /* iqk, [nh * R]: sum(q - zq) per row */
  const char *K, *V;  /* the block's first key of head 0 */
  int64_t ks1, ks2;   /* K bytes: next key, next head */
  int64_t vs1, vs2;   /* V bytes: next key, next head */
  const float *ksc, *vsc; /* I8: per-key scales, key j's heads at j * kq1 (vq1) on */
  const int8_t *kz, *vz;  /* I8: per-key zero points, laid out as the scales */
  int64_t kq1, vq1;       /* I8: scale / zero point elements from one key to the next */
  const int64_t *lim;     /* [qbr]: query row i sees keys [0, lim[i]) of the block */
  const float *mask;      /* [n][16]: query row i's additive mask of key j at j * 16 + i, or NULL */
  float *acc, *m, *l;     /* [nh * R][D], [nh * R], [nh * R]: running output, max, sum */
  float *S;               /* scratch, flash_x512_scratch_floats */
  int64_t pf_bytes;       /* bytes of a position's K (= V) rows when they are dense; 0: no prefetch */
  int pf_l2;              /* the cross prefetches to L2 (prefetcht1), not L1: FLASH_X512_PF_L2 */
  const char *next_k;     /* the next block's first K row */
  int64_t next_n;         /* keys of the next block (0: none) */
} flash_x512_block;

int flash_x512_available(void);
/* Scratch floats of a block (S and the rows' rescale factors). */
int64_t flash_x512_scratch_floats(int64_t nh, int64_t R, int64_t kv_block);
/* Floats of the packed Q of nh * R rows. */
int64_t flash_x512_packed_q_floats(int64_t nh, int64_t R, int64_t D);
/* Packs the nh * R rows of Q for the block path: row r of head h at element
 * h * head_stride + r * D of Q, F32, or (q - zq) as int16 when qz is given,
 * which is the integer Q.K^T of int8 Q (qz, qs: zq and sum(q - zq) per row). */
void flash_x512_pack_q(const void *Q, int64_t nh, int64_t R, int64_t D, int64_t head_stride,
                       const float *qz, const float *qs, void *Qp);
/* Runs the block (a no-op in a build without AVX-512). */
void flash_x512_run(const flash_x512_block *b);

/* The prefill tile's products, 16 lanes (flash_x512_panel.c; no-ops without
 * AVX-512): flash_core's panel scores of nr (1, 2 or 4) rows against a
 * transposed K block (keys [0, n) rounded up to 16 written), and its P.V into
 * the rows' accumulators from F32 V rows vs bytes apart; head_dim a multiple of 16. */
int flash_x512_panel_available(void);
void flash_x512_scores_panel(int64_t nr, const float *Q, int64_t D, const float *KT, int64_t kts,
                             int64_t n, float *S, int64_t sst);
void flash_x512_pv_f32(int64_t nr, float *acc, int64_t D, const char *V, int64_t vs, int64_t n,
                       const float *P, int64_t pst);
/* ... and its online-softmax update of the tile's rows (flash_core's fc_softmax_tile)
 * over keys [0, n16), n16 a multiple of 16, scores past a row's keys -inf. */
void flash_x512_softmax_tile(int64_t nr, float *S, int64_t sst, int64_t n16, float *m, float *l,
                             float *alpha);
/* ... and its K block transposed, 16 keys (m of them real, the rest zero) from K
 * (ks bytes apart; int8: zero points kz, scales ksc) into KT[d][k] (kts floats a dim). */
void flash_x512_pack_kt16(int dt, const char *K, int64_t ks, const int32_t *kz, const float *ksc,
                          int64_t m, int64_t D, float *KT, int64_t kts);

#endif
