/* byte_rows.h's products on AVX-512 VNNI, for products_wide.c and blocks_wide.c (their target
   pragma): a quad of groups per instruction, its weights in two registers (the four groups'
   elements 0..15, then 16..31, as the activations' quads lie) against 64 bytes of activations
   each, two dpbusd a row (four byte products summed per lane; a Q8_0 value as |w| against the
   activation with w's sign), byte_rows.h's even pairs in lanes 0..7 and odd pairs in 8..15 of
   one register. Each lane takes the same integer and the same float multiply-add as there, and
   the lanes fold as there: the same bits. */
#ifndef SWARM_BYTE_ROWS_WIDE_H
#define SWARM_BYTE_ROWS_WIDE_H

#include "byte_rows.h"

/* 16 bytes at each of four blocks' byte `at`, in block order */
INLINE __m512i quad_part(const uint8_t *quad, int size, int at) {
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(quad + at)));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(quad + size + at)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(quad + 2 * size + at)), 2);
    return _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(quad + 3 * size + at)), 3);
}

/* a quad's weights: its groups' elements 0..15 (lo) and 16..31 (hi) */
INLINE void quad_weights(const int kind, const uint8_t *quad, __m512i *lo, __m512i *hi) {
    if (kind == BYTE_Q8_0) {
        *lo = quad_part(quad, Q8_0_BLOCK, 2);
        *hi = quad_part(quad, Q8_0_BLOCK, 18);
        return;
    }
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    if (byte_q5(kind)) {
        const int size = group_bytes(kind);
        const __m512i bytes = quad_part(quad, size, q5_codes_at(kind));
        /* each block's fifth bits: 0..15 for elements 0..15, 16..31 for 16..31 */
        uint64_t low = 0, high = 0;
        for (int k = 0; k < 4; k++) {
            const uint32_t qh = q5_high(kind, quad + k * size);
            low |= (uint64_t)(qh & 0xFFFF) << (16 * k);
            high |= (uint64_t)(qh >> 16) << (16 * k);
        }
        const __m512i fifth = _mm512_set1_epi8(0x10);
        *lo = _mm512_or_si512(_mm512_and_si512(bytes, nibble), _mm512_maskz_mov_epi8(low, fifth));
        *hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble),
                              _mm512_maskz_mov_epi8(high, fifth));
        if (kind == BYTE_Q5_0) {
            *lo = _mm512_sub_epi8(*lo, _mm512_set1_epi8(16));
            *hi = _mm512_sub_epi8(*hi, _mm512_set1_epi8(16));
        }
        return;
    }
    if (byte_nibbles(kind)) {
        const __m512i bytes = quad_part(quad, NIBBLE_BLOCK, 2);
        const __m512i values = _mm512_broadcast_i32x4(nibble_table(kind));
        *lo = _mm512_shuffle_epi8(values, _mm512_and_si512(bytes, nibble));
        *hi = _mm512_shuffle_epi8(values, _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble));
        return;
    }
    const __m512i bytes = _mm512_loadu_si512((const void *)quad);
    *lo = _mm512_and_si512(bytes, nibble);
    *hi = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble);
}

/* acc plus w times a, four byte products a lane (signed w: |w| times a with w's sign) */
INLINE __m512i byte_dot_wide(const int kind, __m512i acc, __m512i w, __m512i a) {
    if (!byte_signed(kind)) return _mm512_dpbusd_epi32(acc, w, a); /* unsigned codes */
    const __m512i signed_a = _mm512_mask_sub_epi8(a, _mm512_movepi8_mask(w), _mm512_setzero_si512(), a);
    return _mm512_dpbusd_epi32(acc, _mm512_abs_epi8(w), signed_a);
}

/* output row r's quads with activation rows b0..b0 + tile into acc[b]; returns the first group
   after them */
INLINE int64_t byte_row_quads_wide(const int kind, const ByteMatrix *m, const Activations *a,
                                   int64_t b0, int64_t r, int64_t groups, const int tile,
                                   __m512 *acc) {
    const int64_t row_bytes = q8_row_bytes(groups);
    const int quad_bytes = 4 * group_bytes(kind);
    /* lanes 4j..4j + 3 take group j's scale */
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const uint8_t *row = byte_row(kind, m, r, groups);
    for (int b = 0; b < tile; b++) acc[b] = _mm512_setzero_ps();
    int64_t g = 0;
    for (; g + 4 <= groups; g += 4) {
        const uint8_t *quad = row + quad_bytes * (g / 4);
        for (int at = 0; at < quad_bytes; at += 64)
            _mm_prefetch((const char *)(quad + at + PREFETCH_AHEAD), _MM_HINT_T0);
        __m512i lo, hi;
        quad_weights(kind, quad, &lo, &hi);
        const __m128 d = group_scales(kind, m, row, r, g, groups, 4);
        for (int b = 0; b < tile; b++) {
            const int8_t *q = a->signed_bytes + (b0 + b) * row_bytes + 32 * g;
            const __m512i dot = byte_dot_wide(
                kind,
                byte_dot_wide(kind, _mm512_setzero_si512(), lo, _mm512_loadu_si512((const void *)q)),
                hi, _mm512_loadu_si512((const void *)(q + 64)));
            const __m128 sc = _mm_mul_ps(d, _mm_loadu_ps(a->step + (b0 + b) * groups + g));
            acc[b] = _mm512_fmadd_ps(_mm512_permutexvar_ps(spread, _mm512_castps128_ps512(sc)),
                                     _mm512_cvtepi32_ps(dot), acc[b]);
        }
    }
    return g;
}

/* byte_rows' loops on these quads: eight output rows' results at once for one activation
   row, each output row's for a batch */
INLINE void byte_rows_wide(const int kind, const ByteMatrix *m, const Activations *a, int64_t b0,
                           float *y, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                           const int tile) {
    const int64_t groups = cols / GROUP;
    __m256 total[8];
    if (tile == 1) {
        for (int64_t r = r0; r < r1; r += 8) {
            const int n = r1 - r < 8 ? (int)(r1 - r) : 8;
            for (int j = 0; j < 8; j++) {
                total[j] = _mm256_setzero_ps();
                if (j >= n) continue;
                __m512 acc;
                const int64_t g = byte_row_quads_wide(kind, m, a, b0, r + j, groups, 1, &acc);
                const RowTail rest = row_tail(kind, m, byte_row(kind, m, r + j, groups), r + j, g,
                                              groups);
                total[j] = byte_row_total(kind, &rest, a, b0, groups, _mm512_castps512_ps256(acc),
                                          _mm512_extractf32x8_ps(acc, 1));
            }
            store_lanes(byte_results(kind, total, m, r, 1, a->sum + b0 * groups, 0, n, groups),
                        y + b0 * rows + r, 1, n);
        }
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        __m512 acc[WIDE_TILE];
        const int64_t g = byte_row_quads_wide(kind, m, a, b0, r, groups, tile, acc);
        const RowTail rest = row_tail(kind, m, byte_row(kind, m, r, groups), r, g, groups);
        for (int b = 0; b < 8; b++)
            total[b] = b < tile ? byte_row_total(kind, &rest, a, b0 + b, groups,
                                                 _mm512_castps512_ps256(acc[b]),
                                                 _mm512_extractf32x8_ps(acc[b], 1))
                                : _mm256_setzero_ps();
        store_lanes(byte_results(kind, total, m, r, 0, a->sum + b0 * groups, groups, tile, groups),
                    y + b0 * rows + r, rows, tile);
    }
}

#endif
