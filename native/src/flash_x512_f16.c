/* The AVX-512 block's copies for F16 K / V: one file per dtype so that they build in parallel. */
#include "flash_x512_block.h"

#ifdef FX512
FX_INST_R(f16, SDPA_F16, SDPA_F16, 0)
#endif
