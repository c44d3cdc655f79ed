"""cffi declarations of the fenced-buffer part of the native library (see _cdefs.PARTS).

Mirrors native/include/sdpa_probe_fence.h (inputs flush against an inaccessible page).
"""

CDEF = """
#define SDPA_PROBE_FENCE_AFTER 0
#define SDPA_PROBE_FENCE_BEFORE 1
void *sdpa_probe_fence_alloc(int64_t nbytes, int32_t where, const char *label);
int sdpa_probe_fence_free(void *data);
int64_t sdpa_probe_fence_find(uint64_t address, char *label, int64_t cap);
void *sdpa_probe_reserve(int64_t nbytes);
int sdpa_probe_commit(void *base, int64_t offset, int64_t nbytes);
int sdpa_probe_release(void *base, int64_t nbytes);
"""
INCLUDE = '#include "sdpa_probe_fence.h"\n'
