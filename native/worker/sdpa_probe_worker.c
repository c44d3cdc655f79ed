/* sdpa_probe_worker -- runs a case's kernel calls without Python, on another CPU (under
 * qemu-aarch64, or on a device over ssh), and writes back what the harness judges.
 *
 *   sdpa_probe_worker ARENA RESULT      (either may be "-": stdin / stdout)
 *
 * The arena (sdpa_probe/targets/arena.py writes it) holds the buffers of the call as
 * the harness laid them out (NaN slack, poisoned output framed by guards, misaligned,
 * fenced against an inaccessible page, or sparse over gigabytes of address space) and
 * the sdpa_args of each call, every pointer a (buffer, offset) pair. The worker
 * recreates each buffer at the same address modulo 64 (or flush against a fence),
 * makes the calls (once; twice with the inputs rewritten in place; or from several
 * threads at once, round after round), and writes, per call, the status, the output
 * arena as the call returned and after a short watch for late writes, the inputs it
 * wrote, the floating-point control state around it, the caller's thread and process
 * state, and the heap over repeated calls. Judging is the harness's: a signal or a
 * timeout is the harness's to see too (the process dies or is killed).
 *
 * Built with one kernel: a user's file (its sdpa_forward) or the built-in set
 * (-DSDPA_WORKER_BUILTIN: the kernel named in the arena, through the registry). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "fp_env.h"
#include "sdpa_probe.h"
#include "sdpa_probe_caller.h"
#ifdef SDPA_WORKER_BUILTIN
#include "sdpa_probe_lib.h"
#endif

#define ARENA_MAGIC 0x314B525741504453ull  /* "SDPAWRK1" */
#define RESULT_MAGIC 0x3153455241504453ull /* "SDPARES1" */
enum { MODE_SINGLE = 0, MODE_REUSE = 1, MODE_CONCURRENT = 2 };
enum { FENCE_NONE = 0, FENCE_AFTER = 1, FENCE_BEFORE = 2 };
#define LEAK_WARMUP 2
#define LEAK_CALLS 4
#define LEAK_CONFIRM 12
#define LEAK_MAX_NS 500000000LL /* calls slower than this are not repeated */

static void die(const char *what) {
  fprintf(stderr, "sdpa_probe_worker: %s\n", what);
  exit(97);
}

/* ---- reading the arena --------------------------------------------------- */

static const uint8_t *rd_p, *rd_end;
static uint64_t rd_u64(void) {
  if (rd_end - rd_p < 8) die("arena truncated");
  uint64_t v;
  memcpy(&v, rd_p, 8);
  rd_p += 8;
  return v;
}
static int64_t rd_i64(void) { return (int64_t)rd_u64(); }
static const uint8_t *rd_bytes(uint64_t n) {
  uint64_t padded = (n + 7) & ~7ull;
  if ((uint64_t)(rd_end - rd_p) < padded) die("arena truncated");
  const uint8_t *p = rd_p;
  rd_p += padded;
  return p;
}

static uint8_t *slurp(const char *path, size_t *n) {
  int fd = strcmp(path, "-") ? open(path, O_RDONLY) : 0;
  if (fd < 0) die("cannot open the arena");
  size_t cap = 1 << 20, len = 0;
  uint8_t *buf = malloc(cap);
  for (;;) {
    if (len == cap && !(buf = realloc(buf, cap *= 2))) die("out of memory reading the arena");
    ssize_t got = read(fd, buf + len, cap - len);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) die("cannot read the arena");
    if (got == 0) break;
    len += (size_t)got;
  }
  if (fd) close(fd);
  *n = len;
  return buf;
}

typedef struct {
  uint64_t size, elem, fence, is_out;
  uint8_t *base;      /* where the buffer lives */
  uint8_t *initial;   /* its first contents (an output's poison and guards) */
  uint8_t *before;    /* an input's contents before the current call */
} buffer;

static buffer *bufs;
static uint64_t n_bufs;
static long page;

