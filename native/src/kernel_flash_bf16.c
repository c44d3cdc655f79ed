/* `flash_bf16`: flash with prefill's Q.K^T and P.V as BF16 products on the AMX tiles
 * (F32 softmax and accumulation; flash_amx.c). Decode and the shapes the tiles do not
 * take (head_dim not a multiple of 32) run flash's F32 paths. On a CPU or kernel
 * without AMX-BF16 every call is refused (SDPA_UNSUPPORTED), and
 * sdpa_probe_flash_bf16_why says why. */
#include "flash_amx.h"

const char *sdpa_probe_flash_bf16_why(void) { return flash_amx_why(); }

static int flash_bf16_dtype_ok(const sdpa_args *a) {
  if (a->q.dtype == SDPA_I8) return 0;
  if (a->kv_len > 0 && (a->k.dtype == SDPA_I8 || a->v.dtype == SDPA_I8)) return 0;
  return 1;
}

int sdpa_probe_flash_bf16_forward(const sdpa_args *a) {
  int st = sdpa_validate_args(a);
  if (st != SDPA_OK) return st;
  if (!flash_bf16_dtype_ok(a) || !flash_amx_available()) return SDPA_UNSUPPORTED;
  flash_cfg cfg;
  flash_cfg_defaults(&cfg, NULL);
  cfg.bf16_products = 1;
  return flash_core(a, &cfg);
}

int64_t sdpa_probe_flash_bf16_scratch(const sdpa_args *a) {
  flash_cfg cfg;
  flash_cfg_defaults(&cfg, NULL);
  cfg.bf16_products = 1;
  return flash_scratch_bytes(a, &cfg);
}
