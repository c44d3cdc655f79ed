/* `flash`: tiled online softmax over F32 / F16 / BF16 storage, F32 accumulation. */
#include "flash_core.h"

static int flash_dtype_ok(const sdpa_args *a) {
  if (a->q.dtype == SDPA_I8) return 0;
  if (a->kv_len > 0 && (a->k.dtype == SDPA_I8 || a->v.dtype == SDPA_I8)) return 0;
  return 1;
}

int sdpa_probe_flash_forward_ex(const sdpa_args *a, const sdpa_probe_flash_opts *opts) {
  int st = sdpa_validate_args(a);
  if (st != SDPA_OK) return st;
  if (!flash_dtype_ok(a)) return SDPA_UNSUPPORTED;
  flash_cfg cfg;
  flash_cfg_defaults(&cfg, opts);
  return flash_core(a, &cfg);
}

int sdpa_probe_flash_forward(const sdpa_args *a) { return sdpa_probe_flash_forward_ex(a, NULL); }

int64_t sdpa_probe_flash_scratch(const sdpa_args *a) {
  flash_cfg cfg;
  flash_cfg_defaults(&cfg, NULL);
  return flash_scratch_bytes(a, &cfg);
}