static uint8_t *place_buffer(buffer *b, uint64_t align, uint64_t sparse) {
  uint64_t size = b->size ? b->size : 1;
  if (b->fence != FENCE_NONE) { /* an inaccessible page on the fenced side */
    uint64_t body = (size + page - 1) / page * page;
    uint8_t *m = mmap(NULL, body + 2 * page, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) die("cannot map a fenced buffer");
    mprotect(m, page, PROT_NONE);
    mprotect(m + page + body, page, PROT_NONE);
    return b->fence == FENCE_AFTER ? m + page + body - size : m + page;
  }
  if (sparse) { /* reserved, only its segments' pages made writable below */
    uint8_t *m = mmap(NULL, size + page, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) die("cannot reserve a sparse buffer's address space");
    return m;
  }
  uint8_t *m = malloc(size + 128);
  if (!m) die("out of memory placing a buffer");
  return m + ((align - (uintptr_t)m) & 63);
}

static void read_buffers(void) {
  bufs = calloc(n_bufs ? n_bufs : 1, sizeof *bufs);
  for (uint64_t i = 0; i < n_bufs; i++) {
    buffer *b = &bufs[i];
    b->size = rd_u64();
    uint64_t align = rd_u64();
    b->fence = rd_u64();
    b->elem = rd_u64();
    b->is_out = rd_u64();
    uint64_t n_seg = rd_u64(), sparse = rd_u64();
    b->base = place_buffer(b, align, sparse);
    for (uint64_t s = 0; s < n_seg; s++) {
      uint64_t off = rd_u64(), len = rd_u64();
      const uint8_t *src = rd_bytes(len);
      if (off + len > b->size) die("a segment lies outside its buffer");
      if (sparse) {
        uintptr_t lo = (uintptr_t)(b->base + off) & ~(uintptr_t)(page - 1);
        uintptr_t hi = (uintptr_t)(b->base + off + len + page - 1) & ~(uintptr_t)(page - 1);
        if (mprotect((void *)lo, hi - lo, PROT_READ | PROT_WRITE)) die("cannot commit a segment");
      }
      memcpy(b->base + off, src, len);
    }
    if (b->is_out) {
      b->initial = malloc(b->size + 1);
      memcpy(b->initial, b->base, b->size);
    } else if (!sparse) {
      b->before = malloc(b->size + 1);
    }
  }
}

static void *pointer(int64_t buf, int64_t off) {
  if (buf < 0) return NULL;
  if ((uint64_t)buf >= n_bufs) die("a pointer names no buffer");
  return bufs[buf].base + off;
}

typedef struct {
  sdpa_args args;
  int64_t out_buf;
  int64_t n_rewrites;
  const uint8_t **rewrite;
  int64_t *rewrite_buf;
} call_spec;

static void read_tensor(sdpa_tensor *t) {
  int64_t buf = rd_i64(), off = rd_i64();
  t->data = pointer(buf, off);
  t->dtype = (int32_t)rd_i64();
  for (int i = 0; i < 4; i++) t->stride[i] = rd_i64();
  buf = rd_i64(), off = rd_i64();
  t->scale = pointer(buf, off);
  buf = rd_i64(), off = rd_i64();
  t->zero_point = pointer(buf, off);
  for (int i = 0; i < 3; i++) t->qstride[i] = rd_i64();
}

static void read_call(call_spec *c) {
  sdpa_args *a = &c->args;
  memset(a, 0, sizeof *a);
  c->out_buf = rd_i64();
  c->n_rewrites = rd_i64();
  c->rewrite = calloc((size_t)c->n_rewrites + 1, sizeof *c->rewrite);
  c->rewrite_buf = calloc((size_t)c->n_rewrites + 1, sizeof *c->rewrite_buf);
  for (int64_t r = 0; r < c->n_rewrites; r++) {
    c->rewrite_buf[r] = rd_i64();
    if ((uint64_t)c->rewrite_buf[r] >= n_bufs) die("a rewrite names no buffer");
    c->rewrite[r] = rd_bytes(bufs[c->rewrite_buf[r]].size);
  }
  a->abi_version = (int32_t)rd_i64();
  a->batch = rd_i64(), a->n_heads = rd_i64(), a->n_kv_heads = rd_i64();
  a->q_len = rd_i64(), a->kv_len = rd_i64(), a->head_dim = rd_i64();
  read_tensor(&a->q), read_tensor(&a->k), read_tensor(&a->v), read_tensor(&a->out);
  int64_t buf = rd_i64(), off = rd_i64();
  a->mask = pointer(buf, off);
  a->mask_row_stride = rd_i64();
  a->is_causal = (int32_t)rd_i64();
  a->start_pos = rd_i64();
  uint64_t bits = rd_u64();
  double scale;
  memcpy(&scale, &bits, 8);
  a->scale = (float)scale;
  a->n_threads = (int32_t)rd_i64();
}

