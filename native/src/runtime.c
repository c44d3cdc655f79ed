/* Runtime shared by the built-in kernels: counted allocation, a persistent
 * thread pool, exact power-of-two alignment. */
#define _GNU_SOURCE
#if defined(__GLIBC__) || defined(__linux__)
#include <malloc.h>
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "common.h"
#include "fp_env.h"

/* ---- the caller's floating-point environment ------------------------------ */

/* A kernel that turns on flush-to-zero / denormals-are-zero or changes the rounding
 * mode for its own speed must restore them: the calling thread's later arithmetic
 * (the model around the kernel) would otherwise run in another number system
 * (fp_env.h says what the state holds). */
int64_t sdpa_probe_fp_control(void) { return fp_env_read(); }

/* Puts back a state sdpa_probe_fp_control returned (the sticky flags as they are). */
void sdpa_probe_fp_control_set(int64_t v) { fp_env_write(v); }

/* ---- the process's heap ----------------------------------------------- */

/* Bytes the C allocator has handed out and not taken back, over every arena and
 * mmap'd block (glibc's mallinfo2; -1 where there is no such count). A kernel that
 * leaks grows it on every call: a decode loop calls SDPA per layer per token. */
int64_t sdpa_probe_heap_in_use(void) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  struct mallinfo2 m = mallinfo2();
  return (int64_t)m.uordblks + (int64_t)m.hblkhd;
#else
  return -1;
#endif
}

int64_t sdpa_probe_program_break(void) {
#if defined(__linux__)
  void *brk_now = sbrk(0);
  return brk_now == (void *)-1 ? 0 : (int64_t)(intptr_t)brk_now;
#else
  return 0;
#endif
}

/* ---- alignment -------------------------------------------------------- */

int64_t sdpa_probe_align_up(int64_t x, int64_t a) {
  if (a <= 0 || (a & (a - 1)) != 0 || x < 0) return -1;
  if (x > INT64_MAX - (a - 1)) return -1;
  /* ~(a - 1) == -a for a power of two; -(a - 1) would keep bit 0 (ExecuTorch PR 15610's
   * align_up). */
  return (x + a - 1) & ~(a - 1);
}

/* ---- counted allocation ----------------------------------------------
 * The default path is posix_memalign + two relaxed counters. An opt-in guarded
 * mode (sdpa_probe_alloc_guard) lays every later allocation out as
 *   [64-byte head: size + front canary][body, filled with GUARD_FILL][tail canary]
 * and, on free, records how far the body was written (high-water mark, bytes
 * written) and whether either canary changed (a write past the end or before
 * the start). Reads are not seen: a byte counts as used when it was written. A
 * written byte that happens to equal GUARD_FILL is missed (it would have to be
 * 0xA5, exactly). The default path pays one relaxed load per malloc and free. */

#define GUARD_HEAD 64
#define GUARD_TAIL 256
#define GUARD_FILL 0xA5
#define GUARD_CANARY 0x5C
#define GUARD_MAGIC 0x5344504147554152LL /* "SDPAGUAR" */
#define GUARD_MAX_LIVE 4096
#define GUARD_MAX_RECORDS 8192

static _Atomic int64_t g_alloc_count, g_alloc_bytes;
static _Atomic int g_guard_on;
static _Atomic int64_t g_guard_live; /* live guarded blocks; 0 keeps free() on the plain path */
static pthread_mutex_t g_guard_mu = PTHREAD_MUTEX_INITIALIZER;
static void *g_guard_ptrs[GUARD_MAX_LIVE];
static sdpa_probe_alloc_record g_guard_rec[GUARD_MAX_RECORDS];
static int64_t g_guard_nrec, g_guard_seq;

