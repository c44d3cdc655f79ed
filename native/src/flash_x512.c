/* The AVX-512 block path's entry points: its scratch sizes, the Q packing and the
 * dispatch to the block copies (flash_x512_block.h has the block itself). */
#include "flash_x512_block.h"


int64_t flash_x512_scratch_floats(int64_t nh, int64_t R, int64_t kv_block) {
  const int64_t rows = FX_PAD16(nh * R);
  return kv_block * rows + 2 * rows + rows / 16; /* S[key][row], alpha[row], mx[row], NaN masks */
}

int64_t flash_x512_packed_q_floats(int64_t nh, int64_t R, int64_t D) {
  return FX_PAD16(nh * R) * (D + 16); /* F32: D per row; int16: D rounded up to 32, halved */
}

#ifndef FX512

int flash_x512_available(void) { return 0; }
void flash_x512_pack_q(const void *Q, int64_t nh, int64_t R, int64_t D, int64_t head_stride,
                       const float *qz, const float *qs, void *Qp) {
  (void)Q, (void)nh, (void)R, (void)D, (void)head_stride, (void)qz, (void)qs, (void)Qp;
}
void flash_x512_run(const flash_x512_block *b) { (void)b; }

#else

int flash_x512_available(void) { return 1; }

/* F32: Qp[chunk][d / 16][lane][16], int16: Qp[chunk][d / 32][lane][32], rows
 * past nh * R and dims past D zero. A chunk is 16 rows. Transposed int8 Q.K^T
 * (FX_IQT): int32 zq[row], int32 128 sum(q - zq)[row], then int8 q[row][D],
 * rows padded to a multiple of 16. */
void flash_x512_pack_q(const void *Q, int64_t nh, int64_t R, int64_t D, int64_t head_stride,
                       const float *qz, const float *qs, void *Qp) {
  const int64_t rows = nh * R, nch = (rows + 15) / 16;
  if (qz && FX_IQT(R)) {
    int32_t *cz = (int32_t *)Qp, *cs = cz + 16 * nch;
    int8_t *q = (int8_t *)(cs + 16 * nch);
    memset(Qp, 0, (size_t)(16 * nch * (8 + D)));
    for (int64_t row = 0; row < rows; row++) {
      const int64_t h = row / R, r = row % R;
      const int16_t *v = (const int16_t *)Q + h * head_stride + r * D; /* q - zq */
      const int32_t zq = (int32_t)qz[h * R + r];
      for (int64_t d = 0; d < D; d++) q[row * D + d] = (int8_t)(v[d] + zq);
      cz[row] = zq;
      cs[row] = 128 * (int32_t)qs[h * R + r]; /* (an integer, exact in float) */
    }
    return;
  }
  const int iqk = qz != NULL;
  const int64_t step = iqk ? 32 : 16, esz = iqk ? 2 : 4;
  char *o = (char *)Qp;
  for (int64_t c = 0; c < nch; c++)
    for (int64_t d = 0; d < D; d += step)
      for (int64_t f = 0; f < 16; f++, o += step * esz) {
        const int64_t row = c * 16 + f;
        memset(o, 0, (size_t)(step * esz));
        if (row < rows) {
          const int64_t w = D - d < step ? D - d : step;
          const char *src = (const char *)Q + ((row / R) * head_stride + (row % R) * D + d) * esz;
          memcpy(o, src, (size_t)(w * esz));
        }
      }
}


typedef void (*fx_block_fn)(const flash_x512_block *);
#define FX_ROW(NAME)                                                                  \
  {flash_x512_blk_##NAME##_1, flash_x512_blk_##NAME##_2, flash_x512_blk_##NAME##_4,  \
   flash_x512_blk_##NAME##_8, flash_x512_blk_##NAME##_16}
/* [f32, f16, bf16, i8, integer Q.K^T][R = 1, 2, 4, 8, 16] */
static const fx_block_fn k_blk[5][5] = {FX_ROW(f32), FX_ROW(f16), FX_ROW(bf16), FX_ROW(i8), FX_ROW(iq)};
#undef FX_ROW

void flash_x512_run(const flash_x512_block *b) {
  if (b->n <= 0) return;
  const int ri = b->R == 1 ? 0 : b->R == 2 ? 1 : b->R == 4 ? 2 : b->R == 8 ? 3 : 4;
  k_blk[b->iqk ? 4 : b->kdt][ri](b);
}

#endif
