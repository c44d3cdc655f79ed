/* Scheduling shaker, LD_PRELOAD'ed into the worker in which `--stress` repeats a
 * threaded or concurrent case (sdpa_probe/fuzz/stress.py).
 *
 * Why: in a short case the calling thread often finishes every task before a thread
 * it starts has even begun, so a bug on a spawned worker's path (a race on shared
 * scratch, a store on the wrong slice, a thread budget ignored) shows in some runs
 * and not others. Every pthread_create comes here (std::thread, OpenMP, pthreadpool
 * too) and, in turn, one of:
 *   0  the creator waits until the new thread has begun, then both go on: on two
 *      cores they take tasks at the same moment (a race on shared scratch overlaps);
 *      on one, the new thread runs first (a worker-only path is taken)
 *   1  the same, the new thread then a few microseconds later
 *   2  the creator sleeps 20-300 us (the new one takes tasks while it sleeps)
 *   3  the new thread sleeps 20-300 us before its start routine (the creator first)
 * A counter and a per-process generator pick which, so rounds of one case meet each.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef int (*pthread_create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);

static _Atomic uint64_t n_created;
static _Atomic uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t next_random(void) {
  uint64_t x = atomic_fetch_add_explicit(&rng_state, 0x9E3779B97F4A7C15ull,
                                         memory_order_relaxed);
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

static void sleep_ns(long lo, long span) {
  struct timespec ts = {0, lo + (long)(next_random() % (uint64_t)span)};
  nanosleep(&ts, NULL);
}

struct start {
  void *(*fn)(void *);
  void *arg;
  int mode;
  _Atomic int begun;  /* modes 0, 1: the creator waits for it, then frees the struct */
};

static void *shaken_start(void *p) {
  struct start *sp = p;
  struct start s = {sp->fn, sp->arg, sp->mode, 0};
  if (s.mode <= 1) {
    atomic_store_explicit(&sp->begun, 1, memory_order_release);
  } else {
    free(sp);
  }
  if (s.mode == 1) sleep_ns(1000, 20000);
  if (s.mode == 3) sleep_ns(20000, 280000);
  return s.fn(s.arg);
}

EXPORT int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *),
                          void *arg) {
  static _Atomic(pthread_create_fn) real;
  pthread_create_fn f = atomic_load_explicit(&real, memory_order_acquire);
  if (f == NULL) {
    f = (pthread_create_fn)dlsym(RTLD_NEXT, "pthread_create");
    if (f == NULL) return EAGAIN;
    atomic_store_explicit(&real, f, memory_order_release);
  }
  const uint64_t n = atomic_fetch_add_explicit(&n_created, 1, memory_order_relaxed);
  const int mode = (int)((n + next_random() % 2) % 4);
  struct start *s = malloc(sizeof *s);
  if (s == NULL) return f(t, attr, fn, arg);
  s->fn = fn;
  s->arg = arg;
  s->mode = mode;
  atomic_store_explicit(&s->begun, 0, memory_order_relaxed);
  const int r = f(t, attr, shaken_start, s);
  if (r != 0) {
    free(s);
    return r;
  }
  if (mode <= 1) {
    while (!atomic_load_explicit(&s->begun, memory_order_acquire)) sched_yield();
    free(s);
  }
  if (mode == 2) sleep_ns(20000, 280000);
  return 0;
}

/* Threads this process started through the shaker (stress.py asks, to say the shaker
 * was there). */
EXPORT uint64_t sdpa_probe_shaken_threads(void) {
  return atomic_load_explicit(&n_created, memory_order_relaxed);
}