static void *guard_malloc(int64_t bytes) {
  size_t total = (size_t)(GUARD_HEAD + sdpa_probe_align_up(bytes, 64) + GUARD_TAIL);
  void *base = NULL;
  if (posix_memalign(&base, 64, total) != 0) return NULL;
  unsigned char *b = (unsigned char *)base;
  memset(b, GUARD_CANARY, GUARD_HEAD);
  int64_t head[2] = {GUARD_MAGIC, bytes};
  memcpy(b, head, sizeof head);
  memset(b + GUARD_HEAD, GUARD_FILL, (size_t)bytes);
  memset(b + GUARD_HEAD + bytes, GUARD_CANARY, (size_t)GUARD_TAIL);
  void *p = b + GUARD_HEAD;
  pthread_mutex_lock(&g_guard_mu);
  int64_t slot = -1;
  for (int64_t i = 0; i < GUARD_MAX_LIVE; i++)
    if (g_guard_ptrs[i] == NULL) { slot = i; break; }
  if (slot >= 0) {
    g_guard_ptrs[slot] = p;
    atomic_fetch_add_explicit(&g_guard_live, 1, memory_order_relaxed);
  }
  pthread_mutex_unlock(&g_guard_mu);
  if (slot < 0) { /* table full: hand out an unguarded block */
    free(base);
    if (posix_memalign(&p, 64, (size_t)sdpa_probe_align_up(bytes, 64)) != 0) return NULL;
  }
  return p;
}

/* Returns 1 when p was a live guarded block (now checked, recorded and freed). */
static int guard_free(void *p) {
  pthread_mutex_lock(&g_guard_mu);
  int found = 0;
  for (int64_t i = 0; i < GUARD_MAX_LIVE; i++)
    if (g_guard_ptrs[i] == p) {
      g_guard_ptrs[i] = NULL;
      found = 1;
      break;
    }
  if (found) atomic_fetch_sub_explicit(&g_guard_live, 1, memory_order_relaxed);
  pthread_mutex_unlock(&g_guard_mu);
  if (!found) return 0;
  unsigned char *b = (unsigned char *)p - GUARD_HEAD;
  int64_t head[2];
  memcpy(head, b, sizeof head);
  sdpa_probe_alloc_record r = {0};
  r.bytes = head[1];
  const unsigned char *body = b + GUARD_HEAD;
  for (int64_t i = 0; i < r.bytes; i++)
    if (body[i] != GUARD_FILL) {
      r.touched++;
      r.high_water = i + 1;
    }
  for (int64_t i = (int64_t)sizeof head; i < GUARD_HEAD; i++) r.underrun += b[i] != GUARD_CANARY;
  if (head[0] != GUARD_MAGIC) r.underrun += (int64_t)sizeof head;
  for (int64_t i = 0; i < GUARD_TAIL; i++) r.overrun += body[r.bytes + i] != GUARD_CANARY;
  pthread_mutex_lock(&g_guard_mu);
  r.seq = g_guard_seq++;
  if (g_guard_nrec < GUARD_MAX_RECORDS) g_guard_rec[g_guard_nrec] = r;
  g_guard_nrec++;
  pthread_mutex_unlock(&g_guard_mu);
  free(b);
  return 1;
}

void *sdpa_probe_malloc(int64_t bytes) {
  if (bytes <= 0) bytes = 1;
  atomic_fetch_add_explicit(&g_alloc_count, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&g_alloc_bytes, bytes, memory_order_relaxed);
  if (atomic_load_explicit(&g_guard_on, memory_order_relaxed)) return guard_malloc(bytes);
  void *p = NULL;
  size_t sz = (size_t)sdpa_probe_align_up(bytes, 64);
  if (posix_memalign(&p, 64, sz) != 0) return NULL;
  return p;
}

void sdpa_probe_free(void *p) {
  if (p == NULL) return;
  if (atomic_load_explicit(&g_guard_live, memory_order_relaxed) != 0 && guard_free(p)) return;
  free(p);
}

void sdpa_probe_alloc_stats(int64_t *count, int64_t *bytes) {
  if (count) *count = atomic_load(&g_alloc_count);
  if (bytes) *bytes = atomic_load(&g_alloc_bytes);
}

void sdpa_probe_alloc_reset(void) {
  atomic_store(&g_alloc_count, 0);
  atomic_store(&g_alloc_bytes, 0);
}

