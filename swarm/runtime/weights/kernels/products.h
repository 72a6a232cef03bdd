/* What products.c and its AVX-512 twin products_wide.c share: the rounded activations, their
   layout, and the pieces both sum with, so that both give the same bits. */
#ifndef SWARM_PRODUCTS_H
#define SWARM_PRODUCTS_H

#include <immintrin.h>
#include <stdint.h>

#define GROUP 32
/* how far ahead (bytes of weights) a pass over a row asks for the weights it will read: the
   CPU's own prefetching alone left a one-row 4-bit pass waiting on memory (Q4_K groups, one
   thread, 18944 x 3584: 3.2-3.3 ms, 2.4-2.7 with it) */
#define PREFETCH_AHEAD 2048
#define INLINE static inline __attribute__((always_inline))

typedef struct {
    int16_t *q;        /* [batch, cols], groups stored as low_half_at says */
    float *step, *sum; /* [batch, groups]: each group's step and float sum */
    float *half;       /* [batch, groups, 2]: the float sums of its elements 0..15 and 16..31 */
    /* K-quant activations (kquant_rows.h), rounded once per block of 256 to 8 bits instead
       (step = absmax / 127, as llama.cpp rounds them for these types; block_step [batch,
       cols / 256]) and filled by swarm_split_kquant in place of q (NULL then), in element
       order: each value signed (signed_bytes) and plus 128 (biased_bytes), as maddubs takes
       one operand of each kind. step and half are not filled; sum is each group of 32's sum
       as rounded (its integers' sum times the block's step). */
    float *block_step;
    int8_t *signed_bytes;  /* [batch, cols] */
    uint8_t *biased_bytes; /* [batch, cols] */
} Activations;

/* x [batch, cols] rounded into the calling thread's scratch (products.c); 0 on success, -1
   when out of memory */
int swarm_split(const float *x, int64_t batch, int64_t cols, Activations *a);

/* x [batch, cols] rounded per block of 256 for kquant_rows.h (cols a multiple of 256), and each
   group of 32's sum as rounded, into the calling thread's scratch; 0 on success, -1 when out of
   memory */
int swarm_split_kquant(const float *x, int64_t batch, int64_t cols, Activations *a);

/* x [batch, cols] rounded to 8 bits per group of 32 for the 4-bit rows (q8_row_bytes below),
   into the calling thread's scratch; 0 on success, -1 when out of memory */
int swarm_split_q8(const float *x, int64_t batch, int64_t cols, Activations *a);

/* Where group g's elements 0..15 start within its row of q: groups are stored a pair at a
   time, halves interleaved (g's 0..15, g+1's 0..15, g's 16..31, g+1's 16..31); a last
   unpaired group as it comes. */
INLINE int64_t low_half_at(int64_t g, int64_t groups) {
    if (g == groups - 1 && groups % 2 == 1) return GROUP * g;
    return GROUP * (g & ~(int64_t)1) + (GROUP / 2) * (g & 1);
}

/* how far group g's elements 16..31 start after its elements 0..15 */
INLINE int64_t high_half_after(int64_t g, int64_t groups) {
    return g == groups - 1 && groups % 2 == 1 ? GROUP / 2 : GROUP;
}

/* sum over group g of w * q: w as its two halves of 16 int16, row a row of rounded
   activations; eight 32-bit lanes, lane i holding elements 2i, 2i + 1, 2i + 16, 2i + 17 */
INLINE __m256i group_dot(__m256i w0, __m256i w1, const int16_t *row, int64_t g,
                         int64_t groups) {
    const int16_t *lo = row + low_half_at(g, groups), *hi = lo + high_half_after(g, groups);
    return _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256((const __m256i *)lo)),
                            _mm256_madd_epi16(w1, _mm256_loadu_si256((const __m256i *)hi)));
}

/* a group's 32 int8 values as its two halves widened to int16 */
INLINE void i8_halves(const int8_t *values, __m256i *w0, __m256i *w1) {
    const __m256i w = _mm256_loadu_si256((const __m256i *)values);
    *w0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w));
    *w1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1));
}

