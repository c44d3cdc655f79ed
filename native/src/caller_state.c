/* The caller's thread and process state a kernel call must leave as it found it
 * (sdpa_probe_caller.h). A runtime calls SDPA from its own thread, per layer per
 * token: a kernel that pins that thread to one CPU, blocks its signals, installs a
 * signal handler, arms a timer, changes the locale (and with it how the model's
 * numbers print and parse), the working directory or the environment changes the
 * program around it, while its own output can be right. */
#define _GNU_SOURCE
#include <errno.h>
#include <locale.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef __linux__
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#endif

#include "sdpa_probe_caller.h"

extern char **environ;

_Static_assert(sizeof(struct sigaction) <= SDPA_PROBE_CS_SA_BYTES, "struct sigaction");

static void copy_text(char *dst, size_t cap, const char *src) {
  if (src == NULL) src = "";
  size_t n = strlen(src);
  if (n >= cap) n = cap - 1;
  memcpy(dst, src, n);
  dst[n] = '\0';
}

#ifdef __linux__
/* The umask without changing it (umask(2) only sets): /proc's status line. */
static int read_umask(void) {
  FILE *f = fopen("/proc/thread-self/status", "r");
  if (f == NULL) f = fopen("/proc/self/status", "r");
  if (f == NULL) return -1;
  char line[256];
  int mask = -1;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "Umask:", 6) == 0) {
      mask = (int)strtol(line + 6, NULL, 8);
      break;
    }
  fclose(f);
  return mask;
}

static const int timers[SDPA_PROBE_CS_TIMERS] = {ITIMER_REAL, ITIMER_VIRTUAL, ITIMER_PROF};

static int64_t tv_us(struct timeval tv) { return (int64_t)tv.tv_sec * 1000000 + tv.tv_usec; }
static int64_t rlim_i64(rlim_t r) { return r == RLIM_INFINITY ? -1 : (int64_t)r; }
static rlim_t i64_rlim(int64_t v) { return v < 0 ? RLIM_INFINITY : (rlim_t)v; }
#endif

int sdpa_probe_caller_state_read(sdpa_probe_caller_state *s) {
  if (s == NULL) return -1;
  memset(s, 0, sizeof *s);
  s->umask = -1;
#ifdef __linux__
  cpu_set_t cs;
  CPU_ZERO(&cs);
  if (sched_getaffinity(0, sizeof cs, &cs) == 0) {
    s->cpus_known = 1;
    for (int c = 0; c < SDPA_PROBE_CS_CPU_WORDS * 64 && c < CPU_SETSIZE; c++)
      if (CPU_ISSET(c, &cs)) s->cpus[c / 64] |= (uint64_t)1 << (c % 64);
  }
  s->policy = sched_getscheduler(0);
  struct sched_param sp;
  s->priority = sched_getparam(0, &sp) == 0 ? sp.sched_priority : 0;
  errno = 0;
  s->nice = getpriority(PRIO_PROCESS, 0); /* (Linux: the calling thread) */
  prctl(PR_GET_NAME, s->name, 0, 0, 0);
  s->umask = read_umask();
  s->n_rlimits = RLIM_NLIMITS < SDPA_PROBE_CS_RLIMITS ? RLIM_NLIMITS : SDPA_PROBE_CS_RLIMITS;
  for (int r = 0; r < s->n_rlimits; r++) {
    struct rlimit rl;
    if (getrlimit(r, &rl) == 0) s->rlim_cur[r] = rlim_i64(rl.rlim_cur), s->rlim_max[r] = rlim_i64(rl.rlim_max);
  }
  for (int t = 0; t < SDPA_PROBE_CS_TIMERS; t++) {
    struct itimerval it;
    if (getitimer(timers[t], &it) == 0)
      s->timer_value_us[t] = tv_us(it.it_value), s->timer_interval_us[t] = tv_us(it.it_interval);
  }
#endif
  sigset_t blocked;
  if (pthread_sigmask(SIG_BLOCK, NULL, &blocked) == 0) {
    s->blocked_known = 1;
    for (int sig = 1; sig < SDPA_PROBE_CS_SIGNALS; sig++)
      if (sigismember(&blocked, sig) == 1) s->blocked |= (uint64_t)1 << (sig - 1);
  }
  for (int sig = 1; sig < SDPA_PROBE_CS_SIGNALS; sig++) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    if (sigaction(sig, NULL, &sa) != 0) continue; /* (glibc's own, SIGCANCEL / SIGSETXID) */
    s->handler_known[sig] = 1;
    s->handler[sig] = (sa.sa_flags & SA_SIGINFO) ? (uint64_t)(uintptr_t)sa.sa_sigaction
                                                 : (uint64_t)(uintptr_t)sa.sa_handler;
    s->handler_flags[sig] = (uint64_t)(uint32_t)sa.sa_flags;
    memcpy(s->handler_raw[sig], &sa, sizeof sa);
  }
  copy_text(s->locale, sizeof s->locale, setlocale(LC_ALL, NULL));
  s->thread_locale = (uint64_t)(uintptr_t)uselocale((locale_t)0);
  if (getcwd(s->cwd, sizeof s->cwd) == NULL) s->cwd[0] = '\0';
  return 0;
}

