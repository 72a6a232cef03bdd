/* Rows whose weights multiply 8-bit activations one byte product each, on AVX2: the 4-bit
   groups Q4_0 and Q4_1 run as (products.c: codes 0..15 two per byte, a float16 scale and
   offset per group of 32) and Q8_0's blocks as stored (a float16 scale, then 32 signed
   bytes; blocks.c).

   The activations are rounded to 8 bits per group of 32 (swarm_split_q8, the quad layout of
   products.h; llama.cpp rounds them so for these types), where the rows took int16 before:
   two multiply-adds per 32 weights and row on weights widened to 16 bits. A 4-bit code is
   unsigned and multiplies the activation directly (maddubs: pairs of byte products, at most
   2 * 15 * 127); a Q8_0 value multiplies as |w| times the activation with w's sign (sign_epi8:
   at most 2 * 128 * 127, never saturating); madd sums each four into a 32-bit lane, exact.

   The contract this file and its AVX-512 twin (byte_rows_wide.h) keep, so that AVX2 and
   AVX-512 nodes, and a row alone or in any batch, give the same bits:
   * groups come four at a time (a quad); a row's sum has two sets of eight float lanes, for a
     quad's first pair of groups (even) and its second (odd); a pair's lanes 0..3 take group
     g's integer sums, 4..7 group g + 1's, each times d * step (float) with one multiply-add,
     quads in order;
   * the groups after the last quad fold in as row_tail_rows says;
   * the output is sum8(even + odd), plus, but for Q8_0, byte_offsets8's lane.
   So each output is the exact dequantization's product with the rounded activations, up to
   float32 conversions and sums. */
#ifndef SWARM_BYTE_ROWS_H
#define SWARM_BYTE_ROWS_H

#include "products.h"

/* BYTE_Q5_0 and BYTE_Q5_1 are Q5_0's and Q5_1's blocks as stored, a 5-bit code a Q4 block's
   nibble with its fifth bit from the block's 32-bit qh. Q5_1's value is d * code + m: the
   code is unsigned and multiplies as a 4-bit code does (two maddubs lanes add within int16:
   at most 4 * 31 * 127), m is its offset. Q5_0's is d * (code - 16): code - 16 is a signed
   byte (-16..15) and multiplies as a Q8_0 value does, with no offset. BYTE_Q4_0 and
   BYTE_IQ4_NL are Q4_0's and IQ4_NL's blocks as stored (a float16 d, then 16 bytes of
   nibbles): each nibble's value from a 16-entry table (nibble_table: Q4_0's code - 8,
   IQ4_NL's -127..113), multiplied as a Q8_0 value, no offset. */
enum { BYTE_Q4, BYTE_Q8_0, BYTE_Q5_0, BYTE_Q5_1, BYTE_Q4_0, BYTE_IQ4_NL };

/* the kinds whose weights are signed bytes (|w| times the activation with w's sign) and have
   no offsets */
INLINE int byte_signed(const int kind) {
    return kind == BYTE_Q8_0 || kind == BYTE_Q5_0 || kind == BYTE_Q4_0 || kind == BYTE_IQ4_NL;
}

/* blocks of a float16 d and 16 bytes of nibbles, valued through nibble_table */
INLINE int byte_nibbles(const int kind) { return kind == BYTE_Q4_0 || kind == BYTE_IQ4_NL; }

INLINE __m128i nibble_table(const int kind) {
    return kind == BYTE_Q4_0 ? _mm_setr_epi8(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7)
                             : iq4_values();
}

INLINE int byte_q5(const int kind) { return kind == BYTE_Q5_0 || kind == BYTE_Q5_1; }

#define Q8_0_BLOCK 34 /* bytes of a Q8_0 block: float16 d, 32 int8 values */
#define Q5_0_BLOCK 22 /* float16 d, uint32 qh, 16 bytes of nibbles */
#define Q5_1_BLOCK 24 /* float16 d and m, uint32 qh, 16 bytes of nibbles */
#define NIBBLE_BLOCK 18 /* Q4_0's and IQ4_NL's: float16 d, 16 bytes of nibbles */

