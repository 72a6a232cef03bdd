/* kquant_rows.h's products on AVX-512 VNNI, for blocks_wide.c only (its target pragma): a
   piece's 64 codes in one register, its 16 quads' sums one maddubs and one dpwssd a row,
   its 16 lanes one register. Its loops over the output and activation rows
   are unrolled by hand (GCC unroll): left to itself GCC kept them as loops over arrays on
   the stack. Each lane takes the same integer and the same float multiply-add, in the same
   order, as in kquant_rows.h, and the lanes fold as there: the same bits. With one
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
INLINE __m512i kquant_piece(const int kind, const uint8_t *block, const int8_t *grid, int p) {
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    if (kquant_grid(kind) >= 0) /* built 32 values at a time from their entries */
        return _mm512_inserti64x4(_mm512_castsi256_si512(kquant_codes(kind, block, grid, p, 0)),
                                  kquant_codes(kind, block, grid, p, 1), 1);
    if (kind == KQUANT_Q4_K || kind == KQUANT_Q5_K) {
        const uint8_t *qs = block + (kind == KQUANT_Q4_K ? 16 : 48) + 32 * p;
        const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qs));
        const __m512i codes = _mm512_and_si512(_mm512_srlv_epi16(q, halves16(0, 4)), nibble);
        if (kind == KQUANT_Q4_K) return codes;
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(block + 16)));
        const __m512i fifth = _mm512_and_si512(_mm512_srlv_epi16(qh, halves16(2 * p, 2 * p + 1)),
                                               _mm512_set1_epi8(1));
        return _mm512_or_si512(codes, _mm512_slli_epi16(fifth, 4));
    }
    if (kind == KQUANT_IQ4_XS) { /* sub-blocks 2p and 2p + 1: [low, high nibbles] of each */
        const __m256i q = _mm256_loadu_si256((const __m256i *)(block + 8 + 32 * p));
        const __m256i lo = _mm256_and_si256(q, _mm256_set1_epi8(0x0F));
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), _mm256_set1_epi8(0x0F));
        const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        const __m512i codes = _mm512_shuffle_i64x2(both, both, _MM_SHUFFLE(3, 1, 2, 0));
        const __m512i values = _mm512_broadcast_i32x4(iq4_values());
        return _mm512_shuffle_epi8(values, codes);
    }
    const int c = p / 2, nib = p % 2;
    if (kind == KQUANT_Q2_K || kind == KQUANT_Q3_K) { /* s = 2 nib + h: bits 2s..2s+1 */
        const uint8_t *qs = block + (kind == KQUANT_Q2_K ? 16 : 32) + 32 * c;
        const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qs));
        const __m512i low = _mm512_and_si512(_mm512_srlv_epi16(q, halves16((short)(4 * nib), (short)(4 * nib + 2))),
                                             _mm512_set1_epi8(3));
        if (kind == KQUANT_Q2_K) return low;
        const __m512i hmask = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)block));
        const int bit = 4 * c + 2 * nib; /* bit 4c + s of hmask[t], as bit 2 */
        const __m512i high = bit >= 2 ? _mm512_srlv_epi16(hmask, halves16((short)(bit - 2), (short)(bit - 1)))
                                      : _mm512_sllv_epi16(hmask, halves16((short)(2 - bit), (short)(1 - bit)));
        return _mm512_or_si512(low, _mm512_and_si512(high, _mm512_set1_epi8(4)));
    }
    const __m512i ql = _mm512_loadu_si512((const void *)(block + 64 * c));
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(block + 128 + 32 * c)));
    const __m512i low = _mm512_and_si512(nib ? _mm512_srli_epi16(ql, 4) : ql, nibble);
    /* bits 2s..2s+1 into bits 4..5: left 4 and 2 (nib 0), right 0 and 2 (nib 1), per half */
    const __m512i top = nib ? _mm512_srlv_epi16(qh, halves16(0, 2)) : _mm512_sllv_epi16(qh, halves16(4, 2));
    const __m512i u = _mm512_or_si512(low, _mm512_and_si512(top, _mm512_set1_epi8(0x30)));
    return _mm512_sub_epi8(u, _mm512_set1_epi8(32));
}

/* kquant_quad_scales' halves as two registers: in 16-bit slot 2L, the min of pieces 0's (then
   2's) quad L, sub-block L / 4 (8 + L / 4), in slot 2L + 1 piece 1's (3's), 4 + L / 4 (12 +
   L / 4) */
