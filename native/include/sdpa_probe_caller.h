/*
 * sdpa_probe_caller.h -- what a kernel call must leave as it found it in its caller,
 * beyond the floating-point environment (sdpa_probe_fp_control): the calling thread's
 * CPU affinity, blocked signals, name, scheduling and locale, and the process's signal
 * handlers, working directory, umask, resource limits, interval timers and
 * environment. `probe check` reads it before and after each call, fails a kernel that
 * changed it, and puts it back so that the cases after run in the state they expect.
 */
#ifndef SDPA_PROBE_CALLER_H
#define SDPA_PROBE_CALLER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SDPA_PROBE_CS_CPU_WORDS 16 /* 1024 CPUs */
#define SDPA_PROBE_CS_SIGNALS 65   /* signal numbers 1..64 (0 unused) */
#define SDPA_PROBE_CS_SA_BYTES 256 /* room for one struct sigaction */
#define SDPA_PROBE_CS_RLIMITS 16
#define SDPA_PROBE_CS_TIMERS 3     /* ITIMER_REAL, ITIMER_VIRTUAL, ITIMER_PROF */

typedef struct sdpa_probe_caller_state {
  /* the calling thread */
  int32_t cpus_known;
  uint64_t cpus[SDPA_PROBE_CS_CPU_WORDS]; /* affinity: bit c of word c / 64 */
  int32_t blocked_known;
  uint64_t blocked;                     /* blocked signals: bit s - 1 for signal s */
  int32_t policy, priority, nice;       /* sched_getscheduler, its priority, the nice value */
  char name[32];                        /* prctl(PR_GET_NAME) */
  uint64_t thread_locale;               /* uselocale(0), as an address */
  /* the process */
  int32_t handler_known[SDPA_PROBE_CS_SIGNALS];
  uint64_t handler[SDPA_PROBE_CS_SIGNALS]; /* 0 SIG_DFL, 1 SIG_IGN, else the function */
  uint64_t handler_flags[SDPA_PROBE_CS_SIGNALS];
  uint8_t handler_raw[SDPA_PROBE_CS_SIGNALS][SDPA_PROBE_CS_SA_BYTES]; /* to put it back */
  char locale[512];                     /* setlocale(LC_ALL, NULL) */
  char cwd[1024];                       /* "" when longer or unreadable */
  int32_t umask;                        /* -1: unknown */
  int32_t n_rlimits;
  int64_t rlim_cur[SDPA_PROBE_CS_RLIMITS], rlim_max[SDPA_PROBE_CS_RLIMITS]; /* -1: infinity */
  int64_t timer_value_us[SDPA_PROBE_CS_TIMERS], timer_interval_us[SDPA_PROBE_CS_TIMERS];
} sdpa_probe_caller_state;

/* Fills *s (0, or -1 for a NULL pointer). */
int sdpa_probe_caller_state_read(sdpa_probe_caller_state *s);
/* Puts back what differs between *before and *now (a timer armed since is disarmed);
 * returns how many of the differing parts could not be put back. */
int sdpa_probe_caller_state_restore(const sdpa_probe_caller_state *before,
                                    const sdpa_probe_caller_state *now);
/* The environment as NAME=VALUE strings, each ending in a NUL, into buf (at most cap
 * bytes); returns the bytes it needs. */
int64_t sdpa_probe_environ_text(char *buf, int64_t cap);
/* setenv(name, value, 1), or unsetenv(name) for a NULL value. */
int sdpa_probe_environ_put(const char *name, const char *value);
/* A worker process: SIGKILL when the process that started it (parent_pid) ends, however
 * it ends (prctl PR_SET_PDEATHSIG, Linux); -1 where it cannot be asked for, 1 if the
 * parent has already gone. */
int sdpa_probe_die_with_parent(int64_t parent_pid);

#ifdef __cplusplus
}
#endif
#endif /* SDPA_PROBE_CALLER_H */