/* bytes of one group of 32 in a row (BYTE_Q4: its codes only) */
INLINE int group_bytes(const int kind) {
    return kind == BYTE_Q4 ? 16 : kind == BYTE_Q8_0 ? Q8_0_BLOCK
                             : kind == BYTE_Q5_0 ? Q5_0_BLOCK
                             : kind == BYTE_Q5_1 ? Q5_1_BLOCK : NIBBLE_BLOCK;
}

/* where a Q5 block's qh and nibbles lie */
INLINE int q5_high_at(const int kind) { return kind == BYTE_Q5_0 ? 2 : 4; }
INLINE int q5_codes_at(const int kind) { return kind == BYTE_Q5_0 ? 6 : 8; }

INLINE uint32_t q5_high(const int kind, const uint8_t *block) {
    uint32_t qh;
    __builtin_memcpy(&qh, block + q5_high_at(kind), sizeof qh);
    return qh;
}

/* a matrix of any kind: BYTE_Q4's codes [rows, cols / 2] with scale and offset [rows,
   groups] (float16), or the other kinds' blocks [rows, groups] (scale and offset unused) */
typedef struct {
    const uint8_t *data;
    const uint16_t *scale, *offset;
} ByteMatrix;

/* output row r's first byte */
INLINE const uint8_t *byte_row(const int kind, const ByteMatrix *m, int64_t r, int64_t groups) {
    return m->data + r * groups * group_bytes(kind);
}

/* a pair of groups' 32 bytes of codes (group g's 16, then g + 1's) as their low nibbles
   (elements 0..15 of g, then of g + 1) and their high nibbles (elements 16..31) */
INLINE void q4_pair_codes(__m256i bytes, __m256i *lo, __m256i *hi) {
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    *lo = _mm256_and_si256(bytes, nibble);
    *hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
}

/* a pair of Q8_0 blocks' values as their elements 0..15 (block g's, then g + 1's) and 16..31;
   alone: one block, the upper halves zero */
INLINE void q8_0_pair_values(const uint8_t *block, int alone, __m256i *lo, __m256i *hi) {
    const __m128i l0 = _mm_loadu_si128((const __m128i *)(block + 2));
    const __m128i h0 = _mm_loadu_si128((const __m128i *)(block + 18));
    const __m128i l1 = alone ? _mm_setzero_si128()
                             : _mm_loadu_si128((const __m128i *)(block + Q8_0_BLOCK + 2));
    const __m128i h1 = alone ? _mm_setzero_si128()
                             : _mm_loadu_si128((const __m128i *)(block + Q8_0_BLOCK + 18));
    *lo = _mm256_inserti128_si256(_mm256_castsi128_si256(l0), l1, 1);
    *hi = _mm256_inserti128_si256(_mm256_castsi128_si256(h0), h1, 1);
}

/* a pair of Q5 blocks' codes as a Q4 pair's (elements 0..15 of g then of g + 1; 16..31) */
INLINE void q5_pair_codes(const int kind, const uint8_t *block, int alone, __m256i *lo,
                          __m256i *hi) {
    const int size = group_bytes(kind), at = q5_codes_at(kind);
    const __m128i c0 = _mm_loadu_si128((const __m128i *)(block + at));
    const __m128i c1 = alone ? _mm_setzero_si128()
                             : _mm_loadu_si128((const __m128i *)(block + size + at));
    q4_pair_codes(_mm256_inserti128_si256(_mm256_castsi128_si256(c0), c1, 1), lo, hi);
    const uint32_t h0 = q5_high(kind, block), h1 = alone ? 0 : q5_high(kind, block + size);
    *lo = _mm256_or_si256(*lo, fifth_bits((h0 & 0xFFFF) | (h1 << 16)));
    *hi = _mm256_or_si256(*hi, fifth_bits((h0 >> 16) | (h1 & 0xFFFF0000u)));
    if (kind == BYTE_Q5_0) { /* a lone group's partner, -16, meets the row's zero padding */
        *lo = _mm256_sub_epi8(*lo, _mm256_set1_epi8(16));
        *hi = _mm256_sub_epi8(*hi, _mm256_set1_epi8(16));
    }
}