/* ---- one call ----------------------------------------------------------- */

#ifdef SDPA_WORKER_BUILTIN
static int64_t kernel_index = -1;
static int forward(const sdpa_args *a) { return sdpa_probe_kernel_forward(kernel_index, a); }
#else
static int forward(const sdpa_args *a) { return sdpa_forward(a); }
#endif

typedef struct {
  int64_t status, ns;
  uint64_t fp_before, fp_after;
  int64_t written[16][2]; /* (buffer, elements changed) for each input written */
  int64_t n_written;
  int64_t out_buf;
  uint8_t *at_return, *final;
} result;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t watch_ms;

/* Whether an output element of the call's view still holds the poison pattern. */
static int poison_left(const sdpa_args *a, const uint8_t *at, const uint8_t *base) {
  const sdpa_tensor *t = &a->out;
  if (t->data == NULL || a->batch <= 0 || a->q_len <= 0) return 0;
  int64_t es = t->dtype == SDPA_F32 ? 4 : 2;
  uint64_t poison = t->dtype == SDPA_F32 ? 0xFF7A5A5Au : t->dtype == SDPA_F16 ? 0xFBFEu : 0xFF5Au;
  int64_t first = (const uint8_t *)t->data - base;
  for (int64_t b = 0; b < a->batch; b++)
    for (int64_t s = 0; s < a->q_len; s++)
      for (int64_t h = 0; h < a->n_heads; h++)
        for (int64_t d = 0; d < a->head_dim; d++) {
          int64_t e = b * t->stride[0] + s * t->stride[1] + h * t->stride[2] + d * t->stride[3];
          uint64_t v = 0;
          memcpy(&v, at + first + e * es, (size_t)es);
          if (v == poison) return 1;
        }
  return 0;
}

static void one_call(const call_spec *c, result *r) {
  buffer *out = c->out_buf >= 0 ? &bufs[c->out_buf] : NULL;
  for (uint64_t i = 0; i < n_bufs; i++)
    if (bufs[i].before) memcpy(bufs[i].before, bufs[i].base, bufs[i].size);
  r->out_buf = c->out_buf;
  r->fp_before = (uint64_t)fp_env_read();
  int64_t t0 = now_ns();
  r->status = forward(&c->args);
  if (out) memcpy(r->at_return, out->base, out->size);
  r->ns = now_ns() - t0;
  r->fp_after = (uint64_t)fp_env_read();
  if (r->fp_after != r->fp_before) fp_env_write((int64_t)r->fp_before);
  if (out) {
    int64_t waited = 0;
    if (poison_left(&c->args, r->at_return, out->base))
      while (waited < watch_ms && !memcmp(r->at_return, out->base, out->size)) {
        usleep(5000);
        waited += 5;
      }
    memcpy(r->final, out->base, out->size);
  }
  r->n_written = 0;
  for (uint64_t i = 0; i < n_bufs && r->n_written < 16; i++) {
    buffer *b = &bufs[i];
    if (!b->before) continue;
    int64_t changed = 0;
    for (uint64_t e = 0; e + b->elem <= b->size; e += b->elem)
      changed += memcmp(b->before + e, b->base + e, b->elem) != 0;
    if (changed) {
      r->written[r->n_written][0] = (int64_t)i;
      r->written[r->n_written++][1] = changed;
    }
  }
}