/* Defined by native/preload/alloc_count.c when that library is preloaded (the
 * weak reference then resolves to it), else NULL. */
extern void sdpa_probe_preload_alloc_stats(int64_t *allocs, int64_t *bytes, int64_t *frees,
                                           int64_t *threads) __attribute__((weak));

int sdpa_probe_process_alloc_stats(int64_t *allocs, int64_t *bytes, int64_t *frees,
                                   int64_t *threads) {
  if (sdpa_probe_preload_alloc_stats == NULL) return SDPA_UNSUPPORTED;
  sdpa_probe_preload_alloc_stats(allocs, bytes, frees, threads);
  return SDPA_OK;
}

void sdpa_probe_alloc_guard(int on) {
  if (on) {
    pthread_mutex_lock(&g_guard_mu);
    g_guard_nrec = 0;
    g_guard_seq = 0;
    pthread_mutex_unlock(&g_guard_mu);
  }
  atomic_store(&g_guard_on, on ? 1 : 0);
}

int64_t sdpa_probe_alloc_guard_records(sdpa_probe_alloc_record *out, int64_t max) {
  pthread_mutex_lock(&g_guard_mu);
  int64_t n = g_guard_nrec;
  int64_t kept = n < GUARD_MAX_RECORDS ? n : GUARD_MAX_RECORDS;
  if (out != NULL)
    for (int64_t i = 0; i < kept && i < max; i++) out[i] = g_guard_rec[i];
  pthread_mutex_unlock(&g_guard_mu);
  return n;
}

int sdpa_probe_alloc_guard_test(int64_t bytes, int64_t write_from, int64_t write_to) {
  if (!atomic_load(&g_guard_on) || bytes <= 0 || write_from < -(GUARD_HEAD - 16) ||
      write_to > bytes + GUARD_TAIL || write_from > write_to)
    return SDPA_INVALID;
  unsigned char *p = (unsigned char *)sdpa_probe_malloc(bytes);
  if (p == NULL) return SDPA_UNSUPPORTED;
  /* bytes 0x11..0x50: never the fill (0xA5) nor the canary (0x5C) */
  for (int64_t i = write_from; i < write_to; i++) p[i] = (unsigned char)(0x11 + (i & 0x3f));
  sdpa_probe_free(p);
  return SDPA_OK;
}

int sdpa_probe_default_threads(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 1) n = 1;
  if (n > SDPA_PROBE_MAX_THREADS) n = SDPA_PROBE_MAX_THREADS;
  return (int)n;
}

/* ---- thread pool ------------------------------------------------------
 * Workers spin briefly on a generation counter, then sleep, each on its own
 * condition variable. A job names how many threads may take part (`width`, the
 * call's n_threads): only those workers are signalled, and a spinning worker
 * outside it goes back to sleep at once. (With one broadcast for every job, a
 * pool grown by one 64-thread call woke all its workers on every later 2-thread
 * call, each then spinning: up to 15 threads runnable and the call 4x slower,
 * seen by probe check's thread sampling.) A call posts a job (on the caller's
 * stack); tasks are handed out
 * by the job's atomic counter and the calling thread works too. The caller
 * waits for the tasks, not for the workers: a worker that was descheduled and
 * never picked the job up cannot stall the call. Once every task is done the
 * job is closed (no late pick-ups) and the caller waits only for the workers
 * that did pick it up. A pool inherited through fork() is rebuilt in the child. */

typedef struct {
  sdpa_probe_task_fn fn;
  void *ctx;
  int64_t n_tasks;
  int max_thread;          /* worker ids 1..max_thread-1 may take part */
  int open;                /* under pool.mu */
  _Atomic int64_t next;
  _Atomic int64_t finished;
  _Atomic int refs;        /* workers inside the job */
} job_t;

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv[SDPA_PROBE_MAX_THREADS]; /* worker id's own */
  pthread_mutex_t call_mu; /* one parallel_for at a time */
  int n_workers;
  pthread_t th[SDPA_PROBE_MAX_THREADS];
  _Atomic uint64_t gen;
  _Atomic int width;       /* worker ids below it take part in job gen */
  job_t *job;              /* under mu */
  pid_t pid;
} pool_t;

