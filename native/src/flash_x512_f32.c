/* The AVX-512 block's copies for F32 K / V: one file per dtype so that they build in parallel. */
#include "flash_x512_block.h"

#ifdef FX512
FX_INST_R(f32, SDPA_F32, SDPA_F32, 0)
#endif