/* a pair of Q4_0 or IQ4_NL blocks' values as a Q4 pair's codes lie (a lone block's partner:
   nibbles 0, against the row's zero padding) */
INLINE void nibble_pair_values(const int kind, const uint8_t *block, int alone, __m256i *lo,
                               __m256i *hi) {
    const __m128i c0 = _mm_loadu_si128((const __m128i *)(block + 2));
    const __m128i c1 = alone ? _mm_setzero_si128()
                             : _mm_loadu_si128((const __m128i *)(block + NIBBLE_BLOCK + 2));
    q4_pair_codes(_mm256_inserti128_si256(_mm256_castsi128_si256(c0), c1, 1), lo, hi);
    const __m256i values = _mm256_broadcastsi128_si256(nibble_table(kind));
    *lo = _mm256_shuffle_epi8(values, *lo);
    *hi = _mm256_shuffle_epi8(values, *hi);
}

/* output row `row`'s pair of groups from g (alone: group g only, the rest zero) */
INLINE void pair_weights(const int kind, const uint8_t *row, int64_t g, int alone, __m256i *lo,
                         __m256i *hi) {
    if (kind == BYTE_Q8_0) {
        q8_0_pair_values(row + Q8_0_BLOCK * g, alone, lo, hi);
        return;
    }
    if (byte_q5(kind)) {
        q5_pair_codes(kind, row + group_bytes(kind) * g, alone, lo, hi);
        return;
    }
    if (byte_nibbles(kind)) {
        nibble_pair_values(kind, row + NIBBLE_BLOCK * g, alone, lo, hi);
        return;
    }
    const uint8_t *c = row + 16 * g;
    const __m256i bytes =
        alone ? _mm256_inserti128_si256(_mm256_setzero_si256(), _mm_loadu_si128((const __m128i *)c), 0)
              : _mm256_loadu_si256((const __m256i *)c);
    q4_pair_codes(bytes, lo, hi);
}

/* group g's float16 scale bits in output row r */
INLINE uint16_t group_scale_bits(const int kind, const ByteMatrix *m, const uint8_t *row, int64_t r,
                                 int64_t g, int64_t groups) {
    if (kind == BYTE_Q4) return m->scale[r * groups + g];
    uint16_t bits;
    __builtin_memcpy(&bits, row + group_bytes(kind) * g, sizeof bits);
    return bits;
}

/* group g's offset in output row r: Q4's stored one, Q5_0's -16 d, Q5_1's m */
INLINE float group_offset(const int kind, const ByteMatrix *m, int64_t r, int64_t g,
                          int64_t groups) {
    if (kind == BYTE_Q4) return _cvtsh_ss(m->offset[r * groups + g]);
    const uint8_t *block = byte_row(kind, m, r, groups) + group_bytes(kind) * g;
    uint16_t bits;
    __builtin_memcpy(&bits, block + (kind == BYTE_Q5_1 ? 2 : 0), sizeof bits);
    return kind == BYTE_Q5_1 ? _cvtsh_ss(bits) : -16.f * _cvtsh_ss(bits);
}

/* eight groups' offsets from g in output row r */
INLINE __m256 group_offsets8(const int kind, const ByteMatrix *m, int64_t r, int64_t g,
                             int64_t groups) {
    if (kind == BYTE_Q4)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m->offset + r * groups + g)));
    return _mm256_setr_ps(group_offset(kind, m, r, g, groups), group_offset(kind, m, r, g + 1, groups),
                          group_offset(kind, m, r, g + 2, groups), group_offset(kind, m, r, g + 3, groups),
                          group_offset(kind, m, r, g + 4, groups), group_offset(kind, m, r, g + 5, groups),
                          group_offset(kind, m, r, g + 6, groups), group_offset(kind, m, r, g + 7, groups));
}

