"""The text of a saved case's C driver and Makefile: the driver reads the case's raw
inputs as the kernel was given them (same dtypes, strides and offsets), calls
sdpa_forward once and compares with the saved float64 reference at the case's
tolerance; the Makefile builds it with AddressSanitizer and UBSan against your kernel."""

DRIVER_C = r"""/* Runs one sdpa_probe case against your sdpa_forward, outside Python.
 *
 *   make               build with -fsanitize=address,undefined -g and run
 *   make driver        build only (then: gdb ./driver)
 *
 * The inputs are the bytes the kernel read in `probe check` (case.h says where each
 * tensor's elements lie in its .bin file), each in a buffer of exactly that many bytes,
 * so that AddressSanitizer reports a read past a tensor. The output is pre-filled with
 * the check's poison pattern: an element left unwritten shows. Exit status 0: within
 * the case's tolerance; 1: not (or sdpa_forward did not return SDPA_OK); 2: the saved
 * files could not be read. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdpa_probe.h"

typedef struct saved_tensor {
  const char *file;          /* raw elements, `n` of them, element (0,0,0,0) at `offset` */
  int32_t dtype;             /* enum sdpa_dtype */
  int64_t elem_size, n, offset, stride[4];
  const char *scale_file;    /* SDPA_I8: per-token scales, and zero points (or NULL) */
  int64_t scale_n, scale_offset;
  const char *zero_point_file;
  int64_t qstride[3];
} saved_tensor;

#include "case.h"

/* every buffer, freed before exit: LeakSanitizer then reports only the kernel's leaks */
static void *owned[16];
static int n_owned;

static void *owned_alloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (p && n_owned < 16) owned[n_owned++] = p;
  return p;
}

static int finish(int status) {
  while (n_owned) free(owned[--n_owned]);
  return status;
}

static void *read_exactly(const char *name, size_t bytes) {
  void *p = owned_alloc(bytes);
  FILE *f = fopen(name, "rb");
  if (!p || !f || fread(p, 1, bytes, f) != bytes) {
    fprintf(stderr, "driver: cannot read %zu bytes from %s\n", bytes, name);
    exit(2);
  }
  fclose(f);
  return p;
}

static void load(const saved_tensor *s, sdpa_tensor *t) {
  char *base = read_exactly(s->file, (size_t)(s->n * s->elem_size));
  t->data = base + s->offset * s->elem_size;
  t->dtype = s->dtype;
  memcpy(t->stride, s->stride, sizeof t->stride);
  if (s->scale_file) {
    const float *sc = read_exactly(s->scale_file, (size_t)s->scale_n * sizeof(float));
    t->scale = sc + s->scale_offset;
    if (s->zero_point_file) {
      const int8_t *zp = read_exactly(s->zero_point_file, (size_t)s->scale_n);
      t->zero_point = zp + s->scale_offset;
    }
    memcpy(t->qstride, s->qstride, sizeof t->qstride);
  }
}

static double half_to_double(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
  return (h & 0x8000) ? -v : v;
}

static double out_value(const sdpa_tensor *t, int64_t off, int *unwritten) {
  if (t->dtype == SDPA_F32) {
    uint32_t u;
    memcpy(&u, (const float *)t->data + off, 4);
    *unwritten = u == OUT_POISON;
    return ((const float *)t->data)[off];
  }
  uint16_t h = ((const uint16_t *)t->data)[off];
  *unwritten = h == OUT_POISON;
  if (t->dtype == SDPA_F16) return half_to_double(h);
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

int main(void) {
  if (CASE_NOTE[0]) fprintf(stderr, "driver: %s\n", CASE_NOTE);
  sdpa_args a;
  memset(&a, 0, sizeof a);
  a.abi_version = SDPA_ABI_VERSION;
  a.batch = B; a.n_heads = H; a.n_kv_heads = HKV; a.q_len = LQ; a.kv_len = LKV; a.head_dim = D;
  load(&SAVED_Q, &a.q);
  if (LKV > 0) {
    load(&SAVED_K, &a.k);
    load(&SAVED_V, &a.v);
  } else {
    a.k.dtype = SAVED_K.dtype;
    a.v.dtype = SAVED_V.dtype;
  }
  size_t out_bytes = (size_t)(OUT_N * OUT_ELEM_SIZE);
  char *out = owned_alloc(out_bytes);
  for (int64_t e = 0; e < OUT_N; e++) {
    if (OUT_ELEM_SIZE == 4) ((uint32_t *)out)[e] = OUT_POISON;
    else ((uint16_t *)out)[e] = (uint16_t)OUT_POISON;
  }
  a.out.data = out + OUT_OFFSET * OUT_ELEM_SIZE;
  a.out.dtype = OUT_DTYPE;
  memcpy(a.out.stride, OUT_STRIDE, sizeof a.out.stride);
  if (HAS_MASK) {
    const float *m = read_exactly("mask.bin", (size_t)MASK_N * sizeof(float));
    a.mask = m + MASK_OFFSET;
    a.mask_row_stride = MASK_ROW_STRIDE;
  }
  a.is_causal = IS_CAUSAL;
  a.start_pos = START_POS;
  a.scale = SCALE;
  a.n_threads = N_THREADS;

  int status = sdpa_forward(&a);
  if (status != SDPA_OK) {
    printf("FAIL %s: sdpa_forward returned %d (%s)\n", CASE_ID, status,
           status == SDPA_UNSUPPORTED ? "SDPA_UNSUPPORTED" : "SDPA_INVALID");
    return finish(1);
  }
  const int64_t n = B * LQ * H * D;
  const double *ref = read_exactly("reference.bin", (size_t)n * sizeof(double));
  int64_t bad = 0, unwritten = 0, worst = -1;
  double max_err = 0.0, worst_excess = -INFINITY;
  for (int64_t e = 0; e < n; e++) {
    int64_t d = e % D, h = e / D % H, i = e / D / H % LQ, b = e / D / H / LQ;
    int64_t off = b * OUT_STRIDE[0] + i * OUT_STRIDE[1] + h * OUT_STRIDE[2] + d * OUT_STRIDE[3];
    int poison;
    double o = out_value(&a.out, off, &poison), r = ref[e];
    unwritten += poison;
    double err = fabs(o - r), excess;
    if (isfinite(o) != isfinite(r)) excess = INFINITY; /* NaN / Inf where the other is not */
    else if (!isfinite(r)) excess = -INFINITY;
    else {
      excess = err - (ATOL + RTOL * fabs(r));
      if (err > max_err) max_err = err;
    }
    if (excess > 0) bad++;
    if (excess > worst_excess) { worst_excess = excess; worst = e; }
  }
  if (!bad) {
    printf("PASS %s: max |err| %.3g (tolerance %.2g + %.2g*|ref|)\n", CASE_ID, max_err, ATOL,
           RTOL);
    return finish(0);
  }
  int64_t d = worst % D, h = worst / D % H, i = worst / D / H % LQ, b = worst / D / H / LQ;
  int64_t off = b * OUT_STRIDE[0] + i * OUT_STRIDE[1] + h * OUT_STRIDE[2] + d * OUT_STRIDE[3];
  int poison;
  printf("FAIL %s: %lld of %lld elements outside tolerance %.2g + %.2g*|ref|; max |err| %.3g; "
         "worst at b=%lld q=%lld h=%lld d=%lld (out %.6g, ref %.6g)", CASE_ID, (long long)bad,
         (long long)n, ATOL, RTOL, max_err, (long long)b, (long long)i, (long long)h,
         (long long)d, out_value(&a.out, off, &poison), ref[worst]);
  if (unwritten) printf("; %lld elements never written", (long long)unwritten);
  printf("\n");
  return finish(1);
}
"""