static const int16_t quad_slots[64] = {
    0, 4, 0, 4, 0, 4, 0, 4, 1, 5, 1, 5, 1, 5, 1, 5, 2, 6, 2, 6, 2, 6, 2, 6, 3, 7, 3, 7, 3, 7, 3, 7,
    8, 12, 8, 12, 8, 12, 8, 12, 9, 13, 9, 13, 9, 13, 9, 13,
    10, 14, 10, 14, 10, 14, 10, 14, 11, 15, 11, 15, 11, 15, 11, 15};

/* pairs of a piece's codes times one activation row's 64 bytes from `at` (kquant_rows.h's
   byte_sums, two halves as one register) */
INLINE __m512i kquant_pairs_wide(const int kind, __m512i codes, __m512i mag, const Activations *a,
                                 int64_t at) {
    if (kquant_biased(kind))
        return _mm512_maddubs_epi16(_mm512_loadu_si512((const void *)(a->biased_bytes + at)), codes);
    const __m512i bytes = _mm512_loadu_si512((const void *)(a->signed_bytes + at));
    if (!kquant_signed(kind)) return _mm512_maddubs_epi16(codes, bytes);
    /* the activation with the value's sign (no IQ4 or grid value is zero) */
    return _mm512_maddubs_epi16(mag, _mm512_mask_sub_epi8(bytes, _mm512_movepi8_mask(codes),
                                                          _mm512_setzero_si512(), bytes));
}

/* the sub-scale of each of a piece's 32 pairs of codes (kquant_sub_pairs' two halves as one
   register), from a block's sub-scales as one register */
INLINE __m512i kquant_sub_pairs_wide(const int kind, __m512i sub, int p) {
    const __m512i lower = kquant_per16(kind)
        ? _mm512_castsi256_si512(_mm256_setr_m128i(_mm_set1_epi16((short)(4 * p)), _mm_set1_epi16((short)(4 * p + 1))))
        : _mm512_set1_epi16((short)(2 * p));
    const __m256i upper = kquant_per16(kind)
        ? _mm256_setr_m128i(_mm_set1_epi16((short)(4 * p + 2)), _mm_set1_epi16((short)(4 * p + 3)))
        : _mm256_set1_epi16((short)(2 * p + 1));
    return _mm512_permutexvar_epi16(_mm512_inserti64x4(lower, upper, 1), sub);
}

