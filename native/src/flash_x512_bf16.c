/* The AVX-512 block's copies for BF16 K / V: one file per dtype so that they build in parallel. */
#include "flash_x512_block.h"

#ifdef FX512
FX_INST_R(bf16, SDPA_BF16, SDPA_BF16, 0)
#endif
