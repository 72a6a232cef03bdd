/* What blocks.c and blocks_wide.c share beside the decoders: a chunk's scales times its
   activations' steps, and its offsets times their sums, computed the same way for both. */
#ifndef SWARM_BLOCK_STEPS_H
#define SWARM_BLOCK_STEPS_H

#include "block_decode.h"
#include "blocks.h"
#include "byte_rows.h"
#include "products.h"

typedef void (*Decoder)(const uint8_t *src, int blocks, const int8_t *grid, Chunk *out);

/* which byte_rows.h kind a decoder's blocks run as, or -1 (the general rows below) */
INLINE int byte_kind(Decoder decode) {
    return decode == q8_0     ? BYTE_Q8_0
           : decode == q5_0   ? BYTE_Q5_0
           : decode == q5_1   ? BYTE_Q5_1
           : decode == q4_0   ? BYTE_Q4_0
           : decode == iq4_nl ? BYTE_IQ4_NL
                              : -1;
}

/* each row's scale * step for a chunk of `count` groups from group g0, into f[b]; the
   offsets' products with the activations' float sums into shift[b] (a lane per group, or per
   16 weights). A whole chunk (8 groups) as vectors, a row's shorter last chunk one by one:
   either way the same for a row whatever its batch. */
INLINE void chunk_steps(const int per32, const int offsets, const Chunk *c, int64_t g0,
                        int count, const Activations *a, int64_t b0, int64_t groups,
                        const int tile, float f[][CHUNK / SUB], __m256 *shift) {
    for (int b = 0; b < tile; b++) {
        const int64_t ag = (b0 + b) * groups + g0;
        if (count == CHUNK / GROUP && per32) {
            _mm256_storeu_ps(f[b], _mm256_mul_ps(_mm256_loadu_ps(c->scale),
                                                 _mm256_loadu_ps(a->step + ag)));
            if (offsets)
                shift[b] = _mm256_fmadd_ps(_mm256_loadu_ps(c->offset),
                                           _mm256_loadu_ps(a->sum + ag), shift[b]);
        } else if (count == CHUNK / GROUP) {
            const __m256 steps = _mm256_loadu_ps(a->step + ag);
            const __m256 low = _mm256_permutevar8x32_ps(steps, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
            const __m256 high = _mm256_permutevar8x32_ps(steps, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7));
            _mm256_storeu_ps(f[b], _mm256_mul_ps(_mm256_loadu_ps(c->scale), low));
            _mm256_storeu_ps(f[b] + 8, _mm256_mul_ps(_mm256_loadu_ps(c->scale + 8), high));
            if (offsets) {
                const float *h = a->half + 2 * ag;
                shift[b] = _mm256_fmadd_ps(_mm256_loadu_ps(c->offset), _mm256_loadu_ps(h), shift[b]);
                shift[b] = _mm256_fmadd_ps(_mm256_loadu_ps(c->offset + 8), _mm256_loadu_ps(h + 8),
                                           shift[b]);
            }
        } else { /* only 32-weight types have short chunks, and they are per32 */
            float tail = 0.f;
            for (int j = 0; j < count; j++) {
                f[b][j] = c->scale[j] * a->step[ag + j];
                if (offsets) tail += c->offset[j] * a->sum[ag + j];
            }
            if (offsets) shift[b] = _mm256_add_ps(shift[b], _mm256_setr_ps(tail, 0, 0, 0, 0, 0, 0, 0));
        }
    }
}

#endif
