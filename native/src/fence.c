/* Fenced buffers (sdpa_probe_fence.h): one anonymous mapping each, the data at one end
 * of its pages and a PROT_NONE page beyond it. */
#define _GNU_SOURCE
#include "sdpa_probe_fence.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_FENCES 256

typedef struct {
  _Atomic int used;    /* the handler reads entries without the lock: set last, cleared first */
  uintptr_t map, map_len, guard, data;
  int64_t nbytes;
  int32_t where;
  char label[SDPA_PROBE_FENCE_LABEL];
} fence;

static fence fences[MAX_FENCES];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t page_size;
static struct sigaction prev_segv, prev_bus;
static int handler_installed;

/* The distance of address a into fence f's guard page, 1-based, or 0. */
static int64_t distance(const fence *f, uintptr_t a) {
  if (a < f->guard || a >= f->guard + page_size) return 0;
  if (f->where == SDPA_PROBE_FENCE_AFTER) return (int64_t)(a - f->guard) + 1;
  return (int64_t)(f->data - a);
}

static size_t put_str(char *buf, size_t at, size_t cap, const char *s) {
  while (*s && at + 1 < cap) buf[at++] = *s++;
  return at;
}

static size_t put_num(char *buf, size_t at, size_t cap, uint64_t v, int hex) {
  char tmp[24];
  int n = 0;
  const unsigned base = hex ? 16 : 10;
  do {
    tmp[n++] = "0123456789abcdef"[v % base];
    v /= base;
  } while (v && n < (int)sizeof tmp);
  while (n && at + 1 < cap) buf[at++] = tmp[--n];
  return at;
}

/* Async-signal-safe: no locks, no stdio. Says which fence was hit, puts the replaced
 * handler back and raises the signal again for it (pending until this returns; a real
 * fault would recur anyway, a sent SIGSEGV would not). */
static void on_fault(int sig, siginfo_t *si, void *uc) {
  (void)uc;
  const uintptr_t a = (uintptr_t)si->si_addr;
  for (int i = 0; i < MAX_FENCES; i++) {
    const fence *f = &fences[i];
    if (!atomic_load(&f->used)) continue;
    const int64_t d = distance(f, a);
    if (!d) continue;
    char msg[256];
    size_t n = put_str(msg, 0, sizeof msg, "sdpa_probe fence: the kernel touched ");
    n = put_str(msg, n, sizeof msg, f->label);
    n = put_str(msg, n, sizeof msg, f->where == SDPA_PROBE_FENCE_AFTER ? " past its end, byte "
                                                                       : " before its start, byte ");
    n = put_num(msg, n, sizeof msg, (uint64_t)d, 0);
    n = put_str(msg, n, sizeof msg, f->where == SDPA_PROBE_FENCE_AFTER ? " after its last (address 0x"
                                                                       : " before its first (address 0x");
    n = put_num(msg, n, sizeof msg, (uint64_t)a, 1);
    n = put_str(msg, n, sizeof msg, ", an inaccessible page)\n");
    ssize_t w = write(2, msg, n);
    (void)w;
    break;
  }
  sigaction(sig, sig == SIGBUS ? &prev_bus : &prev_segv, NULL);
  raise(sig);
}

static int install_handler(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGSEGV, &sa, &prev_segv) != 0) return -1;
  if (sigaction(SIGBUS, &sa, &prev_bus) != 0) return -1;
  return 0;
}

void *sdpa_probe_fence_alloc(int64_t nbytes, int32_t where, const char *label) {
  if (nbytes < 0 || (where != SDPA_PROBE_FENCE_AFTER && where != SDPA_PROBE_FENCE_BEFORE)) {
    errno = EINVAL;
    return NULL;
  }
  if (!page_size) page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
  const uintptr_t data_pages = ((uintptr_t)nbytes + page_size - 1) / page_size;
  const uintptr_t len = (data_pages ? data_pages : 1) * page_size + page_size;
  void *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) return NULL;
  const uintptr_t base = (uintptr_t)map;
  const uintptr_t guard = where == SDPA_PROBE_FENCE_AFTER ? base + len - page_size : base;
  const uintptr_t data = where == SDPA_PROBE_FENCE_AFTER ? guard - (uintptr_t)nbytes
                                                         : base + page_size;
  if (mprotect((void *)guard, page_size, PROT_NONE) != 0) {
    const int e = errno;
    munmap(map, len);
    errno = e;
    return NULL;
  }
  pthread_mutex_lock(&lock);
  if (!handler_installed && install_handler() == 0) handler_installed = 1;
  int slot = -1;
  for (int i = 0; i < MAX_FENCES && slot < 0; i++)
    if (!atomic_load(&fences[i].used)) slot = i;
  if (slot >= 0) {
    fence *f = &fences[slot];
    f->map = base;
    f->map_len = len;
    f->guard = guard;
    f->data = data;
    f->nbytes = nbytes;
    f->where = where;
    strncpy(f->label, label ? label : "a buffer", sizeof f->label - 1);
    f->label[sizeof f->label - 1] = '\0';
    atomic_store(&f->used, 1);
  }
  pthread_mutex_unlock(&lock);
  if (slot < 0) {
    munmap(map, len);
    errno = ENOMEM;
    return NULL;
  }
  return (void *)data;
}

int sdpa_probe_fence_free(void *data) {
  int rc = -1;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_FENCES; i++) {
    fence *f = &fences[i];
    if (atomic_load(&f->used) && f->data == (uintptr_t)data) {
      atomic_store(&f->used, 0);
      rc = munmap((void *)f->map, f->map_len);
      break;
    }
  }
  pthread_mutex_unlock(&lock);
  return rc;
}

int64_t sdpa_probe_fence_find(uint64_t address, char *label, int64_t cap) {
  int64_t d = 0;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_FENCES && !d; i++) {
    const fence *f = &fences[i];
    if (!atomic_load(&f->used)) continue;
    d = distance(f, (uintptr_t)address);
    if (d && label && cap > 0) {
      strncpy(label, f->label, (size_t)cap - 1);
      label[cap - 1] = '\0';
    }
  }
  pthread_mutex_unlock(&lock);
  return d;
}

void *sdpa_probe_reserve(int64_t nbytes) {
  if (nbytes <= 0) {
    errno = EINVAL;
    return NULL;
  }
  void *map = mmap(NULL, (size_t)nbytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
  return map == MAP_FAILED ? NULL : map;
}

int sdpa_probe_commit(void *base, int64_t offset, int64_t nbytes) {
  if (!page_size) page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
  if (offset < 0 || nbytes <= 0) {
    errno = EINVAL;
    return -1;
  }
  const uintptr_t lo = ((uintptr_t)base + (uintptr_t)offset) & ~(page_size - 1);
  const uintptr_t hi = (uintptr_t)base + (uintptr_t)offset + (uintptr_t)nbytes;
  return mprotect((void *)lo, hi - lo, PROT_READ | PROT_WRITE);
}

int sdpa_probe_release(void *base, int64_t nbytes) {
  return munmap(base, (size_t)nbytes);
}
