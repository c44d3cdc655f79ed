/* A kernel call whose output is copied the moment the call returns: what the output
 * holds later, against this copy, shows a write made after the call had returned
 * (a worker thread the kernel did not wait for, a barrier released before the last
 * store), which a check reading the output a few microseconds later would miss. */
#include <string.h>

#include "common.h"

int sdpa_probe_call_watched(sdpa_probe_forward_fn fn, int64_t kernel_index, const sdpa_args *a,
                            const void *watch, void *copy, int64_t nbytes) {
  if (a == NULL || nbytes < 0 || (nbytes > 0 && (watch == NULL || copy == NULL)))
    return SDPA_INVALID;
  const int st = fn ? fn(a) : sdpa_probe_kernel_forward(kernel_index, a);
  if (nbytes > 0) memcpy(copy, watch, (size_t)nbytes);
  return st;
}
