/*
 * sdpa_probe_fence.h -- input buffers placed flush against an inaccessible page, so
 * that a kernel touching one byte past a tensor's end (a full vector loaded over a
 * row's tail, a block of keys read past kv_len) or before its start faults at once,
 * where an ordinary allocation's slack would hand it a value it then discards.
 * A SIGSEGV / SIGBUS handler names the fence a fault hit (on standard error) and
 * hands the fault on to the handler it replaced, so the process still dies.
 */
#ifndef SDPA_PROBE_FENCE_H
#define SDPA_PROBE_FENCE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SDPA_PROBE_FENCE_AFTER 0  /* the last byte ends a page; the next page is PROT_NONE */
#define SDPA_PROBE_FENCE_BEFORE 1 /* the first byte starts a page; the one before is PROT_NONE */
#define SDPA_PROBE_FENCE_LABEL 48 /* bytes of a fence's label kept, NUL included */

/* nbytes (>= 0) of zeroed, writable memory fenced on one side, or NULL (errno set).
 * The first call installs the fault handler. */
void *sdpa_probe_fence_alloc(int64_t nbytes, int32_t where, const char *label);
/* Unmaps what sdpa_probe_fence_alloc returned: 0, or -1 if data is not a live fence. */
int sdpa_probe_fence_free(void *data);
/* The fence an address falls in: its label copied into label (cap bytes) and the
 * distance in bytes past the buffer's end (where AFTER) or before its start (BEFORE),
 * 1 for the first byte; 0 if the address is in no fence. */
int64_t sdpa_probe_fence_find(uint64_t address, char *label, int64_t cap);

/* Address space reserved and not committed (PROT_NONE, MAP_NORESERVE: no limit on
 * writable memory counts it), then made readable and writable where it is used: the
 * far layout's batches, gigabytes apart. NULL / -1 with errno on failure. */
void *sdpa_probe_reserve(int64_t nbytes);
int sdpa_probe_commit(void *base, int64_t offset, int64_t nbytes);
int sdpa_probe_release(void *base, int64_t nbytes);

#ifdef __cplusplus
}
#endif

#endif