static void new_result(result *r, const call_spec *c) {
  memset(r, 0, sizeof *r);
  uint64_t size = c->out_buf >= 0 ? bufs[c->out_buf].size : 0;
  r->at_return = malloc(size + 1);
  r->final = malloc(size + 1);
}

static void reset_output(const call_spec *c) {
  if (c->out_buf >= 0) memcpy(bufs[c->out_buf].base, bufs[c->out_buf].initial, bufs[c->out_buf].size);
}

/* ---- modes: on a small stack, concurrent callers --------------------------- */

typedef struct {
  const call_spec *call;
  result *res;
  int64_t rounds;
  pthread_barrier_t *together;
} caller_job;

static void *caller_main(void *p) {
  caller_job *j = p;
  for (int64_t r = 0; r < j->rounds; r++) {
    reset_output(j->call);
    if (j->together) pthread_barrier_wait(j->together);
    one_call(j->call, &j->res[r]);
  }
  return NULL;
}

static void on_thread(caller_job *jobs, int64_t n, size_t stack) {
  pthread_t th[64];
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  if (stack) pthread_attr_setstacksize(&attr, stack);
  for (int64_t k = 0; k < n; k++)
    if (pthread_create(&th[k], &attr, caller_main, &jobs[k])) die("cannot start a caller thread");
  for (int64_t k = 0; k < n; k++) pthread_join(th[k], NULL);
  pthread_attr_destroy(&attr);
}

/* ---- writing the result ---------------------------------------------------- */

static FILE *res_out;
static void wr_u64(uint64_t v) { fwrite(&v, 8, 1, res_out); }
static void wr_bytes(const void *p, uint64_t n) {
  static const uint8_t zeros[8];
  fwrite(p, 1, n, res_out);
  fwrite(zeros, 1, (8 - n % 8) % 8, res_out);
}

static void write_result(const result *r) {
  wr_u64((uint64_t)r->status), wr_u64((uint64_t)r->ns), wr_u64(r->fp_before), wr_u64(r->fp_after);
  wr_u64((uint64_t)r->n_written);
  for (int64_t i = 0; i < r->n_written; i++) wr_u64((uint64_t)r->written[i][0]), wr_u64((uint64_t)r->written[i][1]);
  uint64_t size = r->out_buf >= 0 ? bufs[r->out_buf].size : 0;
  wr_u64(size);
  wr_bytes(r->at_return, size);
  wr_bytes(r->final, size);
}

static void write_state(void) {
  sdpa_probe_caller_state *s = calloc(1, sizeof *s);
  sdpa_probe_caller_state_read(s);
  wr_u64(sizeof *s);
  wr_bytes(s, sizeof *s);
  int64_t need = sdpa_probe_environ_text(NULL, 0);
  char *env = malloc((size_t)need + 4096);
  need = sdpa_probe_environ_text(env, need + 4096);
  wr_u64((uint64_t)need);
  wr_bytes(env, (uint64_t)need);
  free(env), free(s);
}

/* What the process holds, read after each repeated call: heap bytes in use, open
 * descriptors, mapped bytes (-1 where unknown). */
static void resources(int64_t out[3]) {
  struct mallinfo2 m = mallinfo2();
  out[0] = (int64_t)m.uordblks + (int64_t)m.hblkhd;
  out[1] = -1;
  DIR *d = opendir("/proc/self/fd");
  if (d) {
    out[1] = 0;
    while (readdir(d)) out[1]++;
    closedir(d);
  }
  out[2] = -1;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f) {
    long pages;
    if (fscanf(f, "%ld", &pages) == 1) out[2] = pages * page;
    fclose(f);
  }
}

/* The leak probe's calls (the harness's LEAK_WARMUP, LEAK_CALLS and LEAK_CONFIRM_CALLS),
 * then one more into the output poisoned again: its result is judged as the repeat. */
