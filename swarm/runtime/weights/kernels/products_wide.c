/* products.c's rows for CPUs with AVX-512 (F, BW, VL) and VNNI. The 4-bit rows take a quad of
   groups per instruction: its 64 bytes of codes against 64 bytes of 8-bit activations, two
   dpbusd (four byte products summed per lane), products.c's even pairs in lanes 0..7 and odd
   pairs in 8..15. The int8 rows take a pair of groups: a 16-lane register holds a row's two
   sets of eight lanes (even groups low, odd groups high), the pair's activations come
   interleaved as products.c stores them, and a pair's two integer multiply-adds are one madd
   and one dpwssd (the same exact 32-bit sums). Scales multiply, lanes add and the last groups
   fold in exactly as products.c does, so the outputs are the same bits. Eight activation rows
   share each pass over the weights (there are registers for them), and from four on the int8
   rows take two output rows per pass. */
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")

#include "byte_rows_wide.h"
#include "products.h"

/* From this many activation rows on, the int8 rows run two output rows at a time: a pair of
   groups' activations is loaded, and its steps spread over the lanes, once for both rows. At
   8 activation rows that made the embedded model's products 1.26-1.36x faster (1 and 2
   threads). Under it they run one at a time: reading two rows' weights side by side defeats
   this CPU's own prefetching, and a one-row step from memory took twice as long. The 4-bit
   rows gained nothing from the same change (their steps differ per output row), so they
   stay one row at a time. */
#define PAIR_MIN_TILE 4

int swarm_wide_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
}

/* the pair's sum of products for one activation row: 16 lanes, group g's eight then g + 1's */
INLINE __m512i pair_dot(__m512i w0, __m512i w1, const int16_t *pair) {
    const __m512i low = _mm512_madd_epi16(w0, _mm512_loadu_si512((const void *)pair));
    return _mm512_dpwssd_epi32(low, w1, _mm512_loadu_si512((const void *)(pair + GROUP)));
}

/* eight lanes of x, then eight of y */
INLINE __m512 halves(__m256 x, __m256 y) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(x), y, 1);
}

void swarm_rows_q4_wide(const uint8_t *codes, const uint16_t *scale, const uint16_t *offset,
                        const Activations *a, int64_t b0, float *y, int64_t rows, int64_t cols,
                        int64_t r0, int64_t r1, int tile) {
    const ByteMatrix m = {codes, scale, offset};
    switch (tile) {
    case 1: byte_rows_wide(BYTE_Q4, &m, a, b0, y, rows, cols, r0, r1, 1); break;
    case 2: byte_rows_wide(BYTE_Q4, &m, a, b0, y, rows, cols, r0, r1, 2); break;
    case 3: byte_rows_wide(BYTE_Q4, &m, a, b0, y, rows, cols, r0, r1, 3); break;
    case 4: byte_rows_wide(BYTE_Q4, &m, a, b0, y, rows, cols, r0, r1, 4); break;
    case 5: byte_rows_wide(BYTE_Q4, &m, a, b0, y, rows, cols, r0, r1, 5); break;
    case 6: byte_rows_wide(BYTE_Q4, &m, a, b0, y, rows, cols, r0, r1, 6); break;
    case 7: byte_rows_wide(BYTE_Q4, &m, a, b0, y, rows, cols, r0, r1, 7); break;
    default: byte_rows_wide(BYTE_Q4, &m, a, b0, y, rows, cols, r0, r1, WIDE_TILE);
    }
}

/* a pair of groups' int8 values as their two halves widened: elements 0..15 of both groups,
   then 16..31 of both */
INLINE void i8_pair(const int8_t *p, __m512i *w0, __m512i *w1) {
    const __m256i first = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p)),
        _mm_loadu_si128((const __m128i *)(p + GROUP)), 1);
    const __m256i second = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p + 16))),
        _mm_loadu_si128((const __m128i *)(p + GROUP + 16)), 1);
    *w0 = _mm512_cvtepi8_epi16(first);
    *w1 = _mm512_cvtepi8_epi16(second);
}

/* output row r's sum from its accumulator: the last unpaired group into the even lanes */
INLINE float i8_finish(const int8_t *v, const float *scale, const Activations *a, int64_t b,
                       int64_t r, int64_t g, int64_t groups, int64_t cols, __m512 acc) {
    __m256 even = _mm512_castps512_ps256(acc);
    if (g < groups) {
        __m256i w0, w1;
        i8_halves(v + GROUP * g, &w0, &w1);
        const int64_t ag = b * groups + g;
        const __m256i dot = group_dot(w0, w1, a->q + b * cols, g, groups);
        even = _mm256_fmadd_ps(_mm256_set1_ps(a->step[ag]), _mm256_cvtepi32_ps(dot), even);
    }
    const __m256 odd = _mm512_extractf32x8_ps(acc, 1);
    return scale[r] * sum8(_mm256_add_ps(even, odd));
}

