"""cffi declarations of the machine part of the native library (see _cdefs.PARTS).

Mirrors native/include/sdpa_probe_machine.h (micro-benchmarks behind `probe info`).
"""

CDEF = """
#define SDPA_PROBE_MB_OK 0
#define SDPA_PROBE_MB_EINVAL 2
#define SDPA_PROBE_MB_ENOMEM 3
#define SDPA_PROBE_MB_MAX_REPS 256
typedef struct sdpa_probe_mb_result {
  double best; double median; double worst; double best_seconds; double total_seconds;
  int64_t work; int64_t reps; int32_t n_threads;
} sdpa_probe_mb_result;
typedef struct sdpa_probe_mb_buffer sdpa_probe_mb_buffer;
int sdpa_probe_mb_buffer_new(int64_t bytes, int32_t n_threads, sdpa_probe_mb_buffer **out);
void sdpa_probe_mb_buffer_free(sdpa_probe_mb_buffer *buf);
int64_t sdpa_probe_mb_buffer_bytes(const sdpa_probe_mb_buffer *buf);
int sdpa_probe_mb_read(sdpa_probe_mb_buffer *buf, int32_t n_threads, int64_t passes,
                       int64_t reps, sdpa_probe_mb_result *out);
int sdpa_probe_mb_fma(int32_t n_threads, int64_t iters_per_thread, int64_t reps,
                      sdpa_probe_mb_result *out);
int sdpa_probe_mb_convert(int32_t dtype, int32_t n_threads, int64_t iters_per_thread,
                          int64_t reps, sdpa_probe_mb_result *out);
int sdpa_probe_mb_fma_config(int32_t *chains, int32_t *lanes, int32_t *fused);
"""
INCLUDE = '#include "sdpa_probe_machine.h"\n'
