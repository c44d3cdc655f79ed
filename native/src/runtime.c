/* Runtime shared by the built-in kernels: counted allocation, a persistent
 * thread pool, exact power-of-two alignment. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "common.h"

/* ---- alignment -------------------------------------------------------- */

int64_t sdpa_probe_align_up(int64_t x, int64_t a) {
  if (a <= 0 || (a & (a - 1)) != 0 || x < 0) return -1;
  if (x > INT64_MAX - (a - 1)) return -1;
  /* ~(a - 1) == -a for a power of two; -(a - 1) would keep bit 0 (seed 000). */
  return (x + a - 1) & ~(a - 1);
}

/* ---- counted allocation ---------------------------------------------- */

static _Atomic int64_t g_alloc_count, g_alloc_bytes;

void *sdpa_probe_malloc(int64_t bytes) {
  if (bytes <= 0) bytes = 1;
  atomic_fetch_add_explicit(&g_alloc_count, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&g_alloc_bytes, bytes, memory_order_relaxed);
  void *p = NULL;
  size_t sz = (size_t)sdpa_probe_align_up(bytes, 64);
  if (posix_memalign(&p, 64, sz) != 0) return NULL;
  return p;
}

void sdpa_probe_free(void *p) { free(p); }

void sdpa_probe_alloc_stats(int64_t *count, int64_t *bytes) {
  if (count) *count = atomic_load(&g_alloc_count);
  if (bytes) *bytes = atomic_load(&g_alloc_bytes);
}

void sdpa_probe_alloc_reset(void) {
  atomic_store(&g_alloc_count, 0);
  atomic_store(&g_alloc_bytes, 0);
}

int sdpa_probe_default_threads(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 1) n = 1;
  if (n > SDPA_PROBE_MAX_THREADS) n = SDPA_PROBE_MAX_THREADS;
  return (int)n;
}

/* ---- thread pool ------------------------------------------------------
 * Workers spin briefly on a generation counter, then sleep on a condition
 * variable. Tasks are handed out by an atomic counter. The calling thread
 * works too. A pool inherited through fork() is rebuilt in the child. */

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_mutex_t call_mu; /* one parallel_for at a time */
  int n_workers;
  pthread_t th[SDPA_PROBE_MAX_THREADS];
  _Atomic uint64_t gen;
  sdpa_probe_task_fn fn;
  void *ctx;
  int64_t n_tasks;
  int n_active;
  _Atomic int64_t next;
  _Atomic int done;
  pid_t pid;
} pool_t;

static pool_t g_pool;
static pthread_mutex_t g_pool_init_mu = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int t_in_pool;

static void run_tasks(sdpa_probe_task_fn fn, void *ctx, int64_t n_tasks, _Atomic int64_t *next,
                      int thread) {
  for (;;) {
    int64_t t = atomic_fetch_add_explicit(next, 1, memory_order_relaxed);
    if (t >= n_tasks) break;
    fn(ctx, t, thread);
  }
}

static void *worker_main(void *arg) {
  int id = (int)(intptr_t)arg;
  uint64_t seen = 0;
  t_in_pool = 1;
  for (;;) {
    int spins = 0;
    while (atomic_load_explicit(&g_pool.gen, memory_order_acquire) == seen) {
      if (++spins < 20000) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
        continue;
      }
      pthread_mutex_lock(&g_pool.mu);
      while (atomic_load(&g_pool.gen) == seen) pthread_cond_wait(&g_pool.cv, &g_pool.mu);
      pthread_mutex_unlock(&g_pool.mu);
    }
    pthread_mutex_lock(&g_pool.mu);
    seen = atomic_load(&g_pool.gen);
    sdpa_probe_task_fn fn = g_pool.fn;
    void *ctx = g_pool.ctx;
    int64_t n_tasks = g_pool.n_tasks;
    int active = id < g_pool.n_active;
    pthread_mutex_unlock(&g_pool.mu);
    if (active) {
      run_tasks(fn, ctx, n_tasks, &g_pool.next, id);
      atomic_fetch_add_explicit(&g_pool.done, 1, memory_order_acq_rel);
    }
  }
  return NULL;
}

static void pool_reset_locked(void) {
  pthread_mutex_init(&g_pool.mu, NULL);
  pthread_cond_init(&g_pool.cv, NULL);
  pthread_mutex_init(&g_pool.call_mu, NULL);
  g_pool.n_workers = 0;
  atomic_store(&g_pool.gen, 0);
  g_pool.pid = getpid();
}

/* Ensures at least `want` workers (ids 1..want); returns how many exist. */
static int pool_ensure(int want) {
  pthread_mutex_lock(&g_pool_init_mu);
  if (g_pool.pid != getpid()) pool_reset_locked();
  while (g_pool.n_workers < want && g_pool.n_workers < SDPA_PROBE_MAX_THREADS - 1) {
    int id = g_pool.n_workers + 1;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&g_pool.th[id], &attr, worker_main, (void *)(intptr_t)id);
    pthread_attr_destroy(&attr);
    if (rc != 0) break;
    g_pool.n_workers++;
  }
  int have = g_pool.n_workers;
  pthread_mutex_unlock(&g_pool_init_mu);
  return have;
}

void sdpa_probe_parallel_for(int n_threads, int64_t n_tasks, sdpa_probe_task_fn fn, void *ctx) {
  if (n_tasks <= 0) return;
  if (n_threads > n_tasks) n_threads = (int)n_tasks;
  if (n_threads <= 1 || t_in_pool) {
    for (int64_t t = 0; t < n_tasks; t++) fn(ctx, t, 0);
    return;
  }
  int workers = pool_ensure(n_threads - 1);
  if (workers < 1) {
    for (int64_t t = 0; t < n_tasks; t++) fn(ctx, t, 0);
    return;
  }
  if (n_threads - 1 > workers) n_threads = workers + 1;
  pthread_mutex_lock(&g_pool.call_mu);
  pthread_mutex_lock(&g_pool.mu);
  g_pool.fn = fn;
  g_pool.ctx = ctx;
  g_pool.n_tasks = n_tasks;
  g_pool.n_active = n_threads; /* worker ids 1..n_threads-1 take part */
  atomic_store(&g_pool.next, 0);
  atomic_store(&g_pool.done, 0);
  atomic_fetch_add_explicit(&g_pool.gen, 1, memory_order_release);
  pthread_cond_broadcast(&g_pool.cv);
  pthread_mutex_unlock(&g_pool.mu);

  t_in_pool = 1;
  run_tasks(fn, ctx, n_tasks, &g_pool.next, 0);
  t_in_pool = 0;
  int spins = 0;
  while (atomic_load_explicit(&g_pool.done, memory_order_acquire) < n_threads - 1) {
    if (++spins > 2000) sched_yield();
  }
  pthread_mutex_unlock(&g_pool.call_mu);
}