/* rows r..r + R - 1 times activation rows b0..b0 + tile - 1 */
INLINE void kquant_rows_wide(const int kind, const uint8_t *data, const int8_t *grid, const Activations *a,
                             int64_t b0, float *y, int64_t rows, int64_t cols, int64_t r, const int tile,
                             const int R) {
    const int64_t size = kquant_block_size(kind), row_bytes = cols / 256 * size;
    const int64_t blocks = cols / 256;
    __m512 acc[2][WIDE_TILE];
    __m256 shift[2][WIDE_TILE];
    wide_sums_start(acc, shift, R, tile);
    for (int64_t start = 0; start < cols; start += 256) {
        const uint8_t *block[2];
        KquantScales scales[2];
        __m512i sub[2];
        /* per output and activation row: the block's sums; Q6_K's bias per output row */
        __m512i sums[2][WIDE_TILE], bias[2], quads[2][2];
        _Pragma("GCC unroll 8")
        for (int k = 0; k < R; k++) {
            block[k] = data + (r + k) * row_bytes + start / 256 * size;
            const uint8_t *next = blocks_ahead(block[k], start / 256 * size, row_bytes, R);
            for (int at = 0; at < size; at += 64) _mm_prefetch((const char *)(next + at), _MM_HINT_T0);
            scales[k] = kquant_scales(kind, block[k]);
            sub[k] = _mm512_castsi256_si512(_mm256_load_si256((const __m256i *)scales[k].sub));
            bias[k] = _mm512_setzero_si512();
            if (kquant_quads(kind)) { /* kquant_quad_scales' halves as one register each */
                const __m512i mins = _mm512_castsi256_si512(scales[k].mins);
                quads[k][0] = _mm512_permutexvar_epi16(_mm512_loadu_si512((const void *)quad_slots), mins);
                quads[k][1] = _mm512_permutexvar_epi16(_mm512_loadu_si512((const void *)(quad_slots + 32)), mins);
            }
            _Pragma("GCC unroll 8")
            for (int b = 0; b < tile; b++) sums[k][b] = _mm512_setzero_si512();
        }
        _Pragma("GCC unroll 4")
        for (int p = 0; p < 4; p++) {
            /* per output row: the piece's codes, their magnitudes (kquant_signed), their
               sub-scales */
            __m512i codes[2], mag[2], pairs_sub[2];
            _Pragma("GCC unroll 8")
            for (int k = 0; k < R; k++) {
                codes[k] = kquant_piece(kind, block[k], grid, p);
                mag[k] = kquant_signed(kind) ? _mm512_abs_epi8(codes[k]) : codes[k];
                pairs_sub[k] = kquant_sub_pairs_wide(kind, sub[k], p);
                if (kquant_biased(kind))
                    bias[k] = _mm512_dpwssd_epi32(
                        bias[k], _mm512_maddubs_epi16(_mm512_set1_epi8((char)0x80), codes[k]), pairs_sub[k]);
            }
            _Pragma("GCC unroll 8")
            for (int b = 0; b < tile; b++) {
                const int64_t at = (b0 + b) * cols + start + 64 * p; /* the piece's */
                _Pragma("GCC unroll 8")
                for (int k = 0; k < R; k++)
                    sums[k][b] = _mm512_dpwssd_epi32(sums[k][b], kquant_pairs_wide(kind, codes[k], mag[k], a, at),
                                                     pairs_sub[k]);
            }
        }
        _Pragma("GCC unroll 8")
        for (int k = 0; k < R; k++)
            _Pragma("GCC unroll 8")
            for (int b = 0; b < tile; b++) {
                if (kquant_quads(kind)) { /* kquant_rows.h's kquant_quad_fix, both halves */
                    const int16_t *four = a->sum4 + ((b0 + b) * cols + start) / 4;
                    sums[k][b] = _mm512_dpwssd_epi32(sums[k][b], quads[k][0], _mm512_loadu_si512((const void *)four));
                    sums[k][b] = _mm512_dpwssd_epi32(sums[k][b], quads[k][1],
                                                     _mm512_loadu_si512((const void *)(four + 32)));
                }
                const __m512i lanes = _mm512_sub_epi32(sums[k][b], bias[k]);
                const float f = kquant_factor(&scales[k], a, b0 + b, blocks, start / 256);
                acc[k][b] = _mm512_fmadd_ps(_mm512_set1_ps(f), _mm512_cvtepi32_ps(lanes), acc[k][b]);
                shift[k][b] = kquant_shift(kind, &scales[k], a, b0 + b, cols, start, shift[k][b]);
            }
    }
    wide_sums_fold(acc, shift, R, tile, y, rows, b0, r);
}

/* Q3_K at batch: its values times their scales as bytes. -v * s lies in -128..124 (v -4..3, s
   -32..31; v * s would reach 128), so a piece's 64 weights become 64 signed bytes, and one
   dpbusd a piece and activation row multiplies them by the activations plus 128 and sums each
   quad (lane L, quad L: kquant_rows.h's lanes); less 128 times their own sums (once per
   block), negated, each lane is kquant_rows.h's exact integer: the same bits as the rows
   above, with one operation a piece and activation row where those take a byte product and a
   multiply by the sub-scale. The bytes come from the codes (0..7) through a table per
   sub-block, (4 - c) * s in a pshufb lane: a 128-bit lane of a piece is one sub-block (16
   weights), and one table register serves two pieces, the first's table in bytes 0..7 of each
   lane, the second's in 8..15 (codes plus 8). */
static const int16_t q3_table_slots[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};

/* the tables of pieces 2 * pair and 2 * pair + 1: in lane L, (4 - c) * scale 8 * pair + L for
   c = 0..7, then (4 - c) * scale 8 * pair + 4 + L */
INLINE __m512i q3_k_tables(const KquantScales *s, int pair) {
    const __m512i sub = _mm512_castsi256_si512(_mm256_load_si256((const __m256i *)s->sub));
    const __m512i lane = _mm512_loadu_si512((const void *)q3_table_slots);
    const __m512i minus_v = _mm512_broadcast_i32x4(_mm_setr_epi16(4, 3, 2, 1, 0, -1, -2, -3));
    const __m512i first = _mm512_add_epi16(lane, _mm512_set1_epi16((short)(8 * pair)));
    const __m512i low = _mm512_mullo_epi16(_mm512_permutexvar_epi16(first, sub), minus_v);
    const __m512i high = _mm512_mullo_epi16(
        _mm512_permutexvar_epi16(_mm512_add_epi16(first, _mm512_set1_epi16(4)), sub), minus_v);
    return _mm512_packs_epi16(low, high);
}

