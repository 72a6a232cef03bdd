/* kquant_rows.h's products on AVX-512 VNNI, for blocks_wide.c only (its target pragma): a
   piece's 64 codes in one register, its 16 quads' sums one madd and one dpwssd (quads) or
   two dpbusd (bytes), its 16 lanes one register. Its loops over the output and activation
   rows are unrolled by hand (GCC unroll): left to itself GCC kept them as loops over arrays
   on the stack, and Q4_K's one-row pass took 5.3 ms instead of 3.4 (one thread, 3584 x
   18944). Each lane takes the same integer sums and the same float multiply-adds, in the
   same order, as in kquant_rows.h, and the lanes fold as there: the same bits. With one
   activation row two output rows run side by side (two chains of multiply-adds). */
#ifndef SWARM_KQUANT_ROWS_WIDE_H
#define SWARM_KQUANT_ROWS_WIDE_H

#include "kquant_rows.h"
#include "wide_sums.h"

/* per 16-bit lane: x in lanes of the register's lower half, y in its upper half */
INLINE __m512i halves16(short x, short y) {
    return _mm512_inserti64x4(_mm512_set1_epi16(x), _mm256_set1_epi16(y), 1);
}

/* piece p's 64 codes (elements 64p..64p+63), as kquant_codes gives its two halves */
INLINE __m512i kquant_piece(const int kind, const uint8_t *block, int p) {
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    if (kind != KQUANT_Q6_K) {
        const uint8_t *qs = block + (kind == KQUANT_Q4_K ? 16 : 48) + 32 * p;
        const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qs));
        const __m512i codes = _mm512_and_si512(_mm512_srlv_epi16(q, halves16(0, 4)), nibble);
        if (kind == KQUANT_Q4_K) return codes;
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(block + 16)));
        const __m512i fifth = _mm512_and_si512(_mm512_srlv_epi16(qh, halves16(2 * p, 2 * p + 1)),
                                               _mm512_set1_epi8(1));
        return _mm512_or_si512(codes, _mm512_slli_epi16(fifth, 4));
    }
    const int c = p / 2, nib = p % 2;
    const __m512i ql = _mm512_loadu_si512((const void *)(block + 64 * c));
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(block + 128 + 32 * c)));
    const __m512i low = _mm512_and_si512(nib ? _mm512_srli_epi16(ql, 4) : ql, nibble);
    /* bits 2s..2s+1 into bits 4..5: left 4 and 2 (nib 0), right 0 and 2 (nib 1), per half */
    const __m512i top = nib ? _mm512_srlv_epi16(qh, halves16(0, 2)) : _mm512_sllv_epi16(qh, halves16(4, 2));
    const __m512i u = _mm512_or_si512(low, _mm512_and_si512(top, _mm512_set1_epi8(0x30)));
    return _mm512_sub_epi8(u, _mm512_set1_epi8(32));
}

/* a block's 16 lane factors' source for activation row b (Q6_K: one per 16 weights; Q4_K,
   Q5_K: one per 32 in lanes 0..7), the offsets as kquant_factors adds them; scale16: Q6_K's
   scales as one register */
INLINE __m512 kquant_factors_wide(const int kind, const KquantScales *s, __m512 scale16,
                                  const Activations *a, int64_t b, int64_t groups, int64_t g0,
                                  __m256 *shift) {
    if (kind == KQUANT_Q6_K) {
        const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
        const __m256 steps = _mm256_loadu_ps(a->step + b * groups + g0);
        return _mm512_mul_ps(scale16, _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(steps)));
    }
    __m256 f[2];
    kquant_factors(kind, s, a, b, groups, g0, f, shift);
    return _mm512_castps256_ps512(f[0]);
}

/* piece p's lane indices into kquant_factors_wide's factors */
INLINE __m512i kquant_pick_wide(const int kind, int p) {
    if (kind != KQUANT_Q6_K) /* groups 2p and 2p + 1 */
        return _mm512_inserti64x4(_mm512_set1_epi32(2 * p), _mm256_set1_epi32(2 * p + 1), 1);
    return _mm512_add_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                            _mm512_set1_epi32(4 * p));
}

