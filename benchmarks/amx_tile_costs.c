/* What the AMX tile unit costs on this core, in core cycles: the figures that
 * decide whether a decode block's P.V or Q.K^T can move onto the tiles
 * (docs/performance.md, "Considered at stop 36"). One thread; every operand in
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
#include <time.h>
#include <unistd.h>

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

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The core clock: a dependent chain of imul, 3 cycles each on x86 cores. */
static double clock_hz(void) {
  uint64_t x = 12345;
  const long n = 30000000;
  const double t0 = now();
  for (long i = 0; i < n; i++) __asm__ volatile("imul %0, %0" : "+r"(x));
  return 3.0 * (double)n / (now() - t0);
}

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
      double t0 = now();
      for (long i = 0; i < n; i++) { /* four independent accumulators */
        _tile_dpbusd(0, 4, 5);
        _tile_dpbusd(1, 4, 5);
        _tile_dpbusd(2, 4, 5);
        _tile_dpbusd(3, 4, 5);
      }
      dp[run] = (now() - t0) * hz / (4.0 * n);
      t0 = now();
      for (long i = 0; i < n; i++) { /* the BF16 product, on the same tiles' bytes */
        _tile_dpbf16ps(0, 4, 5);
        _tile_dpbf16ps(1, 4, 5);
        _tile_dpbf16ps(2, 4, 5);
        _tile_dpbf16ps(3, 4, 5);
      }
      bf[run] = (now() - t0) * hz / (4.0 * n);
      t0 = now();
      for (long i = 0; i < n; i++) {
        _tile_stored(0, C[0], 64);
        _tile_stored(1, C[1], 64);
        _tile_stored(2, C[2], 64);
        _tile_stored(3, C[3], 64);
      }
      st[run] = (now() - t0) * hz / (4.0 * n);
      t0 = now();
      for (long i = 0; i < n; i++) {
        _tile_loadd(5, B, 64);
        _tile_loadd(6, B + 1024, 64);
        _tile_loadd(7, B + 2048, 64);
        _tile_loadd(4, A, 64);
      }
      ld[run] = (now() - t0) * hz / (4.0 * n);
    }
    for (int i = 0; i < 5; i++) /* (sort for the median) */
      for (int j = i + 1; j < 5; j++) {
        double t;
        if (dp[j] < dp[i]) t = dp[i], dp[i] = dp[j], dp[j] = t;
        if (bf[j] < bf[i]) t = bf[i], bf[i] = bf[j], bf[j] = t;
        if (st[j] < st[i]) t = st[i], st[i] = st[j], st[j] = t;
        if (ld[j] < ld[i]) t = ld[i], ld[i] = ld[j], ld[j] = t;
      }
    printf("A %2d x %2d B, %2d x 64 B, C %2d x 16: tdpbusd %5.1f  tdpbf16ps %5.1f  tilestored C %5.1f  tileloadd %5.1f"
           "  (tdpbusd: %.0f multiply-adds a cycle)\n",
           ar, ac, br, cr, dp[2], bf[2], st[2], ld[2], (double)cr * 16 * ac / dp[2]);
  }
  _tile_release();
  return C[0][0] == 12345; /* (keeps the stores) */
}
