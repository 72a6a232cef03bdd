/* Q6_K times one activation row on AVX-512 VNNI, its blocks decoded in registers: the decode
   step's case, where blocks_wide.c's general rows spend most of their time writing each
   chunk's codes and scales to memory and reading them back. Included by blocks_wide.c only
   (its target pragma, its helpers).

   Each lane sees the operations blocks_wide.c's rows give it, in the same order, so the
   outputs are the same bits (tests/test_block_kernel.py compares both, and the AVX2 rows):
   * the scales: d * sub-scale, as q6_k's decoder computes them; then each times its group's
     step, as chunk_steps does for types with scales per 16 weights;
   * a pair of groups: madd of elements 0..15 and of 16..31 with the rounded activations, each
     converted and multiply-added into the row's accumulator with its sub-block's factor,
     elements 0..15 first, as pair_rows does; groups in the chunk's order.
   Two output rows run side by side (two chains of multiply-adds), as rows_block does. */
#ifndef SWARM_Q6K_ONE_ROW_H
#define SWARM_Q6K_ONE_ROW_H

/* group 4c + s's 32 codes (less 32) from a block's ql, qh: the low or high nibble of
   ql[64c + 32(s % 2) + t] (high from s = 2 on), bits 2s..2s+1 of qh[32c + t] on top */
INLINE __m256i q6k_group(const uint8_t *ql, const uint8_t *qh, int c, int s) {
    const __m256i q = _mm256_loadu_si256((const __m256i *)(ql + 64 * c + 32 * (s % 2)));
    const __m256i h = _mm256_loadu_si256((const __m256i *)(qh + 32 * c));
    const __m256i low = field(q, 4 * (s / 2), 0x0F);
    const __m256i code = _mm256_or_si256(low, _mm256_slli_epi16(field(h, 2 * s, 3), 4));
    return _mm256_sub_epi8(code, _mm256_set1_epi8(32));
}

/* lanes 0..7 take factor k, lanes 8..15 factor k + 2 (the pair's second group's) */
INLINE __m512i q6k_pick(int k) {
    return _mm512_inserti64x4(_mm512_set1_epi32(k), _mm256_set1_epi32(k + 2), 1);
}

/* rows r..r + R - 1 of a Q6_K matrix times activation row b */
INLINE void q6k_rows_one(const uint8_t *data, const Activations *a, int64_t b, float *y,
                         int64_t rows, int64_t cols, int64_t r, const int R) {
    const int64_t row_bytes = cols / 256 * 210, groups = cols / GROUP;
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const int16_t *q = a->q + b * cols;
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t start = 0; start < cols; start += 256) {
        const int64_t g0 = start / GROUP;
        /* group g's step in lanes 2(g - g0) and 2(g - g0) + 1, one per sub-block of 16 */
        const __m512 steps =
            _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(a->step + b * groups + g0)));
        __m512 f[2];
        const uint8_t *block[2];
        for (int k = 0; k < R; k++) {
            block[k] = data + (r + k) * row_bytes + start / 256 * 210;
            for (int at = 0; at < 256; at += 64)
                _mm_prefetch((const char *)(block[k] + BLOCK_PREFETCH_AHEAD + at), _MM_HINT_T0);
            const __m128i sc = _mm_loadu_si128((const __m128i *)(block[k] + 192));
            const __m512 d = _mm512_set1_ps(half(block[k] + 208));
            const __m512 scale = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));
            f[k] = _mm512_mul_ps(scale, steps);
        }
        for (int c = 0; c < 2; c++)
            for (int s = 0; s < 4; s += 2) {
                const int j = 4 * c + s; /* the pair's first group within the chunk */
                const __m512i lo = _mm512_loadu_si512((const void *)(q + GROUP * (g0 + j)));
                const __m512i hi = _mm512_loadu_si512((const void *)(q + GROUP * (g0 + j + 1)));
                for (int k = 0; k < R; k++) {
                    const __m256i x = q6k_group(block[k], block[k] + 128, c, s);
                    const __m256i z = q6k_group(block[k], block[k] + 128, c, s + 1);
                    const __m512i w0 = _mm512_cvtepi8_epi16(_mm256_permute2x128_si256(x, z, 0x20));
                    const __m512i w1 = _mm512_cvtepi8_epi16(_mm256_permute2x128_si256(x, z, 0x31));
                    const __m512i d0 = _mm512_madd_epi16(w0, lo), d1 = _mm512_madd_epi16(w1, hi);
                    acc[k] = _mm512_fmadd_ps(_mm512_permutexvar_ps(q6k_pick(2 * j), f[k]),
                                             _mm512_cvtepi32_ps(d0), acc[k]);
                    acc[k] = _mm512_fmadd_ps(_mm512_permutexvar_ps(q6k_pick(2 * j + 1), f[k]),
                                             _mm512_cvtepi32_ps(d1), acc[k]);
                }
            }
    }
    for (int k = 0; k < R; k++) {
        const __m256 even = _mm512_castps512_ps256(acc[k]);
        const __m256 odd = _mm512_extractf32x8_ps(acc[k], 1);
        /* + 0: the general rows add their (empty) offsets' sum */
        y[b * rows + r + k] = sum8(_mm256_add_ps(even, odd)) + 0.f;
    }
}

#endif