/* rows r..r + R - 1 times activation rows b0..b0 + tile - 1 (R = 2 only for one row); quads:
   whether the activations are in quads, else as bytes */
INLINE void kquant_rows_wide(const int kind, const int quads, const uint8_t *data,
                             const Activations *a, int64_t b0, float *y, int64_t rows, int64_t cols,
                             int64_t r, const int tile, const int R) {
    const int64_t size = kquant_block_size(kind), row_bytes = cols / 256 * size, groups = cols / GROUP;
    __m512 acc[2][WIDE_TILE];
    __m256 shift[2][WIDE_TILE];
    wide_sums_start(acc, shift, R, tile);
    for (int64_t start = 0; start < cols; start += 256) {
        const uint8_t *block[2];
        __m512 f[2][WIDE_TILE];
        _Pragma("GCC unroll 8")
        for (int k = 0; k < R; k++) {
            block[k] = data + (r + k) * row_bytes + start / 256 * size;
            const uint8_t *next = blocks_ahead(block[k], start / 256 * size, row_bytes, R);
            for (int at = 0; at < size; at += 64) _mm_prefetch((const char *)(next + at), _MM_HINT_T0);
            const KquantScales scales = kquant_scales(kind, block[k]);
            const __m512 scale16 = _mm512_insertf32x8(_mm512_castps256_ps512(scales.scale[0]), scales.scale[1], 1);
            _Pragma("GCC unroll 8")
            for (int b = 0; b < tile; b++)
                f[k][b] = kquant_factors_wide(kind, &scales, scale16, a, b0 + b, groups, start / GROUP,
                                              &shift[k][b]);
        }
        for (int p = 0; p < 4; p++) {
            const __m512i pick = kquant_pick_wide(kind, p);
            /* quads: quad_codes' halves for the whole piece; bytes: the codes, and minus
               byte_bias's, the high bytes' products' start */
            __m512i first[2], last[2];
            _Pragma("GCC unroll 8")
            for (int k = 0; k < R; k++) {
                const __m512i u = kquant_piece(kind, block[k], p);
                if (quads) {
                    const __m512i pairs = _mm512_broadcast_i32x4(
                        _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
                    const __m512i split = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7),
                                                                   _mm512_shuffle_epi8(u, pairs));
                    first[k] = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(split));
                    last[k] = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(split, 1));
                } else {
                    first[k] = u;
                    last[k] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                               _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                                                   _mm512_set1_epi8((char)0x80), u));
                }
            }
            _Pragma("GCC unroll 8")
            for (int b = 0; b < tile; b++) {
                const int64_t at = (b0 + b) * cols + start + 64 * p; /* the piece's */
                const __m512i a0 = _mm512_loadu_si512(quads ? (const void *)(a->quads + at) : (const void *)(a->low + at));
                const __m512i a1 = _mm512_loadu_si512(quads ? (const void *)(a->quads + at + 32) : (const void *)(a->high + at));
                _Pragma("GCC unroll 8")
                for (int k = 0; k < R; k++) {
                    __m512i sums;
                    if (quads)
                        sums = _mm512_dpwssd_epi32(_mm512_madd_epi16(first[k], a0), last[k], a1);
                    else
                        sums = _mm512_add_epi32(
                            _mm512_slli_epi32(_mm512_dpbusd_epi32(last[k], a1, first[k]), 8),
                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), a0, first[k]));
                    acc[k][b] = _mm512_fmadd_ps(_mm512_permutexvar_ps(pick, f[k][b]),
                                                _mm512_cvtepi32_ps(sums), acc[k][b]);
                }
            }
        }
    }
    wide_sums_fold(acc, shift, R, tile, y, rows, b0, r);
}

#endif