INLINE float sum8(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* The 4-bit rows' activations (swarm_split_q8): rounded to 8 bits per group of 32 (step =
   absmax / 127, as llama.cpp rounds the activations of Q4_0 and Q4_1 blocks), so that a code
   (an unsigned byte 0..15) times an activation is one byte product, four of them summed per
   32-bit lane in one instruction (maddubs and madd, or dpbusd on AVX-512 VNNI). A row's values
   come four groups (a quad) at a time, 128 bytes: the four groups' elements 0..15, then their
   elements 16..31, as a quad of Q4 blocks' low and high nibbles lie; a row is padded with
   zeros to whole quads. step and sum hold each group's step and the sum of its rounded
   values (their integers' sum times the step): the offsets multiply the activations the codes
   multiply, so that a product is the exact dequantization's with the rounded activations, up
   to float32 conversions and sums (llama.cpp's Q8_1 keeps the same sum). */
INLINE int64_t q8_row_bytes(int64_t groups) { return 128 * ((groups + 3) / 4); }

/* where group g's elements 0..15 lie in its row (its elements 16..31 lie 64 bytes on) */
INLINE int64_t q8_low_at(int64_t g) { return 128 * (g / 4) + 16 * (g % 4); }

/* a pair of groups' 32 bytes of codes (group g's 16, then g + 1's) as their low nibbles
   (elements 0..15 of g, then of g + 1) and their high nibbles (elements 16..31) */
INLINE void q4_pair_codes(__m256i bytes, __m256i *lo, __m256i *hi) {
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    *lo = _mm256_and_si256(bytes, nibble);
    *hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
}

/* a pair's integer sums with one activation row (q: the pair's elements 0..15 in its quad;
   16..31 lie 64 bytes on): lane i (0..3 group g, 4..7 group g + 1) sums elements 4i..4i+3
   and 16 + 4i..16 + 4i + 3 (mod 16) of its group. |sum| <= 8 * 15 * 127: exact. */
INLINE __m256i q8_pair_dot(__m256i lo, __m256i hi, const int8_t *q) {
    const __m256i pairs =
        _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)q)),
                         _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q + 64))));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

/* a pair's scales, each group's in its four lanes: lanes 2j and 2j + 1 of s */
INLINE __m256 pair_scales(__m128 s, int j) {
    const __m256i pick = j ? _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3)
                           : _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(s), pick);
}

/* The groups after the last whole quad (1 to 3), for one output row (codes c, scales s) and
   one activation row b: a pair into *even (its pair of groups has an even index), then a last
   group alone into *even or *odd as its pair's index says, its partner's lanes zero. Both the
   AVX2 rows and the AVX-512 rows (on their two halves) end with this, so they agree. */
INLINE void q4_rows_tail(const uint8_t *c, const uint16_t *s, const Activations *a, int64_t b,
                         int64_t g, int64_t groups, __m256 *even, __m256 *odd) {
    const int8_t *row = a->signed_bytes + b * q8_row_bytes(groups);
    const float *step = a->step + b * groups;
    __m256i lo, hi;
    if (g + 2 <= groups) {
        q4_pair_codes(_mm256_loadu_si256((const __m256i *)(c + 16 * g)), &lo, &hi);
        const __m128 sc = _mm_setr_ps(_cvtsh_ss(s[g]) * step[g], _cvtsh_ss(s[g + 1]) * step[g + 1],
                                      0.f, 0.f);
        *even = _mm256_fmadd_ps(pair_scales(sc, 0),
                                _mm256_cvtepi32_ps(q8_pair_dot(lo, hi, row + q8_low_at(g))), *even);
        g += 2;
    }
    if (g < groups) {
        const __m128i codes = _mm_loadu_si128((const __m128i *)(c + 16 * g));
        q4_pair_codes(_mm256_inserti128_si256(_mm256_setzero_si256(), codes, 0), &lo, &hi);
        const __m128 sc = _mm_setr_ps(_cvtsh_ss(s[g]) * step[g], 0.f, 0.f, 0.f);
        __m256 *acc = (g / 2) % 2 ? odd : even;
        /* the partner's activations are the row's zero padding */
        *acc = _mm256_fmadd_ps(pair_scales(sc, 0),
                               _mm256_cvtepi32_ps(q8_pair_dot(lo, hi, row + q8_low_at(g))), *acc);
    }
}

/* a row's offsets times each group's float sum (sums: the activation row's): eight groups at
   a time, then the rest one by one */
INLINE float q4_offsets(const uint16_t *o, const float *sums, int64_t groups) {
    __m256 shift = _mm256_setzero_ps();
    int64_t g = 0;
    for (; g + 8 <= groups; g += 8)
        shift = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + g))),
                                _mm256_loadu_ps(sums + g), shift);
    float tail = 0.f;
    for (; g < groups; g++) tail += _cvtsh_ss(o[g]) * sums[g];
    return sum8(shift) + tail;
}

/* products_wide.c: 1 where this CPU runs it (AVX-512 F, BW, VL and VNNI) */
int swarm_wide_supported(void);

/* output rows r0..r1 of activation rows b0..b0 + tile (tile at most WIDE_TILE), as
   products.c's rows_q4 and rows_i8 compute them */
#define WIDE_TILE 8
void swarm_rows_q4_wide(const uint8_t *codes, const uint16_t *scale, const uint16_t *offset,
                        const Activations *a, int64_t b0, float *y, int64_t rows, int64_t cols,
                        int64_t r0, int64_t r1, int tile);
void swarm_rows_i8_wide(const int8_t *values, const float *scale, const Activations *a,
                        int64_t b0, float *y, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                        int tile);

#endif