/* output rows whose blocks are made ready together, each then multiplied by every
   activation row */
#define SCALED_ROWS 4

/* A Q3_K block made ready for q3_k_ready_rows: its four pieces as bytes, minus 128 times
   their sums (where each activation row's sums start, so that they end as minus each lane's
   integer) and -d (whose product with a row's step takes them: the same products, exactly) */
typedef struct {
    __m512i w[4], minus_bias;
    float minus_d;
} Q3Block;

INLINE void q3_k_prepare(const uint8_t *block, Q3Block *out) {
    const KquantScales scales = kquant_scales(KQUANT_Q3_K, block);
    const __m512i tables[2] = {q3_k_tables(&scales, 0), q3_k_tables(&scales, 1)};
    __m512i bias = _mm512_setzero_si512();
    _Pragma("GCC unroll 4")
    for (int p = 0; p < 4; p++) {
        const __m512i codes = _mm512_or_si512(kquant_piece(KQUANT_Q3_K, block, NULL, p), _mm512_set1_epi8((char)(8 * (p % 2))));
        out->w[p] = _mm512_shuffle_epi8(tables[p / 2], codes);
        bias = _mm512_dpbusd_epi32(bias, _mm512_set1_epi8((char)0x80), out->w[p]);
    }
    out->minus_bias = _mm512_sub_epi32(_mm512_setzero_si512(), bias);
    out->minus_d = -scales.d;
}

/* output rows r..r + G - 1 times every activation row, Q3_K, over blocks j0..j1 - 1 of their
   blocks made ready (`ready`, G rows of `blocks`): per activation row and block its four pieces
   are loaded once for the G output rows, each of which takes four dpbusd and one
   multiply-add, blocks in order (the rows' contract: the same bits as one row at a time).
   A row's sums go on from `acc` ([G, batch] registers' worth) where j0 > 0, and are kept
   there, or folded into y at the row's last block */
INLINE void q3_k_ready_rows(const Q3Block *ready, const Activations *a, int64_t batch, float *y,
                            int64_t rows, int64_t cols, int64_t r, int64_t j0, int64_t j1,
                            __m512 *acc, const int G) {
    const int64_t blocks = cols / 256;
    for (int64_t b = 0; b < batch; b++) {
        __m512 sum[SCALED_ROWS];
        _Pragma("GCC unroll 4")
        for (int k = 0; k < G; k++) sum[k] = j0 ? acc[k * batch + b] : _mm512_setzero_ps();
        const uint8_t *bytes = a->biased_bytes + b * cols;
        const float *steps = a->block_step + b * blocks;
        for (int64_t j = j0; j < j1; j++) {
            __m512i x[4];
            _Pragma("GCC unroll 4")
            for (int p = 0; p < 4; p++) x[p] = _mm512_loadu_si512((const void *)(bytes + 256 * j + 64 * p));
            _Pragma("GCC unroll 4")
            for (int k = 0; k < G; k++) {
                const Q3Block *q = ready + k * blocks + j;
                __m512i sums = q->minus_bias;
                _Pragma("GCC unroll 4")
                for (int p = 0; p < 4; p++) sums = _mm512_dpbusd_epi32(sums, x[p], q->w[p]);
                sum[k] = _mm512_fmadd_ps(_mm512_set1_ps(q->minus_d * steps[j]), _mm512_cvtepi32_ps(sums), sum[k]);
            }
        }
        _Pragma("GCC unroll 4")
        for (int k = 0; k < G; k++) {
            if (j1 < blocks) {
                acc[k * batch + b] = sum[k];
                continue;
            }
            /* wide_sums_fold's, with Q3_K's offset lanes zero */
            y[b * rows + r + k] = sum8(_mm256_add_ps(_mm512_castps512_ps256(sum[k]), _mm512_extractf32x8_ps(sum[k], 1))) +
                                  sum8(_mm256_setzero_ps());
        }
    }
}

#endif