int sdpa_probe_caller_state_restore(const sdpa_probe_caller_state *b,
                                    const sdpa_probe_caller_state *n) {
  if (b == NULL || n == NULL) return -1;
  int failed = 0;
#ifdef __linux__
  if (b->cpus_known && n->cpus_known && memcmp(b->cpus, n->cpus, sizeof b->cpus) != 0) {
    cpu_set_t cs;
    CPU_ZERO(&cs);
    for (int c = 0; c < SDPA_PROBE_CS_CPU_WORDS * 64 && c < CPU_SETSIZE; c++)
      if (b->cpus[c / 64] >> (c % 64) & 1) CPU_SET(c, &cs);
    failed += sched_setaffinity(0, sizeof cs, &cs) != 0;
  }
  if (b->policy != n->policy || b->priority != n->priority) {
    struct sched_param sp = {.sched_priority = b->priority};
    failed += sched_setscheduler(0, b->policy, &sp) != 0;
  }
  if (b->nice != n->nice) failed += setpriority(PRIO_PROCESS, 0, b->nice) != 0;
  if (strcmp(b->name, n->name) != 0) failed += prctl(PR_SET_NAME, b->name, 0, 0, 0) != 0;
  if (b->umask >= 0 && b->umask != n->umask) umask((mode_t)b->umask);
  for (int r = 0; r < b->n_rlimits && r < n->n_rlimits; r++)
    if (b->rlim_cur[r] != n->rlim_cur[r] || b->rlim_max[r] != n->rlim_max[r]) {
      struct rlimit rl = {i64_rlim(b->rlim_cur[r]), i64_rlim(b->rlim_max[r])};
      failed += setrlimit(r, &rl) != 0;
    }
  for (int t = 0; t < SDPA_PROBE_CS_TIMERS; t++) {
    const int was = b->timer_value_us[t] != 0, is = n->timer_value_us[t] != 0;
    if (!was && is) { /* armed by the call: a signal later, in the caller */
      struct itimerval off;
      memset(&off, 0, sizeof off);
      failed += setitimer(timers[t], &off, NULL) != 0;
    }
  }
#endif
  if (b->blocked_known && n->blocked_known && b->blocked != n->blocked) {
    sigset_t set;
    sigemptyset(&set);
    for (int sig = 1; sig < SDPA_PROBE_CS_SIGNALS; sig++)
      if (b->blocked >> (sig - 1) & 1) sigaddset(&set, sig);
    failed += pthread_sigmask(SIG_SETMASK, &set, NULL) != 0;
  }
  for (int sig = 1; sig < SDPA_PROBE_CS_SIGNALS; sig++)
    if (b->handler_known[sig] && n->handler_known[sig] &&
        (b->handler[sig] != n->handler[sig] || b->handler_flags[sig] != n->handler_flags[sig])) {
      struct sigaction sa;
      memcpy(&sa, b->handler_raw[sig], sizeof sa);
      failed += sigaction(sig, &sa, NULL) != 0;
    }
  if (strcmp(b->locale, n->locale) != 0) failed += setlocale(LC_ALL, b->locale) == NULL;
  if (b->thread_locale != n->thread_locale)
    failed += uselocale((locale_t)(uintptr_t)b->thread_locale) == (locale_t)0;
  if (b->cwd[0] != '\0' && strcmp(b->cwd, n->cwd) != 0) failed += chdir(b->cwd) != 0;
  return failed;
}

int64_t sdpa_probe_environ_text(char *buf, int64_t cap) {
  int64_t need = 0;
  for (char **e = environ; e != NULL && *e != NULL; e++) {
    const int64_t n = (int64_t)strlen(*e) + 1;
    if (buf != NULL && need + n <= cap) memcpy(buf + need, *e, (size_t)n);
    need += n;
  }
  return need;
}

int sdpa_probe_die_with_parent(int64_t parent_pid) {
#ifdef PR_SET_PDEATHSIG
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) return -1;
  /* the parent may have ended before the request: the signal would never come */
  return (int64_t)getppid() != parent_pid ? 1 : 0;
#else
  (void)parent_pid;
  return -1;
#endif
}

int sdpa_probe_environ_put(const char *name, const char *value) {
  if (name == NULL || name[0] == '\0' || strchr(name, '=') != NULL) return -1;
  return value == NULL ? unsetenv(name) : setenv(name, value, 1);
}
