/* What the AMX tile unit costs on this core, in core cycles: the figures that
 * decide whether a decode block's P.V or Q.K^T can move onto the tiles
 * (docs/history.md, "2026-12-06: the AMX tiles"). One thread; every operand in
 * L1. A measurement, not a test.
 *
 *   cc -O2 -march=native benchmarks/amx_tile_costs.c -o /tmp/amx && /tmp/amx
 *
 * Needs AMX-INT8, AMX-BF16 and a kernel that grants the tile data state (Linux 5.16+,
 * arch_prctl ARCH_REQ_XCOMP_PERM); prints one line per tile shape. */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core_clock.h"

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tile_cfg;

static uint8_t A[16 * 64] __attribute__((aligned(64)));
static uint8_t B[4 * 1024] __attribute__((aligned(64)));
static int32_t C[4][256] __attribute__((aligned(64)));

/* tiles 0-3: C (crows x 16 int32); 4: A (arows x acolsb bytes); 5-7: B (brows x 64) */
static void configure(int arows, int acolsb, int brows, int crows) {
  tile_cfg c;
  memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int i = 0; i < 4; i++) c.colsb[i] = 64, c.rows[i] = (uint8_t)crows;
  c.colsb[4] = (uint16_t)acolsb, c.rows[4] = (uint8_t)arows;
  for (int i = 5; i < 8; i++) c.colsb[i] = 64, c.rows[i] = (uint8_t)brows;
  _tile_loadconfig(&c);
}

static double median5(double *x) { /* (sorts x) */
  for (int i = 0; i < 5; i++)
    for (int j = i + 1; j < 5; j++)
      if (x[j] < x[i]) {
        const double t = x[i];
        x[i] = x[j], x[j] = t;
      }
  return x[2];
}

/* OP(0) .. OP(3), n times: cycles per instruction into OUT (n and hz in scope) */
#define TIMED(OUT, OP)                                         \
  do {                                                         \
    const double t0_ = now();                                  \
    for (long i = 0; i < n; i++) {                             \
      OP(0);                                                   \
      OP(1);                                                   \
      OP(2);                                                   \
      OP(3);                                                   \
    }                                                          \
    (OUT) = (now() - t0_) * hz / (4.0 * n);                    \
  } while (0)
#define DPBUSD(c) _tile_dpbusd(c, 4, 5)
#define DPBF16(c) _tile_dpbf16ps(c, 4, 5)
#define STORE_C(c) _tile_stored(c, C[c], 64)
#define LOAD(c) LOAD_##c /* (a tile's number is a literal in the instruction) */
#define LOAD_0 _tile_loadd(5, B, 64)
#define LOAD_1 _tile_loadd(6, B + 1024, 64)
#define LOAD_2 _tile_loadd(7, B + 2048, 64)
#define LOAD_3 _tile_loadd(4, A, 64)

int main(void) {
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) {
    fprintf(stderr, "the kernel did not grant the AMX tile state\n");
    return 1;
  }
  const double hz = clock_hz();
  const long n = 200000;
  static const int shapes[][4] = {{16, 64, 16, 16}, {4, 64, 16, 4}, {16, 32, 8, 16}};
  printf("core %.2f GHz; core cycles per instruction, median of 5 runs of %ld\n", hz / 1e9, n);
  for (int s = 0; s < 3; s++) {
    const int ar = shapes[s][0], ac = shapes[s][1], br = shapes[s][2], cr = shapes[s][3];
    double dp[5], st[5], ld[5], bf[5];
    configure(ar, ac, br, cr);
    _tile_loadd(4, A, 64);
    _tile_loadd(5, B, 64);
    for (int run = 0; run < 5; run++) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      TIMED(dp[run], DPBUSD); /* four independent accumulators */
      TIMED(bf[run], DPBF16); /* the BF16 product, on the same tiles' bytes */
      TIMED(st[run], STORE_C);
      TIMED(ld[run], LOAD);
    }
    const double mdp = median5(dp);
    printf("A %2d x %2d B, %2d x 64 B, C %2d x 16: tdpbusd %5.1f  tdpbf16ps %5.1f  tilestored C %5.1f  tileloadd %5.1f"
           "  (tdpbusd: %.0f multiply-adds a cycle)\n",
           ar, ac, br, cr, mdp, median5(bf), median5(st), median5(ld), (double)cr * 16 * ac / mdp);
  }
  _tile_release();
  return C[0][0] == 12345; /* (keeps the stores) */
}
