/* blocks.c's rows for CPUs with AVX-512 (F, BW, VL) and VNNI, as products_wide.c is to
   products.c: a 16-lane register holds a row's two sets of eight lanes (even groups low, odd
   groups high), a pair of groups' codes widen as one, and its integer multiply-adds are one
   madd and one dpwssd. Each lane takes the same integer sums and the same float
   multiply-adds, in the same order, as in blocks.c, and the last unpaired group and the final
   sums fold in as there: the outputs are the same bits. Eight activation rows share each
   decoded chunk (blocks.c: four); how many share it does not change a row's bits. */
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")

#include "block_decode.h"
#include "block_steps.h"
#include "blocks.h"
#include "products.h"

/* eight lanes of x, then eight of y */
INLINE __m512 pair_of(float x, float y) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(x)), _mm256_set1_ps(y), 1);
}

/* 16 codes at p and 16 at q, widened: p's in lanes 0..15, q's in 16..31 */
INLINE __m512i widen_two(const int8_t *p, const int8_t *q) {
    const __m256i both = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p)),
        _mm_loadu_si128((const __m128i *)q), 1);
    return _mm512_cvtepi8_epi16(both);
}

/* groups j and j + 1 of the chunk (g even, so the activations hold them as a pair) */
INLINE void pair_rows(const int per32, const Chunk *c, int j, int64_t g, const Activations *a,
                      int64_t b0, int64_t cols, const int tile, float f[][CHUNK / SUB],
                      __m512 *acc) {
    const int8_t *codes = c->codes + GROUP * j;
    const __m512i w0 = widen_two(codes, codes + GROUP);           /* elements 0..15 of both */
    const __m512i w1 = widen_two(codes + 16, codes + GROUP + 16); /* elements 16..31 */
    for (int b = 0; b < tile; b++) {
        const int16_t *q = a->q + (b0 + b) * cols + GROUP * g;
        const __m512i lo = _mm512_loadu_si512((const void *)q);
        const __m512i hi = _mm512_loadu_si512((const void *)(q + GROUP));
        if (per32) {
            const __m512i dot = _mm512_dpwssd_epi32(_mm512_madd_epi16(w0, lo), w1, hi);
            acc[b] = _mm512_fmadd_ps(pair_of(f[b][j], f[b][j + 1]), _mm512_cvtepi32_ps(dot),
                                     acc[b]);
        } else {
            const __m512i d0 = _mm512_madd_epi16(w0, lo), d1 = _mm512_madd_epi16(w1, hi);
            acc[b] = _mm512_fmadd_ps(pair_of(f[b][2 * j], f[b][2 * j + 2]),
                                     _mm512_cvtepi32_ps(d0), acc[b]);
            acc[b] = _mm512_fmadd_ps(pair_of(f[b][2 * j + 1], f[b][2 * j + 3]),
                                     _mm512_cvtepi32_ps(d1), acc[b]);
        }
    }
}

/* a row's last unpaired group (only 32-weight types have one, and they are per32) into the
   even lanes, as blocks.c's group_rows does */
INLINE void last_group(const Chunk *c, int j, int64_t g, const Activations *a, int64_t b0,
                       int64_t cols, const int tile, float f[][CHUNK / SUB], __m512 *acc) {
    const int64_t groups = cols / GROUP;
    __m256i w0, w1;
    i8_halves(c->codes + GROUP * j, &w0, &w1);
    for (int b = 0; b < tile; b++) {
        const __m256i dot = group_dot(w0, w1, a->q + (b0 + b) * cols, g, groups);
        const __m256 even = _mm256_fmadd_ps(_mm256_broadcast_ss(&f[b][j]), _mm256_cvtepi32_ps(dot),
                                            _mm512_castps512_ps256(acc[b]));
        acc[b] = _mm512_insertf32x8(acc[b], even, 0);
    }
}

INLINE void rows_tile(const Decoder decode, const int elements, const int nbytes,
                      const int per32, const int offsets, const uint8_t *data,
                      const int8_t *grid, const Activations *a, int64_t b0, float *y,
                      int64_t rows, int64_t cols, int64_t r0, int64_t r1, const int tile) {
    const int64_t row_bytes = cols / elements * nbytes, groups = cols / GROUP;
    Chunk c = {0};
    float f[WIDE_TILE][CHUNK / SUB];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = data + r * row_bytes;
        __m512 acc[WIDE_TILE];
        __m256 shift[WIDE_TILE];
        for (int b = 0; b < tile; b++) {
            acc[b] = _mm512_setzero_ps();
            shift[b] = _mm256_setzero_ps();
        }
        for (int64_t start = 0; start < cols; start += CHUNK) {
            const int n = cols - start < CHUNK ? (int)(cols - start) : CHUNK;
            decode(row + start / elements * nbytes, n / elements, grid, &c);
            const int64_t g0 = start / GROUP;
            chunk_steps(per32, offsets, &c, g0, n / GROUP, a, b0, groups, tile, f, shift);
            int j = 0;
            for (; j + 2 <= n / GROUP; j += 2)
                pair_rows(per32, &c, j, g0 + j, a, b0, cols, tile, f, acc);
            if (j < n / GROUP) last_group(&c, j, g0 + j, a, b0, cols, tile, f, acc);
        }
        for (int b = 0; b < tile; b++) {
            const __m256 even = _mm512_castps512_ps256(acc[b]);
            const __m256 odd = _mm512_extractf32x8_ps(acc[b], 1);
            y[(b0 + b) * rows + r] = sum8(_mm256_add_ps(even, odd)) + sum8(shift[b]);
        }
    }
}

#define WIDE_ROWS(NAME, E, B, P, O)                                                           \
    void swarm_wide_rows_##NAME(const uint8_t *data, const int8_t *grid, const Activations *a, \
                                int64_t b0, float *y, int64_t rows, int64_t cols, int64_t r0,  \
                                int64_t r1, int tile) {                                        \
        switch (tile) {                                                                        \
        case 1: rows_tile(NAME, E, B, P, O, data, grid, a, b0, y, rows, cols, r0, r1, 1); break; \
        case 2: rows_tile(NAME, E, B, P, O, data, grid, a, b0, y, rows, cols, r0, r1, 2); break; \
        case 3: rows_tile(NAME, E, B, P, O, data, grid, a, b0, y, rows, cols, r0, r1, 3); break; \
        case 4: rows_tile(NAME, E, B, P, O, data, grid, a, b0, y, rows, cols, r0, r1, 4); break; \
        case 5: rows_tile(NAME, E, B, P, O, data, grid, a, b0, y, rows, cols, r0, r1, 5); break; \
        case 6: rows_tile(NAME, E, B, P, O, data, grid, a, b0, y, rows, cols, r0, r1, 6); break; \
        case 7: rows_tile(NAME, E, B, P, O, data, grid, a, b0, y, rows, cols, r0, r1, 7); break; \
        default:                                                                               \
            rows_tile(NAME, E, B, P, O, data, grid, a, b0, y, rows, cols, r0, r1, WIDE_TILE);  \
        }                                                                                      \
    }

#define BLOCK_KIND(NAME, GGUF, E, B, P, O) WIDE_ROWS(NAME, E, B, P, O)
#include "block_kinds.h"
