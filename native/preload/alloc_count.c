/* Heap allocation counter, LD_PRELOAD'ed into the worker in which `probe bench`
 * counts each party's allocations per call (sdpa_probe/alloc_count.py).
 *
 * Why a preload: our own kernels allocate through sdpa_probe_malloc, which
 * counts, but a user's kernel, torch and ExecuTorch call malloc / new directly.
 * ExecuTorch PR 15610's quantized SDPA, allocating a dequantisation buffer per
 * block, has a cost that timings on a noisy machine blur and a count does not.
 *
 * Every allocation entry point of the C library is defined here and forwards to
 * glibc's own (__libc_*), so the whole process allocates through one counted
 * path: C++ operator new calls malloc through the PLT, and glibc's internal
 * callers (strdup, fopen, ...) do too. Counting is process-wide, every thread,
 * relaxed atomics: the worker reads the counters around calls of one party.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t count, size_t n);
extern void *__libc_realloc(void *p, size_t n);
extern void *__libc_memalign(size_t align, size_t n);
extern void *__libc_valloc(size_t n);
extern void *__libc_pvalloc(size_t n);
extern void __libc_free(void *p);

static atomic_llong n_allocs, n_bytes, n_frees, n_threads;

static inline void counted(size_t bytes) {
  atomic_fetch_add_explicit(&n_allocs, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&n_bytes, (long long)bytes, memory_order_relaxed);
}

#define EXPORT __attribute__((visibility("default")))

EXPORT void *malloc(size_t n) {
  counted(n);
  return __libc_malloc(n);
}

EXPORT void *calloc(size_t count, size_t n) {
  size_t total;
  counted(__builtin_mul_overflow(count, n, &total) ? SIZE_MAX : total);
  return __libc_calloc(count, n);
}

EXPORT void *realloc(void *p, size_t n) {
  if (n || !p) /* realloc(p, 0) frees: not an allocation */
    counted(n);
  else
    atomic_fetch_add_explicit(&n_frees, 1, memory_order_relaxed);
  return __libc_realloc(p, n);
}

EXPORT void *reallocarray(void *p, size_t count, size_t n) {
  size_t total;
  if (__builtin_mul_overflow(count, n, &total)) {
    errno = ENOMEM;
    return NULL;
  }
  return realloc(p, total);
}

EXPORT void free(void *p) {
  if (p) atomic_fetch_add_explicit(&n_frees, 1, memory_order_relaxed);
  __libc_free(p);
}

EXPORT void *memalign(size_t align, size_t n) {
  counted(n);
  return __libc_memalign(align, n);
}

EXPORT void *aligned_alloc(size_t align, size_t n) {
  counted(n);
  return __libc_memalign(align, n);
}

EXPORT int posix_memalign(void **out, size_t align, size_t n) {
  if (align == 0 || (align & (align - 1)) || align % sizeof(void *)) return EINVAL;
  counted(n);
  void *p = __libc_memalign(align, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}

EXPORT void *valloc(size_t n) {
  counted(n);
  return __libc_valloc(n);
}

EXPORT void *pvalloc(size_t n) {
  counted(n);
  return __libc_pvalloc(n);
}

/* Threads started, by any library (std::thread, OpenMP and pthreadpool all come here):
 * a kernel that starts its workers on every call pays for it every call, as one that
 * allocates per block does (older llama.cpp started a graph's threads per compute). */
typedef int (*pthread_create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
EXPORT int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *),
                          void *arg) {
  static _Atomic(pthread_create_fn) real;
  pthread_create_fn f = atomic_load_explicit(&real, memory_order_acquire);
  if (f == NULL) {
    f = (pthread_create_fn)dlsym(RTLD_NEXT, "pthread_create");
    if (f == NULL) return EAGAIN;
    atomic_store_explicit(&real, f, memory_order_release);
  }
  const int r = f(t, attr, fn, arg);
  if (r == 0) atomic_fetch_add_explicit(&n_threads, 1, memory_order_relaxed);
  return r;
}

/* Read by sdpa_probe_process_alloc_stats (runtime.c) through a weak reference:
 * allocations, bytes asked for, frees and threads started since the process started. */
EXPORT void sdpa_probe_preload_alloc_stats(int64_t *allocs, int64_t *bytes, int64_t *frees,
                                           int64_t *threads) {
  *allocs = atomic_load_explicit(&n_allocs, memory_order_relaxed);
  *bytes = atomic_load_explicit(&n_bytes, memory_order_relaxed);
  *frees = atomic_load_explicit(&n_frees, memory_order_relaxed);
  *threads = atomic_load_explicit(&n_threads, memory_order_relaxed);
}
