/* The grid types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) for the K-quant rows
   (kquant_rows.h): 32 of a block's values at a time in a register, and its integer
   sub-scales, so that these types multiply 8-bit activations as IQ4_XS does.

   Each value is a grid entry's (4 or 8 small values, the `gguf` package's tables handed in as
   int8) with its sign, as block_decode.h's decoders give them one at a time: entries come
   from 64-bit (or 32-bit) loads, and signs apply as byte masks (bit_bytes), negating where
   set. Every type's scale is an odd integer (2x + 1) times d and a power of two, so a block's
   sub-scales are those integers and its factor d times that power (exact): IQ2's d / 8,
   IQ3_XXS's d / 4, IQ3_S's d; IQ1's values are eighths (8v +- 1, as the decoders give them),
   their factor d / 8. */
#ifndef SWARM_GRID_CODES_H
#define SWARM_GRID_CODES_H

#include "block_decode.h"
#include "products.h"

enum { GRID_IQ2_XXS, GRID_IQ2_XS, GRID_IQ2_S, GRID_IQ3_XXS, GRID_IQ3_S, GRID_IQ1_S, GRID_IQ1_M };

INLINE int64_t grid_block_size(const int type) {
    static const int64_t sizes[] = {66, 74, 82, 98, 110, 50, 56};
    return sizes[type];
}

/* one scale per 16 values (IQ2_XS, IQ2_S, IQ1_M), else per 32 */
INLINE int grid_per16(const int type) {
    return type == GRID_IQ2_XS || type == GRID_IQ2_S || type == GRID_IQ1_M;
}

INLINE int64_t entry8(const int8_t *grid, int index) {
    int64_t v;
    __builtin_memcpy(&v, grid + 8 * index, 8);
    return v;
}

INLINE int entry4(const int8_t *grid, int index) {
    int v;
    __builtin_memcpy(&v, grid + 4 * index, 4);
    return v;
}

/* four 8-value entries as 32 values */
INLINE __m256i entries8(const int8_t *grid, int i0, int i1, int i2, int i3) {
    return _mm256_setr_epi64x(entry8(grid, i0), entry8(grid, i1), entry8(grid, i2), entry8(grid, i3));
}

/* v negated where bit k of `signs` is set, for value k */
INLINE __m256i with_signs(__m256i v, uint32_t signs) {
    const __m256i negate = bit_bytes(signs);
    return _mm256_sub_epi8(_mm256_xor_si256(v, negate), negate);
}

/* four 7-bit sign indices (bits 0..27 of aux) as 32 sign bits */
INLINE uint32_t signs32(uint32_t aux) {
    return (uint32_t)signs8(aux & 0x7F) | (uint32_t)signs8((aux >> 7) & 0x7F) << 8 |
           (uint32_t)signs8((aux >> 14) & 0x7F) << 16 | (uint32_t)signs8((aux >> 21) & 0x7F) << 24;
}

/* IQ1's eight values of an entry as eighths, 8v + delta (delta +-1 as a byte, in every byte
   of its lane): the entries' -1, 0, 1 signed onto 8 */
INLINE __m256i eighths(__m256i v, __m256i delta) {
    return _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), v), delta);
}

INLINE int64_t iq1_delta(int negative) { return negative ? -1 : 0x0101010101010101LL; }

