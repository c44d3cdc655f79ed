/* The fast path's register-tile kernels (flash_tiles.c), instantiated per K / V
 * dtype and rows per tile (nr: 1, 2 or 4) and called through these tables: a
 * tile's scores against a key block, its P.V, the panel's scores against a
 * transposed K block and that transpose (with its dequantisation). */
#ifndef SDPA_PROBE_FLASH_TILES_H
#define SDPA_PROBE_FLASH_TILES_H

#include "flash_internal.h"

typedef void (*fc_scores_fn)(const float *, int64_t, const char *, int64_t, const int32_t *,
                             int64_t, float *, int64_t, fc_prefetch *);
typedef void (*fc_pv_fn)(float *, int64_t, const char *, int64_t, const int32_t *, int64_t,
                         const float *, int64_t);
typedef void (*fc_panel_fn)(const float *, int64_t, const float *, int64_t, int64_t, float *,
                            int64_t);
typedef void (*fc_pack_fn)(const char *, int64_t, const int32_t *, const float *, int64_t, int64_t,
                           float *, int64_t, fc_prefetch *);
#ifdef FC_X86
typedef void (*fc_scores_iq_fn)(const int16_t *, int64_t, const char *, int64_t, int64_t,
                                float *, int64_t, fc_prefetch *);
#endif

/* indexed [dtype][nr] */
extern FC_HIDDEN const fc_scores_fn fc_k_scores[4][5];
extern FC_HIDDEN const fc_pv_fn fc_k_pv[4][5];
/* indexed [nr] */
extern FC_HIDDEN const fc_panel_fn fc_k_scores_panel[5];
/* indexed [dtype] */
extern FC_HIDDEN const fc_pack_fn fc_k_pack_kt[4];
#ifdef FC_X86
/* int8 Q and K, integer Q.K^T; indexed [nr] */
extern FC_HIDDEN const fc_scores_iq_fn fc_k_scores_iq[5];
#endif

#endif
