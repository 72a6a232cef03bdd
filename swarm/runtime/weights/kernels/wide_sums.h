/* The AVX-512 rows' sums (blocks_wide.c, kquant_rows_wide.h): per output row k and activation
   row b, 16 float lanes and eight offset lanes, started at zero and folded into y as the AVX2
   rows fold theirs (lanes 0..7 plus lanes 8..15, then the offsets' lanes), so that both give
   the same bits. For blocks_wide.c's target pragma only. */
#ifndef SWARM_WIDE_SUMS_H
#define SWARM_WIDE_SUMS_H

#include "products.h"

INLINE void wide_sums_start(__m512 acc[][WIDE_TILE], __m256 shift[][WIDE_TILE], const int R,
                            const int tile) {
    for (int k = 0; k < R; k++)
        for (int b = 0; b < tile; b++) {
            acc[k][b] = _mm512_setzero_ps();
            shift[k][b] = _mm256_setzero_ps();
        }
}

/* y[(b0 + b) * rows + r + k] for each output row k and activation row b */
INLINE void wide_sums_fold(__m512 acc[][WIDE_TILE], __m256 shift[][WIDE_TILE], const int R,
                           const int tile, float *y, int64_t rows, int64_t b0, int64_t r) {
    for (int k = 0; k < R; k++)
        for (int b = 0; b < tile; b++) {
            const __m256 low = _mm512_castps512_ps256(acc[k][b]);
            const __m256 high = _mm512_extractf32x8_ps(acc[k][b], 1);
            y[(b0 + b) * rows + r + k] = sum8(_mm256_add_ps(low, high)) + sum8(shift[k][b]);
        }
}

#endif