/* values 32j .. 32j + 31 of a block */
INLINE __m256i grid_values(const int type, const uint8_t *src, const int8_t *grid, int j) {
    if (type == GRID_IQ2_XXS) { /* sub-block j: four index bytes, then a word of signs and scale */
        const uint8_t *sub = src + 2 + 8 * j;
        return with_signs(entries8(grid, sub[0], sub[1], sub[2], sub[3]), signs32(word32(sub + 4)));
    }
    if (type == GRID_IQ2_XS) { /* words 4j..4j+3: a 9-bit index, a 7-bit sign index */
        int index[4];
        uint32_t signs = 0;
        for (int l = 0; l < 4; l++) {
            const uint16_t q = word16(src + 2 + 2 * (4 * j + l));
            index[l] = q & 511;
            signs |= (uint32_t)signs8(q >> 9) << (8 * l);
        }
        return with_signs(entries8(grid, index[0], index[1], index[2], index[3]), signs);
    }
    if (type == GRID_IQ2_S) { /* qs, two bits of qh on top; a sign byte per entry */
        const uint8_t *qs = src + 2 + 4 * j;
        const int high = src[66 + j];
        return with_signs(entries8(grid, qs[0] | (high & 3) << 8, qs[1] | (high >> 2 & 3) << 8,
                                   qs[2] | (high >> 4 & 3) << 8, qs[3] | (high >> 6 & 3) << 8),
                          word32(src + 34 + 4 * j));
    }
    if (type == GRID_IQ3_XXS) { /* eight 4-value entries; the word's signs */
        const uint8_t *qs = src + 2 + 8 * j;
        const __m256i v = _mm256_setr_epi32(entry4(grid, qs[0]), entry4(grid, qs[1]), entry4(grid, qs[2]),
                                            entry4(grid, qs[3]), entry4(grid, qs[4]), entry4(grid, qs[5]),
                                            entry4(grid, qs[6]), entry4(grid, qs[7]));
        return with_signs(v, signs32(word32(src + 66 + 4 * j)));
    }
    if (type == GRID_IQ3_S) { /* qs, a bit of qh on top; four sign bits an entry */
        const uint8_t *qs = src + 2 + 8 * j;
        const int high = src[66 + j];
        int e[8];
        for (int m = 0; m < 8; m++) e[m] = entry4(grid, qs[m] | (high >> m & 1) << 8);
        return with_signs(_mm256_setr_epi32(e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7]),
                          word32(src + 74 + 4 * j));
    }
    if (type == GRID_IQ1_S) { /* qs, three bits of qh on top; qh's top bit the delta's sign */
        const uint8_t *qs = src + 2 + 4 * j;
        const uint16_t qh = word16(src + 34 + 2 * j);
        const __m256i v = entries8(grid, qs[0] | (qh & 7) << 8, qs[1] | (qh >> 3 & 7) << 8,
                                   qs[2] | (qh >> 6 & 7) << 8, qs[3] | (qh >> 9 & 7) << 8);
        return eighths(v, _mm256_set1_epi64x(iq1_delta(qh & 0x8000)));
    }
    /* IQ1_M: entry m's nibble of qh: three bits of its index, its delta's sign */
    const uint8_t *qs = src + 4 * j;
    const uint16_t qh = word16(src + 32 + 2 * j);
    const int n[4] = {qh & 15, qh >> 4 & 15, qh >> 8 & 15, qh >> 12};
    const __m256i v = entries8(grid, qs[0] | (n[0] & 7) << 8, qs[1] | (n[1] & 7) << 8,
                               qs[2] | (n[2] & 7) << 8, qs[3] | (n[3] & 7) << 8);
    return eighths(v, _mm256_setr_epi64x(iq1_delta(n[0] & 8), iq1_delta(n[1] & 8), iq1_delta(n[2] & 8),
                                         iq1_delta(n[3] & 8)));
}

/* 16 nibbles of 8 bytes from p (or 8 of 4), in order (low nibble first), as 2x + 1 */
INLINE __m256i odd_nibbles(const uint8_t *p, int bytes) {
    const __m128i b = bytes == 8 ? _mm_loadl_epi64((const __m128i *)p) : _mm_cvtsi32_si128((int)word32(p));
    const __m128i m = _mm_set1_epi8(0x0F);
    const __m128i both = _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    const __m256i x = _mm256_cvtepu8_epi16(both);
    return _mm256_add_epi16(_mm256_add_epi16(x, x), _mm256_set1_epi16(1));
}

/* a block's sub-scales (16 int16: per 32 values in 0..7, per 16 in 0..15), and its factor */
INLINE __m256i grid_subs(const int type, const uint8_t *src, float *factor) {
    if (type == GRID_IQ2_XS || type == GRID_IQ2_S) {
        *factor = half(src) * 0.125f;
        return odd_nibbles(src + (type == GRID_IQ2_XS ? 66 : 74), 8);
    }
    if (type == GRID_IQ3_S) {
        *factor = half(src);
        return odd_nibbles(src + 106, 4);
    }
    if (type == GRID_IQ1_M) { /* three bits each of the four scale words, from the low end */
        *factor = iq1_m_d(src) * 0.125f;
        short s[16];
        for (int i = 0; i < 16; i++) s[i] = (short)(2 * ((word16(src + 48 + 2 * (i / 4)) >> (3 * (i % 4))) & 7) + 1);
        return _mm256_setr_epi16(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10],
                                 s[11], s[12], s[13], s[14], s[15]);
    }
    short s[8];
    if (type == GRID_IQ1_S) {
        *factor = half(src) * 0.125f;
        for (int j = 0; j < 8; j++) s[j] = (short)(2 * ((word16(src + 34 + 2 * j) >> 12) & 7) + 1);
    } else { /* IQ2_XXS, IQ3_XXS: the top four bits of each sub-block's word */
        const int at = type == GRID_IQ2_XXS ? 6 : 66, stride = type == GRID_IQ2_XXS ? 8 : 4;
        *factor = half(src) * (type == GRID_IQ2_XXS ? 0.125f : 0.25f);
        for (int j = 0; j < 8; j++) s[j] = (short)(2 * (word32(src + at + stride * j) >> 28) + 1);
    }
    return _mm256_setr_epi16(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], 0, 0, 0, 0, 0, 0, 0, 0);
}

#endif