/* the float16 scales of `count` groups (1 to 4) of output row r from g, the rest zero; built in
   registers (a float array in memory read back as a vector stalled every call: its parts were
   stored apart and a load over two stores cannot take them from the store buffer) */
INLINE __m128 group_scales(const int kind, const ByteMatrix *m, const uint8_t *row, int64_t r,
                           int64_t g, int64_t groups, int count) {
    if (kind == BYTE_Q4 && count == 4)
        return _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(m->scale + r * groups + g)));
    const short s0 = (short)group_scale_bits(kind, m, row, r, g, groups);
    const short s1 = count > 1 ? (short)group_scale_bits(kind, m, row, r, g + 1, groups) : 0;
    const short s2 = count > 2 ? (short)group_scale_bits(kind, m, row, r, g + 2, groups) : 0;
    const short s3 = count > 3 ? (short)group_scale_bits(kind, m, row, r, g + 3, groups) : 0;
    return _mm_cvtph_ps(_mm_setr_epi16(s0, s1, s2, s3, 0, 0, 0, 0));
}

/* |w| * (a with w's sign), four byte products a lane, for 32 signed weights and activations */
INLINE __m256i signed_byte_dot(__m256i w, __m256i a) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w)),
                             _mm256_set1_epi16(1));
}

/* a pair's integer sums with one activation row (q: the pair's elements 0..15 in its quad;
   16..31 lie 64 bytes on): lane i (0..3 group g, 4..7 group g + 1) sums elements 4i..4i+3
   and 16 + 4i..16 + 4i + 3 of its group */
INLINE __m256i byte_pair_dot(const int kind, __m256i lo, __m256i hi, const int8_t *q) {
    const __m256i x0 = _mm256_loadu_si256((const __m256i *)q);
    const __m256i x1 = _mm256_loadu_si256((const __m256i *)(q + 64));
    if (byte_signed(kind))
        return _mm256_add_epi32(signed_byte_dot(lo, x0), signed_byte_dot(hi, x1));
    /* codes 0..15: two maddubs lanes add within int16 */
    const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_maddubs_epi16(hi, x1));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

/* a pair's scales, each group's in its four lanes: lanes 2j and 2j + 1 of s */
INLINE __m256 pair_scales(__m128 s, int j) {
    const __m256i pick = j ? _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3)
                           : _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(s), pick);
}

/* The groups of an output row after its last whole quad (1 to 3), read once per output row:
   a pair of groups from g on (pair), then a lone group (lone), its partner's lanes zero; their
   weights as a pair's (lo, hi) and their scales (d: lanes 0 and 1 for a pair, lane 0 for the
   lone group, the rest zero). */
typedef struct {
    int64_t g;
    int pair, lone;
    __m256i lo[2], hi[2]; /* [0] the pair's, [1] the lone group's */
    __m128 d[2];
} RowTail;

INLINE RowTail row_tail(const int kind, const ByteMatrix *m, const uint8_t *row, int64_t r,
                        int64_t g, int64_t groups) {
    RowTail t;
    t.g = g;
    t.pair = g + 2 <= groups;
    t.lone = (groups - g) % 2;
    if (t.pair) {
        pair_weights(kind, row, g, 0, &t.lo[0], &t.hi[0]);
        t.d[0] = group_scales(kind, m, row, r, g, groups, 2);
    }
    if (t.lone) {
        pair_weights(kind, row, groups - 1, 1, &t.lo[1], &t.hi[1]);
        t.d[1] = group_scales(kind, m, row, r, groups - 1, groups, 1);
    }
    return t;
}

/* t's share of one activation row (its bytes `q`, its steps `step`): the pair into *even
   (its pair of groups has an even index), the lone group into *even or *odd as its pair's
   index says. The AVX2 rows and the AVX-512 rows (on their two halves) both end with it. */
