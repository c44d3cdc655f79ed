/* The AVX-512 block's copies for int8 Q, K and V (integer Q.K^T): one file per dtype so that they build in parallel. */
#include "flash_x512_block.h"

#ifdef FX512
FX_INST_R(iq, SDPA_I8, SDPA_I8, 1)
#endif