MAKEFILE = """# Builds driver.c against your kernel with AddressSanitizer and UBSan; runs the case.
#   make                      build and run (exit status 1: the case fails)
#   make KERNEL=other.c       against another source of sdpa_forward
#   make driver; gdb ./driver
KERNEL ?= {kernel}
SAN ?= -fsanitize=address,undefined -fno-omit-frame-pointer
OPT ?= -O1 -g
ARCH ?= -march=native
FLAGS = $(OPT) $(ARCH) $(SAN) -pthread -I. -I$(dir $(KERNEL))
LDLIBS = -lm

ifeq ($(strip $(KERNEL)),)
$(error set KERNEL to the source (.c, .cpp) or library (.so) of your sdpa_forward: make KERNEL=path)
endif

ifneq ($(filter %.so,$(KERNEL)),)
KOBJ =
LINK = $(CC)
LDLIBS += $(abspath $(KERNEL)) -Wl,-rpath,$(dir $(abspath $(KERNEL)))
else ifneq ($(filter %.cpp %.cc %.cxx,$(KERNEL)),)
KOBJ = kernel.o
LINK = $(CXX)
KCOMPILE = $(CXX) $(FLAGS)
else
KOBJ = kernel.o
LINK = $(CC)
KCOMPILE = $(CC) -std=c11 $(FLAGS)
endif

run: driver
\t./driver

driver: driver.o $(KOBJ)
\t$(LINK) $(FLAGS) driver.o $(KOBJ) -o driver $(LDLIBS)

driver.o: driver.c case.h sdpa_probe.h
\t$(CC) $(FLAGS) -c driver.c -o driver.o

kernel.o: $(KERNEL) sdpa_probe.h
\t$(KCOMPILE) -c $(KERNEL) -o kernel.o

clean:
\trm -f driver driver.o kernel.o

.PHONY: run clean
"""