INLINE void row_tail_rows(const int kind, const RowTail *t, const int8_t *q, const float *step,
                          __m256 *even, __m256 *odd) {
    if (t->pair) {
        const __m128 steps = _mm_castpd_ps(_mm_load_sd((const double *)(step + t->g)));
        const __m256i dot = byte_pair_dot(kind, t->lo[0], t->hi[0], q + q8_low_at(t->g));
        *even = _mm256_fmadd_ps(pair_scales(_mm_mul_ps(t->d[0], steps), 0),
                                _mm256_cvtepi32_ps(dot), *even);
    }
    if (t->lone) {
        const int64_t g = t->g + 2 * t->pair;
        /* the partner's activations are the row's zero padding, its weights zero */
        const __m256i dot = byte_pair_dot(kind, t->lo[1], t->hi[1], q + q8_low_at(g));
        __m256 *acc = (g / 2) % 2 ? odd : even;
        *acc = _mm256_fmadd_ps(pair_scales(_mm_mul_ps(t->d[1], _mm_load_ss(step + g)), 0),
                               _mm256_cvtepi32_ps(dot), *acc);
    }
}

/* The offsets' share of n (1 to 8) outputs, lane i that of output row r + i * r_step against
   activation sums s + i * s_step (eight output rows and one activation row, or one output
   row and a batch: one of the steps is 0): eight groups at a time into eight lanes summed as
   sum8 sums, then the groups after the last eight one by one, a multiply-add each from zero.
   Lanes from n on are zero. */
INLINE __m256 byte_offsets8(const int kind, const ByteMatrix *m, int64_t r, int64_t r_step,
                            const float *s, int64_t s_step, int n, int64_t groups) {
    __m256 shift[8];
    const int64_t whole = groups - groups % 8;
    for (int i = 0; i < 8; i++) {
        shift[i] = _mm256_setzero_ps();
        if (i >= n) continue;
        for (int64_t g = 0; g < whole; g += 8)
            shift[i] = _mm256_fmadd_ps(group_offsets8(kind, m, r + i * r_step, g, groups),
                                       _mm256_loadu_ps(s + i * s_step + g), shift[i]);
    }
    __m256 tail = _mm256_setzero_ps();
#define OFFSET_LANE(i) ((i) < n ? group_offset(kind, m, r + (i) * r_step, g, groups) : 0.f)
#define SUM_LANE(i) ((i) < n ? s[(i) * s_step + g] : 0.f)
    for (int64_t g = whole; g < groups; g++)
        tail = _mm256_fmadd_ps(
            _mm256_setr_ps(OFFSET_LANE(0), OFFSET_LANE(1), OFFSET_LANE(2), OFFSET_LANE(3),
                           OFFSET_LANE(4), OFFSET_LANE(5), OFFSET_LANE(6), OFFSET_LANE(7)),
            _mm256_setr_ps(SUM_LANE(0), SUM_LANE(1), SUM_LANE(2), SUM_LANE(3), SUM_LANE(4),
                           SUM_LANE(5), SUM_LANE(6), SUM_LANE(7)),
            tail);
#undef OFFSET_LANE
#undef SUM_LANE
    return _mm256_add_ps(sum8x8(shift), tail);
}

/* Up to eight outputs at once, lane i from total[i] (a row's even + odd lanes, its tail folded
   in; zero past n): sum8 of each, plus, for the kinds with offsets, their offsets
   (byte_offsets8's arguments). One output alone and eight together give the same bits. */
INLINE __m256 byte_results(const int kind, const __m256 *total, const ByteMatrix *m, int64_t r,
                           int64_t r_step, const float *s, int64_t s_step, int n, int64_t groups) {
    const __m256 sums = sum8x8(total);
    if (byte_signed(kind)) return sums;
    return _mm256_add_ps(sums, byte_offsets8(kind, m, r, r_step, s, s_step, n, groups));
}

/* n (1 to 8) lanes of v to y, y[i * stride] */
INLINE void store_lanes(__m256 v, float *y, int64_t stride, int n) {
    if (n == 8 && stride == 1) {
        _mm256_storeu_ps(y, v);
        return;
    }
    float lanes[8]; /* read back one by one, each inside the one store: no stall */
    _mm256_storeu_ps(lanes, v);
    for (int i = 0; i < n; i++) y[i * stride] = lanes[i];
}

