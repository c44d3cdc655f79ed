/* The registry of built-in kernels: name, dtypes, features, entry points. */
#include "common.h"

int sdpa_probe_decomposed_forward(const sdpa_args *a);
int sdpa_probe_flash_forward(const sdpa_args *a);
int sdpa_probe_flash_maskskip_forward(const sdpa_args *a);
int64_t sdpa_probe_flash_maskskip_scratch(const sdpa_args *a);
int sdpa_probe_quant_int8_forward(const sdpa_args *a);
int sdpa_probe_quant_int8_alloc_forward(const sdpa_args *a);
int64_t sdpa_probe_decomposed_scratch(const sdpa_args *a);
int64_t sdpa_probe_flash_scratch(const sdpa_args *a);
int sdpa_probe_flash_bf16_forward(const sdpa_args *a);
int64_t sdpa_probe_flash_bf16_scratch(const sdpa_args *a);
int64_t sdpa_probe_quant_int8_scratch(const sdpa_args *a);
int64_t sdpa_probe_quant_int8_alloc_scratch(const sdpa_args *a);

#define DT(x) (1u << (x))
#define FLOATS (DT(SDPA_F32) | DT(SDPA_F16) | DT(SDPA_BF16))
#define COMMON (SDPA_FEAT_CAUSAL | SDPA_FEAT_MASK | SDPA_FEAT_STRIDED)
#define FLASHF (COMMON | SDPA_FEAT_GQA_IN_KERNEL | SDPA_FEAT_ONLINE_SOFTMAX | SDPA_FEAT_SPLIT_K)

typedef struct {
  sdpa_probe_kernel_info info;
  int (*forward)(const sdpa_args *);
  int64_t (*scratch)(const sdpa_args *);
} entry;

static const entry k_registry[] = {
    {{"decomposed", "materialised GQA broadcast + full score matrix + softmax + PV (export baseline)",
      FLOATS | DT(SDPA_I8), COMMON | SDPA_FEAT_GQA_BROADCAST | SDPA_FEAT_FULL_SCORES |
                                SDPA_FEAT_PER_TOKEN_I8},
     sdpa_probe_decomposed_forward, sdpa_probe_decomposed_scratch},
    {{"flash", "tiled online softmax, GQA in-kernel, split-k over long kv", FLOATS, FLASHF},
     sdpa_probe_flash_forward, sdpa_probe_flash_scratch},
    {{"flash_bf16",
      "flash with prefill's Q.K^T and P.V as BF16 products on the AMX tiles (F32 softmax and "
      "accumulation); refuses every call where the AMX-BF16 tiles cannot be used",
      FLOATS, FLASHF | SDPA_FEAT_BF16_PRODUCTS},
     sdpa_probe_flash_bf16_forward, sdpa_probe_flash_bf16_scratch},
    {{"flash_maskskip", "flash + mask-range precompute: skips hidden key blocks and zero-mask adds",
      FLOATS, FLASHF | SDPA_FEAT_MASK_SKIP},
     sdpa_probe_flash_maskskip_forward, sdpa_probe_flash_maskskip_scratch},
    {{"quant_int8", "int8 per-token K/V dequantised in registers; exact integer Q.K^T for int8 Q",
      FLOATS | DT(SDPA_I8), FLASHF | SDPA_FEAT_PER_TOKEN_I8},
     sdpa_probe_quant_int8_forward, sdpa_probe_quant_int8_scratch},
    {{"quant_int8_alloc",
      "quant_int8 allocating its dequant buffers per key block (ExecuTorch PR 15610's pattern)",
      FLOATS | DT(SDPA_I8), FLASHF | SDPA_FEAT_PER_TOKEN_I8 | SDPA_FEAT_ALLOC_PER_BLOCK},
     sdpa_probe_quant_int8_alloc_forward, sdpa_probe_quant_int8_alloc_scratch},
};

#define N_KERNELS ((int64_t)(sizeof k_registry / sizeof k_registry[0]))

int64_t sdpa_probe_kernel_count(void) { return N_KERNELS; }

const sdpa_probe_kernel_info *sdpa_probe_kernel_get(int64_t i) {
  return (i >= 0 && i < N_KERNELS) ? &k_registry[i].info : NULL;
}

int sdpa_probe_kernel_forward(int64_t i, const sdpa_args *a) {
  if (i < 0 || i >= N_KERNELS) return SDPA_INVALID;
  return k_registry[i].forward(a);
}

int64_t sdpa_probe_kernel_scratch_bytes(int64_t i, const sdpa_args *a) {
  if (i < 0 || i >= N_KERNELS || sdpa_validate_args(a) != SDPA_OK) return -1;
  return k_registry[i].scratch(a);
}
