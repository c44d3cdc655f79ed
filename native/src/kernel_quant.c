/* `quant_int8` and `quant_int8_alloc`: int8 K/V (and optionally Q) with
 * per-token asymmetric quantization, real = (x - zero_point) * scale, one
 * (scale, zero_point) per (batch, position, head) as in ExecuTorch's
 * custom_quantized_sdpa. quant_int8 runs flash_core's fast path: K/V are
 * dequantised in registers ((x - zero_point) in int32, the scales applied to
 * the scores and folded into P; with int8 Q, Q.K^T is exact integer
 * arithmetic), and only the per-key scales of a block go through the per-thread
 * scratch allocated once per call (prefill: the block's dequantised K^T and V).
 * quant_int8_alloc allocates a dequant buffer per key block (the overhead of
 * ExecuTorch PR 15610's quantized SDPA, kept measurable). */
#include "flash_core.h"

static int quant_forward(const sdpa_args *a, int alloc_per_block) {
  int st = sdpa_validate_args(a);
  if (st != SDPA_OK) return st;
  if (a->kv_len > 0 && (a->k.dtype != SDPA_I8 || a->v.dtype != SDPA_I8)) return SDPA_UNSUPPORTED;
  flash_cfg cfg;
  flash_cfg_defaults(&cfg, NULL);
  cfg.alloc_per_block = alloc_per_block;
  return flash_core(a, &cfg);
}

int sdpa_probe_quant_int8_forward(const sdpa_args *a) { return quant_forward(a, 0); }
int sdpa_probe_quant_int8_alloc_forward(const sdpa_args *a) { return quant_forward(a, 1); }

int64_t sdpa_probe_quant_int8_scratch(const sdpa_args *a) {
  flash_cfg cfg;
  flash_cfg_defaults(&cfg, NULL);
  return flash_scratch_bytes(a, &cfg);
}
int64_t sdpa_probe_quant_int8_alloc_scratch(const sdpa_args *a) {
  flash_cfg cfg;
  flash_cfg_defaults(&cfg, NULL);
  cfg.alloc_per_block = 1;
  return flash_scratch_bytes(a, &cfg);
}