/* Output row r's sums for one activation row (its quads' lanes in even and odd), the row's
   tail folded in: what byte_results takes */
INLINE __m256 byte_row_total(const int kind, const RowTail *rest, const Activations *a, int64_t b,
                             int64_t groups, __m256 even, __m256 odd) {
    row_tail_rows(kind, rest, a->signed_bytes + b * q8_row_bytes(groups), a->step + b * groups,
                  &even, &odd);
    return _mm256_add_ps(even, odd);
}

/* output row r's quads with activation rows b0..b0 + tile into even[b] and odd[b]; returns the
   first group after them */
INLINE int64_t byte_row_quads(const int kind, const ByteMatrix *m, const Activations *a, int64_t b0,
                              int64_t r, int64_t groups, const int tile, __m256 *even,
                              __m256 *odd) {
    const int64_t row_bytes = q8_row_bytes(groups);
    const int quad_bytes = 4 * group_bytes(kind);
    const uint8_t *row = byte_row(kind, m, r, groups);
    for (int b = 0; b < tile; b++) even[b] = odd[b] = _mm256_setzero_ps();
    int64_t g = 0;
    for (; g + 4 <= groups; g += 4) {
        const uint8_t *quad = row + quad_bytes * (g / 4);
        for (int at = 0; at < quad_bytes; at += 64)
            _mm_prefetch((const char *)(quad + at + PREFETCH_AHEAD), _MM_HINT_T0);
        __m256i lo0, hi0, lo1, hi1;
        pair_weights(kind, row, g, 0, &lo0, &hi0);
        pair_weights(kind, row, g + 2, 0, &lo1, &hi1);
        const __m128 d = group_scales(kind, m, row, r, g, groups, 4);
        for (int b = 0; b < tile; b++) {
            const int8_t *q = a->signed_bytes + (b0 + b) * row_bytes + 32 * g;
            const __m128 sc = _mm_mul_ps(d, _mm_loadu_ps(a->step + (b0 + b) * groups + g));
            even[b] = _mm256_fmadd_ps(pair_scales(sc, 0),
                                      _mm256_cvtepi32_ps(byte_pair_dot(kind, lo0, hi0, q)), even[b]);
            odd[b] = _mm256_fmadd_ps(pair_scales(sc, 1),
                                     _mm256_cvtepi32_ps(byte_pair_dot(kind, lo1, hi1, q + 32)), odd[b]);
        }
    }
    return g;
}

/* output rows r0..r1 of activation rows b0..b0 + tile (kind and tile constants where
   inlined, so that the accumulators stay in registers): one activation row takes eight output
   rows' results at once, a batch each output row's */
INLINE void byte_rows(const int kind, const ByteMatrix *m, const Activations *a, int64_t b0,
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
                __m256 even, odd;
                const int64_t g = byte_row_quads(kind, m, a, b0, r + j, groups, 1, &even, &odd);
                const RowTail rest = row_tail(kind, m, byte_row(kind, m, r + j, groups), r + j, g,
                                              groups);
                total[j] = byte_row_total(kind, &rest, a, b0, groups, even, odd);
            }
            store_lanes(byte_results(kind, total, m, r, 1, a->sum + b0 * groups, 0, n, groups),
                        y + b0 * rows + r, 1, n);
        }
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        __m256 even[4], odd[4];
        const int64_t g = byte_row_quads(kind, m, a, b0, r, groups, tile, even, odd);
        const RowTail rest = row_tail(kind, m, byte_row(kind, m, r, groups), r, g, groups);
        for (int b = 0; b < 8; b++)
            total[b] = b < tile ? byte_row_total(kind, &rest, a, b0 + b, groups, even[b], odd[b])
                                : _mm256_setzero_ps();
        store_lanes(byte_results(kind, total, m, r, 0, a->sum + b0 * groups, groups, tile, groups),
                    y + b0 * rows + r, rows, tile);
    }
}

#endif
