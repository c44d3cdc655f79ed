/* The calling thread's floating-point control state, read and put back: shared by the
 * library (sdpa_probe_fp_control) and the native worker another CPU runs. x86: MXCSR
 * without its sticky exception flags (bits 0-5, set by ordinary arithmetic) in the
 * low half, the x87 control word above; AArch64: FPCR; elsewhere the C rounding mode. */
#ifndef SDPA_PROBE_FP_ENV_H
#define SDPA_PROBE_FP_ENV_H

#include <fenv.h>
#include <stdint.h>

static inline int64_t fp_env_read(void) {
#if defined(__x86_64__) || defined(__i386__)
  uint32_t csr;
  uint16_t cw;
  __asm__ volatile("stmxcsr %0" : "=m"(csr));
  __asm__ volatile("fnstcw %0" : "=m"(cw));
  return ((int64_t)cw << 32) | (int64_t)(csr & ~0x3Fu);
#elif defined(__aarch64__)
  uint64_t fpcr;
  __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
  return (int64_t)fpcr;
#else
  return (int64_t)fegetround();
#endif
}

/* Puts back a state fp_env_read returned (the sticky flags as they are). */
static inline void fp_env_write(int64_t v) {
#if defined(__x86_64__) || defined(__i386__)
  uint32_t csr;
  uint16_t cw = (uint16_t)(v >> 32);
  __asm__ volatile("stmxcsr %0" : "=m"(csr));
  csr = (csr & 0x3Fu) | ((uint32_t)v & ~0x3Fu);
  __asm__ volatile("ldmxcsr %0" : : "m"(csr));
  __asm__ volatile("fldcw %0" : : "m"(cw));
#elif defined(__aarch64__)
  uint64_t fpcr = (uint64_t)v;
  __asm__ volatile("msr fpcr, %0" : : "r"(fpcr));
#else
  fesetround((int)v);
#endif
}

#endif
