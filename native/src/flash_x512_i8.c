/* The AVX-512 block's copies for int8 K / V, float Q: one file per dtype so that they build in parallel. */
#include "flash_x512_block.h"

#ifdef FX512
FX_INST_R(i8, SDPA_I8, SDPA_I8, 0)
#endif