/* two output rows at a time where the tile is wide (PAIR_MIN_TILE), then one at a time; each
   row's sum is the same sequence of operations either way, so the bits do not change */
INLINE void rows_i8_tile(const int8_t *values, const float *scale, const Activations *a,
                         int64_t b0, float *y, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                         const int tile) {
    const int64_t groups = cols / GROUP;
    int64_t r = r0;
    for (; tile >= PAIR_MIN_TILE && r + 2 <= r1; r += 2) {
        const int8_t *v = values + r * cols, *u = v + cols;
        __m512 acc[WIDE_TILE], next[WIDE_TILE];
        for (int b = 0; b < tile; b++) acc[b] = next[b] = _mm512_setzero_ps();
        int64_t g = 0;
        for (; g + 2 <= groups; g += 2) {
            __m512i w0, w1, x0, x1;
            _mm_prefetch((const char *)(v + GROUP * g + PREFETCH_AHEAD), _MM_HINT_T0);
            _mm_prefetch((const char *)(u + GROUP * g + PREFETCH_AHEAD), _MM_HINT_T0);
            i8_pair(v + GROUP * g, &w0, &w1);
            i8_pair(u + GROUP * g, &x0, &x1);
            for (int b = 0; b < tile; b++) {
                const int64_t ag = (b0 + b) * groups + g;
                const __m512 steps =
                    halves(_mm256_set1_ps(a->step[ag]), _mm256_set1_ps(a->step[ag + 1]));
                const int16_t *q = a->q + (b0 + b) * cols + GROUP * g;
                const __m512i lo = _mm512_loadu_si512((const void *)q);
                const __m512i hi = _mm512_loadu_si512((const void *)(q + GROUP));
                const __m512i d0 = _mm512_dpwssd_epi32(_mm512_madd_epi16(w0, lo), w1, hi);
                const __m512i d1 = _mm512_dpwssd_epi32(_mm512_madd_epi16(x0, lo), x1, hi);
                acc[b] = _mm512_fmadd_ps(steps, _mm512_cvtepi32_ps(d0), acc[b]);
                next[b] = _mm512_fmadd_ps(steps, _mm512_cvtepi32_ps(d1), next[b]);
            }
        }
        for (int b = 0; b < tile; b++) {
            y[(b0 + b) * rows + r] = i8_finish(v, scale, a, b0 + b, r, g, groups, cols, acc[b]);
            y[(b0 + b) * rows + r + 1] =
                i8_finish(u, scale, a, b0 + b, r + 1, g, groups, cols, next[b]);
        }
    }
    for (; r < r1; r++) {
        const int8_t *v = values + r * cols;
        __m512 acc[WIDE_TILE];
        for (int b = 0; b < tile; b++) acc[b] = _mm512_setzero_ps();
        int64_t g = 0;
        for (; g + 2 <= groups; g += 2) {
            __m512i w0, w1;
            i8_pair(v + GROUP * g, &w0, &w1);
            for (int b = 0; b < tile; b++) {
                const int64_t ag = (b0 + b) * groups + g;
                const __m512 steps =
                    halves(_mm256_set1_ps(a->step[ag]), _mm256_set1_ps(a->step[ag + 1]));
                const __m512i dot = pair_dot(w0, w1, a->q + (b0 + b) * cols + GROUP * g);
                acc[b] = _mm512_fmadd_ps(steps, _mm512_cvtepi32_ps(dot), acc[b]);
            }
        }
        for (int b = 0; b < tile; b++)
            y[(b0 + b) * rows + r] = i8_finish(v, scale, a, b0 + b, r, g, groups, cols, acc[b]);
    }
}

void swarm_rows_i8_wide(const int8_t *values, const float *scale, const Activations *a,
                        int64_t b0, float *y, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                        int tile) {
    switch (tile) {
    case 1: rows_i8_tile(values, scale, a, b0, y, rows, cols, r0, r1, 1); break;
    case 2: rows_i8_tile(values, scale, a, b0, y, rows, cols, r0, r1, 2); break;
    case 3: rows_i8_tile(values, scale, a, b0, y, rows, cols, r0, r1, 3); break;
    case 4: rows_i8_tile(values, scale, a, b0, y, rows, cols, r0, r1, 4); break;
    case 5: rows_i8_tile(values, scale, a, b0, y, rows, cols, r0, r1, 5); break;
    case 6: rows_i8_tile(values, scale, a, b0, y, rows, cols, r0, r1, 6); break;
    case 7: rows_i8_tile(values, scale, a, b0, y, rows, cols, r0, r1, 7); break;
    default: rows_i8_tile(values, scale, a, b0, y, rows, cols, r0, r1, WIDE_TILE);
    }
}