static pool_t g_pool;
static pthread_mutex_t g_pool_init_mu = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int t_in_pool;

static void run_tasks(job_t *j, int thread) {
  for (;;) {
    int64_t t = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
    if (t >= j->n_tasks) break;
    j->fn(j->ctx, t, thread);
    atomic_fetch_add_explicit(&j->finished, 1, memory_order_release);
  }
}

static void *worker_main(void *arg) {
  int id = (int)(intptr_t)arg;
  uint64_t seen = 0;
  t_in_pool = 1;
  for (;;) {
    int spins = 0;
    for (;;) { /* until a job this worker takes part in */
      const uint64_t g = atomic_load_explicit(&g_pool.gen, memory_order_acquire);
      if (g != seen) {
        if (atomic_load_explicit(&g_pool.width, memory_order_relaxed) > id) break;
        seen = g; /* a narrower job: not ours, and no spinning for it */
        spins = 20000;
      }
      if (++spins < 20000) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
        continue;
      }
      pthread_mutex_lock(&g_pool.mu);
      while (atomic_load(&g_pool.gen) == seen) pthread_cond_wait(&g_pool.cv[id], &g_pool.mu);
      pthread_mutex_unlock(&g_pool.mu);
    }
    pthread_mutex_lock(&g_pool.mu);
    seen = atomic_load(&g_pool.gen);
    job_t *j = g_pool.job;
    if (j && (!j->open || id >= j->max_thread)) j = NULL;
    if (j) atomic_fetch_add_explicit(&j->refs, 1, memory_order_relaxed);
    pthread_mutex_unlock(&g_pool.mu);
    if (j) {
      run_tasks(j, id);
      atomic_fetch_sub_explicit(&j->refs, 1, memory_order_release);
    }
  }
  return NULL;
}

static void pool_reset_locked(void) {
  pthread_mutex_init(&g_pool.mu, NULL);
  for (int i = 0; i < SDPA_PROBE_MAX_THREADS; i++) pthread_cond_init(&g_pool.cv[i], NULL);
  atomic_store(&g_pool.width, 0);
  pthread_mutex_init(&g_pool.call_mu, NULL);
  g_pool.n_workers = 0;
  g_pool.job = NULL;
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

static void spin_until(_Atomic int64_t *counter, int64_t target) {
  int spins = 0;
  while (atomic_load_explicit(counter, memory_order_acquire) < target)
    if (++spins > 2000) sched_yield();
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
  job_t job;
  job.fn = fn;
  job.ctx = ctx;
  job.n_tasks = n_tasks;
  job.max_thread = n_threads;
  job.open = 1;
  atomic_init(&job.next, 0);
  atomic_init(&job.finished, 0);
  atomic_init(&job.refs, 0);
  pthread_mutex_lock(&g_pool.call_mu);
  pthread_mutex_lock(&g_pool.mu);
  g_pool.job = &job;
  atomic_store_explicit(&g_pool.width, n_threads, memory_order_relaxed);
  atomic_fetch_add_explicit(&g_pool.gen, 1, memory_order_release); /* (width with it) */
  for (int k = 1; k < n_threads; k++) pthread_cond_signal(&g_pool.cv[k]);
  pthread_mutex_unlock(&g_pool.mu);

  t_in_pool = 1;
  run_tasks(&job, 0);
  t_in_pool = 0;
  spin_until(&job.finished, n_tasks);
  pthread_mutex_lock(&g_pool.mu);
  job.open = 0;
  g_pool.job = NULL;
  pthread_mutex_unlock(&g_pool.mu);
  int spins = 0;
  while (atomic_load_explicit(&job.refs, memory_order_acquire) > 0)
    if (++spins > 2000) sched_yield();
  pthread_mutex_unlock(&g_pool.call_mu);
}
