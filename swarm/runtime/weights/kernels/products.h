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
       as rounded (its integers' sum times the block's step).
       The byte rows' activations (byte_rows.h) fill signed_bytes alone, four groups at a
       time (q8_row_bytes below), with step and sum per group of 32; q NULL. */
    float *block_step;
    int16_t *sum16;        /* [batch, cols / 16]: each 16 K-quant activations' integer sum */
    /* [batch, cols / 4]: each 4 K-quant activations' integer sum, a block's 64 as Q3_K's
       rows take them (kquant_rows.h's kquant_quad_fix): the quads of pieces 0 and 1, then
       of pieces 2 and 3, side by side, quad L of the first in 16-bit slot 2L */
    int16_t *sum4;
    int8_t *signed_bytes;  /* [batch, cols], or [batch, q8_row_bytes] for the byte rows */
    uint8_t *biased_bytes; /* [batch, cols] */
} Activations;

/* a thread's scratch *buffer (of *bytes; a __thread pair, products.c's comment says why)
   grown to at least need bytes, on a cache line; 0 on success, -1 when out of memory (the
   old buffer kept) */
int swarm_grow(void **buffer, size_t *bytes, size_t need);

/* x [batch, cols] rounded into the calling thread's scratch (products.c); 0 on success, -1
   when out of memory */
int swarm_split(const float *x, int64_t batch, int64_t cols, Activations *a);

/* x [batch, cols] rounded per block of 256 for kquant_rows.h (cols a multiple of 256), and each
   group of 32's sum as rounded, into the calling thread's scratch; 0 on success, -1 when out of
   memory */
int swarm_split_kquant(const float *x, int64_t batch, int64_t cols, Activations *a);

/* x [batch, cols] rounded to 8 bits per group of 32 for the byte rows (q8_row_bytes below),
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

/* 32 bits -> 32 bytes, all ones where the bit is set: each byte takes its bit's byte of the
   word (a shuffle within 128-bit lanes), keeps its own bit and compares */
INLINE __m256i bit_bytes(uint32_t bits) {
    const __m256i spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                             0x0101010101010101, 0);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread);
    const __m256i own = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, own), own);
}

/* 0x10 where the bit is set: Q5_0's and Q5_1's fifth bits */
INLINE __m256i fifth_bits(uint32_t bits) { return _mm256_and_si256(bit_bytes(bits), _mm256_set1_epi8(0x10)); }

/* IQ4_NL's and IQ4_XS's sixteen values (ggml's kvalues_iq4nl), a code's value at its index */
INLINE __m128i iq4_values(void) {
    return _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
}

/* lane i: sum8(v[i]), by the same adds in the same order (adds commute), so that eight sums
   cost 12 instructions where eight sum8 calls cost 48, each waiting on the one before */
INLINE __m256 sum8x8(const __m256 *v) {
    __m256 halves[4]; /* [sum8's first adds of v[2i] | of v[2i + 1]] */
    for (int i = 0; i < 4; i++)
        halves[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20),
                                  _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
    /* its second: lanes (0 + 2, 1 + 3) of each, as [v0, v2 | v1, v3] and [v4, v6 | v5, v7] */
    const __m256 low = _mm256_add_ps(_mm256_shuffle_ps(halves[0], halves[1], 0x44),
                                     _mm256_shuffle_ps(halves[0], halves[1], 0xEE));
    const __m256 high = _mm256_add_ps(_mm256_shuffle_ps(halves[2], halves[3], 0x44),
                                      _mm256_shuffle_ps(halves[2], halves[3], 0xEE));
    /* its last: lane 0 + lane 1, as [v0, v2, v4, v6 | v1, v3, v5, v7] */
    const __m256 sums = _mm256_add_ps(_mm256_shuffle_ps(low, high, 0x88),
                                      _mm256_shuffle_ps(low, high, 0xDD));
    return _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* The byte rows' activations (swarm_split_q8; byte_rows.h: Q4_0, Q4_1 and Q8_0): rounded to 8
   bits per group of 32 (step = absmax / 127, as llama.cpp rounds them for these blocks), so
   that a weight times an activation is one byte product, four of them summed per 32-bit lane
   (maddubs and madd, or dpbusd on AVX-512 VNNI). A row's values
   come four groups (a quad) at a time, 128 bytes: the four groups' elements 0..15, then their
   elements 16..31, as a quad of Q4 blocks' low and high nibbles lie; a row is padded with
   zeros to whole quads. step and sum hold each group's step and the sum of its rounded
   values (their integers' sum times the step): the offsets multiply the activations the codes
   multiply, so that a product is the exact dequantization's with the rounded activations, up
   to float32 conversions and sums (llama.cpp's Q8_1 keeps the same sum). */
INLINE int64_t q8_row_bytes(int64_t groups) { return 128 * ((groups + 3) / 4); }

/* where group g's elements 0..15 lie in its row (its elements 16..31 lie 64 bytes on) */
INLINE int64_t q8_low_at(int64_t g) { return 128 * (g / 4) + 16 * (g % 4); }

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