static void repeat_calls(const call_spec *c) {
  result r;
  new_result(&r, c);
  int64_t seen[1 + LEAK_CALLS + LEAK_CONFIRM][3];
  for (int i = 0; i < LEAK_WARMUP; i++) one_call(c, &r);
  int64_t n = 0;
  resources(seen[n++]);
  for (int i = 0; i < LEAK_CALLS + LEAK_CONFIRM; i++) {
    one_call(c, &r);
    resources(seen[n++]);
  }
  wr_u64((uint64_t)n);
  for (int64_t i = 0; i < n; i++) wr_u64((uint64_t)seen[i][0]), wr_u64((uint64_t)seen[i][1]), wr_u64((uint64_t)seen[i][2]);
  reset_output(c);
  one_call(c, &r);
  write_result(&r);
}

int main(int argc, char **argv) {
  if (argc != 3) die("usage: sdpa_probe_worker ARENA RESULT");
  page = sysconf(_SC_PAGESIZE);
  size_t len;
  uint8_t *arena = slurp(argv[1], &len);
  rd_p = arena, rd_end = arena + len;
  if (rd_u64() != ARENA_MAGIC) die("not an sdpa_probe arena");
  if (rd_u64() != 1) die("an arena of another version");
  uint64_t mode = rd_u64();
  n_bufs = rd_u64();
  uint64_t n_calls = rd_u64(), callers = rd_u64(), rounds = rd_u64(), stack_kib = rd_u64();
  uint64_t repeats = rd_u64();
  watch_ms = rd_i64();
  const char *kernel = (const char *)rd_bytes(64);
#ifdef SDPA_WORKER_BUILTIN
  for (int64_t i = 0; i < sdpa_probe_kernel_count(); i++)
    if (!strncmp(sdpa_probe_kernel_get(i)->name, kernel, 64)) kernel_index = i;
  if (kernel_index < 0) die("no such kernel in this build");
#else
  (void)kernel;
#endif
  if (n_calls < 1 || n_calls > 64 || callers > 64 || rounds > 64) die("a malformed arena");
  read_buffers();
  call_spec *calls = calloc(n_calls, sizeof *calls);
  for (uint64_t i = 0; i < n_calls; i++) read_call(&calls[i]);
  res_out = strcmp(argv[2], "-") ? fopen(argv[2], "wb") : stdout;
  if (!res_out) die("cannot write the result");
  uint64_t n_res = mode == MODE_CONCURRENT ? callers * rounds : mode == MODE_REUSE ? 2 : 1;
  result *res = calloc(n_res, sizeof *res);
  for (uint64_t i = 0; i < n_res; i++) new_result(&res[i], &calls[mode == MODE_CONCURRENT ? i / rounds : mode == MODE_REUSE ? i : 0]);
  wr_u64(RESULT_MAGIC);
  write_state();
  if (mode == MODE_CONCURRENT) {
    pthread_barrier_t together;
    pthread_barrier_init(&together, NULL, (unsigned)callers);
    caller_job jobs[64];
    for (uint64_t k = 0; k < callers; k++)
      jobs[k] = (caller_job){&calls[k], &res[k * rounds], (int64_t)rounds, &together};
    on_thread(jobs, (int64_t)callers, 0);
  } else {
    caller_job job = {&calls[0], &res[0], 1, NULL};
    if (stack_kib) on_thread(&job, 1, stack_kib * 1024);
    else one_call(&calls[0], &res[0]);
    if (mode == MODE_REUSE && res[0].status == SDPA_OK) {
      for (int64_t r = 0; r < calls[1].n_rewrites; r++)
        memcpy(bufs[calls[1].rewrite_buf[r]].base, calls[1].rewrite[r], bufs[calls[1].rewrite_buf[r]].size);
      reset_output(&calls[1]);
      one_call(&calls[1], &res[1]);
    } else if (mode == MODE_REUSE) {
      n_res = 1;
    }
  }
  wr_u64(n_res);
  for (uint64_t i = 0; i < n_res; i++) write_result(&res[i]);
  write_state();
  int repeat = repeats && mode == MODE_SINGLE && res[0].status == SDPA_OK && res[0].ns < LEAK_MAX_NS;
  wr_u64((uint64_t)repeat);
  if (repeat) {
    repeat_calls(&calls[0]);
    write_state();
  }
  if (fflush(res_out) || ferror(res_out)) die("cannot write the result");
  return 0;
}
