/* One AVX-512 decode block (native/src/flash_x512_block.h) timed alone, one
 * thread, in cycles per (key, kv head): the block's own cost, without the rest
 * of a decode call (task split, Q packing, merge) and, with few distinct
 * blocks, without the memory system. benchmarks/block_cycles.py builds it once
 * per phase left out (FX_OMIT_SCORES, FX_OMIT_SOFTMAX, FX_OMIT_PV) and reads
 * where the cycles go.
 *
 *   block_cycles DTYPE ROWS KV_HEADS HEAD_DIM BLOCKS PF_L2 PREFETCH SECONDS
 *
 * DTYPE f32 | f16 | bf16 | i8 (float Q) | iq (int8 Q: the quant_int8 path);
 * ROWS query rows per kv head (1, 2, 4, 8, 16); BLOCKS distinct 32-key blocks
 * cycled through (1: one block stays in L1 / L2; enough of them stream from the
 * L3); PF_L2 the cross prefetches to L2 rather than L1; PREFETCH 0 turns them
 * off. Prints one JSON object. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core_clock.h"
#include "flash_x512.h"

static void *alloc(size_t bytes) {
  void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) {
    fprintf(stderr, "block_cycles: out of memory\n");
    exit(2);
  }
  return p;
}

int main(int argc, char **argv) {
  if (argc != 9) {
    fprintf(stderr, "usage: block_cycles DTYPE ROWS KV_HEADS HEAD_DIM BLOCKS PF_L2 PREFETCH SECONDS\n");
    return 2;
  }
  if (!flash_x512_available()) {
    fprintf(stderr, "block_cycles: this build has no AVX-512 block path\n");
    return 2;
  }
  const char *dt = argv[1];
  const int64_t R = atoll(argv[2]), nh = atoll(argv[3]), D = atoll(argv[4]), nblk = atoll(argv[5]);
  const int pf_l2 = atoi(argv[6]), prefetch = atoi(argv[7]);
  const double seconds = atof(argv[8]);
  const int iq = !strcmp(dt, "iq");
  const int kdt = !strcmp(dt, "f32") ? SDPA_F32 : !strcmp(dt, "f16") ? SDPA_F16
                  : !strcmp(dt, "bf16") ? SDPA_BF16 : (!strcmp(dt, "i8") || iq) ? SDPA_I8 : -1;
  if (kdt < 0 || (R != 1 && R != 2 && R != 4 && R != 8 && R != 16) || nh < 1 || D < 16 || D % 16 ||
      D > 256 || nblk < 1 || seconds <= 0) {
    fprintf(stderr, "block_cycles: bad arguments\n");
    return 2;
  }
  const int64_t n = FLASH_X512_KV_BLOCK, rows = nh * R, isz = sdpa_isz(kdt);
  const size_t blk = (size_t)(n * nh * D * isz);
  char *K = alloc(blk * (size_t)nblk), *V = alloc(blk * (size_t)nblk);
  srand(1);
  /* values of a few bits: no denormals, no overflow, NaN-free */
  for (size_t i = 0; i < blk * (size_t)nblk / (size_t)isz; i++) {
    const int a = rand() % 64 - 32, c = rand() % 64 - 32;
    if (kdt == SDPA_F32) ((float *)K)[i] = 0.01f * (float)a, ((float *)V)[i] = 0.01f * (float)c;
    else if (kdt == SDPA_F16) ((uint16_t *)K)[i] = (uint16_t)(0x2000 + (a & 0x3ff)), ((uint16_t *)V)[i] = (uint16_t)(0x2000 + (c & 0x3ff));
    else if (kdt == SDPA_BF16) ((uint16_t *)K)[i] = (uint16_t)(0x3c00 + (a & 0x7f)), ((uint16_t *)V)[i] = (uint16_t)(0x3c00 + (c & 0x7f));
    else ((int8_t *)K)[i] = (int8_t)a, ((int8_t *)V)[i] = (int8_t)c;
  }
  float *q = alloc((size_t)(rows * D) * 4), *qz = alloc((size_t)rows * 4), *qs = alloc((size_t)rows * 4),
        *qf = alloc((size_t)rows * 4);
  int16_t *qi = alloc((size_t)(rows * D) * 2);
  for (int64_t i = 0; i < rows * D; i++) q[i] = 0.001f * (float)(rand() % 100), qi[i] = (int16_t)(rand() % 50 - 25);
  for (int64_t i = 0; i < rows; i++) {
    int32_t s = 0;
    for (int64_t d = 0; d < D; d++) s += qi[i * D + d];
    qz[i] = 3.0f, qs[i] = (float)s, qf[i] = 0.01f;
  }
  void *Qp = alloc((size_t)flash_x512_packed_q_floats(nh, R, D) * 4);
  if (iq) flash_x512_pack_q(qi, nh, R, D, R * D, qz, qs, Qp);
  else flash_x512_pack_q(q, nh, R, D, R * D, NULL, NULL, Qp);
  float *ksc = alloc((size_t)(n * nh) * 4), *vsc = alloc((size_t)(n * nh) * 4);
  int8_t *kz = alloc((size_t)(n * nh)), *vz = alloc((size_t)(n * nh));
  for (int64_t i = 0; i < n * nh; i++) ksc[i] = 0.01f, vsc[i] = 0.02f, kz[i] = 3, vz[i] = -2;
  int64_t lim[16];
  for (int i = 0; i < 16; i++) lim[i] = n;
  float *acc = alloc((size_t)(rows * D) * 4), *m = alloc((size_t)rows * 4), *l = alloc((size_t)rows * 4);
  float *S = alloc((size_t)flash_x512_scratch_floats(nh, R, n) * 4);
  memset(S, 0, (size_t)flash_x512_scratch_floats(nh, R, n) * 4); /* read before written when a phase is left out */
  memset(acc, 0, (size_t)(rows * D) * 4);
  for (int64_t i = 0; i < rows; i++) m[i] = 0.0f, l[i] = 1.0f;
  flash_x512_block b;
  memset(&b, 0, sizeof b);
  b.nh = nh, b.R = R, b.qbr = 1, b.D = D, b.n = n, b.kdt = kdt, b.vdt = kdt, b.iqk = iq;
  b.Qp = Qp, b.qf = qf, b.qs = qs;
  b.ks1 = b.vs1 = nh * D * isz, b.ks2 = b.vs2 = D * isz;
  b.ksc = ksc, b.vsc = vsc, b.kz = kz, b.vz = vz, b.kq1 = b.vq1 = nh;
  b.lim = lim, b.acc = acc, b.m = m, b.l = l, b.S = S;
  b.pf_bytes = prefetch ? nh * D * isz : 0, b.pf_l2 = pf_l2, b.next_n = n;

  long calls = 0;
  double t = 0.0;
  for (int pass = 0; pass < 2; pass++) { /* a warm-up pass, then the timed one */
    const double budget = pass ? seconds : seconds / 5, start = now();
    calls = 0;
    do {
      for (int64_t k = 0; k < nblk; k++, calls++) {
        b.K = K + blk * (size_t)k, b.V = V + blk * (size_t)k;
        b.next_k = K + blk * (size_t)((k + 1) % nblk);
        flash_x512_run(&b);
      }
      t = now() - start;
    } while (t < budget);
  }
  const double hz = clock_hz(), pairs = (double)calls * (double)(n * nh);
  float sum = 0.0f; /* keep the results live */
  for (int64_t i = 0; i < rows * D; i++) sum += acc[i];
  printf("{\"dtype\": \"%s\", \"rows_per_head\": %lld, \"kv_heads\": %lld, \"head_dim\": %lld, "
         "\"blocks\": %lld, \"pf_l2\": %d, \"prefetch\": %d, \"calls\": %ld, \"ns_per_key_head\": %.4f, "
         "\"clock_ghz\": %.3f, \"cycles_per_key_head\": %.3f, \"checksum\": \"%g\"}\n",
         dt, (long long)R, (long long)nh, (long long)D, (long long)nblk, pf_l2, prefetch, calls,
         t / pairs * 1e9, hz * 1e-9, t / pairs * hz, (double)sum);
  return 0;
}
