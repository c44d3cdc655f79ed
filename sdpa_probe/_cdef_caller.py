"""cffi declarations of the caller-state part of the native library (see _cdefs.PARTS).

Mirrors native/include/sdpa_probe_caller.h (what a kernel call must leave as it found it).
"""

CDEF = """
#define SDPA_PROBE_CS_CPU_WORDS 16
#define SDPA_PROBE_CS_SIGNALS 65
#define SDPA_PROBE_CS_SA_BYTES 256
#define SDPA_PROBE_CS_RLIMITS 16
#define SDPA_PROBE_CS_TIMERS 3
typedef struct sdpa_probe_caller_state {
  int32_t cpus_known; uint64_t cpus[16];
  int32_t blocked_known; uint64_t blocked;
  int32_t policy, priority, nice;
  char name[32];
  uint64_t thread_locale;
  int32_t handler_known[65]; uint64_t handler[65]; uint64_t handler_flags[65];
  uint8_t handler_raw[65][256];
  char locale[512];
  char cwd[1024];
  int32_t umask;
  int32_t n_rlimits; int64_t rlim_cur[16], rlim_max[16];
  int64_t timer_value_us[3], timer_interval_us[3];
} sdpa_probe_caller_state;
int sdpa_probe_caller_state_read(sdpa_probe_caller_state *s);
int sdpa_probe_caller_state_restore(const sdpa_probe_caller_state *before,
                                    const sdpa_probe_caller_state *now);
int64_t sdpa_probe_environ_text(char *buf, int64_t cap);
int sdpa_probe_environ_put(const char *name, const char *value);
int sdpa_probe_die_with_parent(int64_t parent_pid);
"""
INCLUDE = '#include "sdpa_probe_caller.h"\n'
