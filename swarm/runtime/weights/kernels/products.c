/* Products of float activations with compact weights, for x86-64 with AVX2.

   4-bit weights: w[r, 32g + i] = code[r, 32g + i] * scale[r, g] + offset[r, g], codes 0..15
   packed two per byte (a group's 16 bytes: low nibbles hold elements 0..15, high nibbles
   16..31, as in GGUF's Q4_0/Q4_1 blocks), scale and offset in float16. Activations are
   rounded per group of 32 to 8 bits (swarm_split_q8: step = absmax / 127, as llama.cpp rounds
   them for these blocks): sum_i w*x = scale * step * sum_i code * q + offset * step * sum_i q.
   A code times an activation is one byte product; four of them sum into a 32-bit lane in one
   instruction pair (maddubs, madd), exact. Against the int16 activations these rows took
   before, a batch's products run 1.3-1.8x faster (the embedded model's shapes and 4096 x
   4096, 4 and 9 rows, one thread), and each output is further from float32 by the 8-bit
   rounding (~5e-3 of the largest output instead of ~2e-5).

   8-bit weights: w[r, c] = value[r, c] * scale[r], values -127..127, one float scale per row
   (swarm.runtime.weights.quant's int8 form), activations rounded per group of 32 to int16
   (step = absmax / 32767): sum_c w*x = scale * sum_g step * sum_i value * q, a group's sum
   two integer multiply-adds (madd: 16 products summed in pairs into 32-bit lanes).

   Every output is computed by one thread, group after group, in the same order whatever the
   batch and the thread count: a row's result never depends on which other rows share the call.
   A row's sum keeps two sets of eight float lanes, for alternate groups (int8 rows) or pairs
   of groups (4-bit rows), added only at the end. That lets a CPU with AVX-512 VNNI
   (products_wide.c) hold both sets in one 16-lane register and do twice the groups per
   instruction with the same arithmetic: both paths give the same bits, so nodes on either
   agree.

   int16 activations are stored a pair of groups at a time, halves interleaved (group g's
   elements 0..15, group g+1's 0..15, g's 16..31, g+1's 16..31), so that the wide path loads
   each operand of a pair whole; a last unpaired group is stored as it comes. 8-bit ones come
   four groups at a time (products.h, q8_row_bytes).

   Called through module.c (swarm.runtime.weights.native). */
#include "byte_rows.h"
#include "kernels.h"
#include "products.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ROWS_PER_TASK 64 /* output rows a thread takes at a time */
#define BATCH_TILE 4     /* activation rows sharing one pass over the weights */

/* Each calling thread keeps one scratch buffer for its rounded activations, grown to the
   largest call so far and never freed: allocating it per call made every big product map and
   unmap fresh pages (glibc serves buffers over its mmap threshold that way), and freed heap
   buffers stayed resident. Its size is bounded by the largest prefill chunk: 2.5 bytes per
   activation, ~2.6 MB for 256 rows of width 4096.

   The buffer starts on a cache line and the rounded activations come first, so that every
   pair of groups (64 bytes) sits on one line: with malloc's 16-byte alignment, whether the
   AVX-512 rows' 64-byte loads each split across two lines was down to where the buffer
   landed. */
#define LINE 64
static __thread void *scratch = NULL;
static __thread size_t scratch_bytes = 0;

int swarm_grow(void **buffer, size_t *bytes, size_t need) {
    if (need <= *bytes) return 0;
    void *grown = NULL;
    if (posix_memalign(&grown, LINE, need) != 0) return -1;
    free(*buffer);
    *buffer = grown;
    *bytes = need;
    return 0;
}

/* the largest |v[i]| of n values (n a multiple of 8); exact whatever the order */
static inline float absmax(const float *v, int n) {
    const __m256 sign = _mm256_set1_ps(-0.f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + i)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

/* 8 values times inverse, rounded to the nearest integer (ties to even, as lrintf) within
   -most..most */
static inline __m256i rounded_within(const float *v, __m256 inverse, int most) {
    const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v), inverse));
    return _mm256_max_epi32(_mm256_min_epi32(q, _mm256_set1_epi32(most)), _mm256_set1_epi32(-most));
}

/* 0 on success, -1 when out of memory */
int swarm_split(const float *x, int64_t batch, int64_t cols, Activations *a) {
    const int64_t groups = cols / GROUP;
    const size_t values = (size_t)(batch * cols), steps = (size_t)(batch * groups);
    /* cols is a multiple of GROUP, so each row of int16 values is whole lines */
    const size_t need = sizeof(int16_t) * values + sizeof(float) * 4 * steps;
    if (swarm_grow(&scratch, &scratch_bytes, need) != 0) return -1;
    a->signed_bytes = NULL;
    a->biased_bytes = NULL;
    a->block_step = NULL;
    a->sum16 = a->sum4 = NULL;
    a->q = (int16_t *)scratch;
    a->step = (float *)(a->q + values);
    a->sum = a->step + steps;
    a->half = a->sum + steps;
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t g = 0; g < groups; g++) {
            const int64_t at = b * cols + GROUP * g;
            const float *v = x + at;
            int16_t *lo = a->q + b * cols + low_half_at(g, groups);
            int16_t *hi = lo + high_half_after(g, groups);
            float sum = 0.f, halves[2] = {0.f, 0.f};
            for (int i = 0; i < GROUP; i++) { /* in order: the sums' bits depend on it */
                sum += v[i];
                halves[i / (GROUP / 2)] += v[i];
            }
            const float step = absmax(v, GROUP) / 32767.f;
            const __m256 inverse = _mm256_set1_ps(step > 0.f ? 1.f / step : 0.f);
            for (int h = 0; h < 2; h++) { /* 16 values as int16 in order (packs interleaves lanes) */
                const __m256i q = _mm256_permute4x64_epi64(
                    _mm256_packs_epi32(rounded_within(v + 16 * h, inverse, 32767),
                                        rounded_within(v + 16 * h + 8, inverse, 32767)),
                    _MM_SHUFFLE(3, 1, 2, 0));
                _mm256_storeu_si256((__m256i *)(h ? hi : lo), q);
            }
            a->step[b * groups + g] = step;
            a->sum[b * groups + g] = sum;
            a->half[2 * (b * groups + g)] = halves[0];
            a->half[2 * (b * groups + g) + 1] = halves[1];
        }
    }
    return 0;
}

/* K-quant activations' own scratch, kept as the first one is (2 bytes a value, and the
   steps and sums). */
static __thread void *kquant_scratch = NULL;
static __thread size_t kquant_scratch_bytes = 0;

/* 32 rounded values as signed bytes and as bytes plus 128; their integers' sum (Q4_K's and
   Q5_K's offsets multiply it, so that they take the activations the codes take) */
static inline __m256i in_order(const __m256i q[4]) {
    /* packs interleave 128-bit lanes twice: 0 4 1 5 2 6 3 7 puts the 4-byte runs back in order */
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    return _mm256_permutevar8x32_epi32(
        _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])), order);
}

/* the sum of 32 rounded values */
static inline int integer_sum(const __m256i q[4]) {
    const __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(1, 0, 3, 2)));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(t);
}

static inline int bytes32(const float *v, __m256 inverse, int8_t *signed_bytes, uint8_t *biased) {
    __m256i q[4];
    for (int j = 0; j < 4; j++) q[j] = rounded_within(v + 8 * j, inverse, 127);
    const __m256i bytes = in_order(q);
    _mm256_storeu_si256((__m256i *)signed_bytes, bytes);
    _mm256_storeu_si256((__m256i *)biased, _mm256_xor_si256(bytes, _mm256_set1_epi8((char)0x80)));
    return integer_sum(q);
}

/* the integer sums of 32 activations' two halves of 16, from their bytes plus 128 */
static inline void sums16(const uint8_t *biased, int16_t *out) {
    const __m256i s = _mm256_sad_epu8(_mm256_loadu_si256((const __m256i *)biased), _mm256_setzero_si256());
    out[0] = (int16_t)(_mm256_extract_epi64(s, 0) + _mm256_extract_epi64(s, 1) - 16 * 128);
    out[1] = (int16_t)(_mm256_extract_epi64(s, 2) + _mm256_extract_epi64(s, 3) - 16 * 128);
}

/* a block's 64 sums of four (products.h's sum4 order), from its signed bytes: per half h of
   a piece, eight 32-bit lanes of quads 8h..8h+7; two pieces' lanes side by side in 16-bit
   slots (|sum| <= 4 * 127) */
static inline void sums4(const int8_t *bytes, int16_t *out) {
    const __m256i ones = _mm256_set1_epi8(1), pairs = _mm256_set1_epi16(1);
    for (int second = 0; second < 2; second++) /* pieces 0 and 1, then 2 and 3 */
        for (int h = 0; h < 2; h++) {
            const int8_t *at = bytes + 128 * second + 32 * h;
            const __m256i q0 = _mm256_madd_epi16(
                _mm256_maddubs_epi16(ones, _mm256_loadu_si256((const __m256i *)at)), pairs);
            const __m256i q1 = _mm256_madd_epi16(
                _mm256_maddubs_epi16(ones, _mm256_loadu_si256((const __m256i *)(at + 64))), pairs);
            _mm256_storeu_si256((__m256i *)(out + 32 * second + 16 * h),
                                _mm256_blend_epi16(q0, _mm256_slli_epi32(q1, 16), 0xAA));
        }
}

int swarm_split_kquant(const float *x, int64_t batch, int64_t cols, Activations *a) {
    const size_t values = (size_t)(batch * cols), blocks = values / 256, groups = values / GROUP;
    const size_t need = 2 * values + sizeof(float) * (blocks + groups) +
                        sizeof(int16_t) * (values / 16 + values / 4);
    if (swarm_grow(&kquant_scratch, &kquant_scratch_bytes, need) != 0) return -1;
    uint8_t *at = kquant_scratch; /* the values first: each row whole lines */
    a->q = NULL;
    a->signed_bytes = (int8_t *)at;
    a->biased_bytes = at + values;
    a->block_step = (float *)(at + 2 * values);
    a->sum = a->block_step + blocks;
    a->sum16 = (int16_t *)(a->sum + groups);
    a->sum4 = a->sum16 + values / 16;
    a->step = a->half = NULL;
    for (size_t block = 0; block < blocks; block++) {
        const float *v = x + 256 * block;
        const float step = absmax(v, 256) / 127.f;
        const __m256 inverse = _mm256_set1_ps(step > 0.f ? 1.f / step : 0.f);
        a->block_step[block] = step;
        for (int g = 0; g < 256 / GROUP; g++) {
            const size_t at = 256 * block + (size_t)(GROUP * g);
            const int sum = bytes32(v + GROUP * g, inverse, a->signed_bytes + at, a->biased_bytes + at);
            a->sum[block * (256 / GROUP) + g] = (float)sum * step;
            sums16(a->biased_bytes + at, a->sum16 + at / 16);
        }
        sums4(a->signed_bytes + 256 * block, a->sum4 + 64 * block);
    }
    return 0;
}

int swarm_split_q8(const float *x, int64_t batch, int64_t cols, Activations *a) {
    const int64_t groups = cols / GROUP, row_bytes = q8_row_bytes(groups);
    const size_t steps = (size_t)(batch * groups);
    /* the values first (whole lines a row), then the steps and the sums */
    const size_t need = (size_t)(batch * row_bytes) + sizeof(float) * 2 * steps;
    if (swarm_grow(&scratch, &scratch_bytes, need) != 0) return -1;
    a->q = NULL;
    a->biased_bytes = NULL;
    a->block_step = a->half = NULL;
    a->sum16 = a->sum4 = NULL;
    a->signed_bytes = (int8_t *)scratch;
    a->step = (float *)(a->signed_bytes + batch * row_bytes);
    a->sum = a->step + steps;
    for (int64_t b = 0; b < batch; b++) {
        int8_t *row = a->signed_bytes + b * row_bytes;
        if (groups % 4) /* the last quad's missing groups stay zero */
            memset(row + row_bytes - 128, 0, 128);
        for (int64_t g = 0; g < groups; g++) {
            const float *v = x + b * cols + GROUP * g;
            const float step = absmax(v, GROUP) / 127.f;
            const __m256 inverse = _mm256_set1_ps(step > 0.f ? 1.f / step : 0.f);
            __m256i q[4];
            for (int j = 0; j < 4; j++) q[j] = rounded_within(v + 8 * j, inverse, 127);
            const __m256i bytes = in_order(q);
            const float sum = (float)integer_sum(q) * step;
            int8_t *lo = row + q8_low_at(g);
            _mm_storeu_si128((__m128i *)lo, _mm256_castsi256_si128(bytes));
            _mm_storeu_si128((__m128i *)(lo + 64), _mm256_extracti128_si256(bytes, 1));
            a->step[b * groups + g] = step;
            a->sum[b * groups + g] = sum;
        }
    }
    return 0;
}

/* the 4-bit rows (byte_rows.h), the tile a constant where each is inlined */
static void rows_q4(const uint8_t *codes, const uint16_t *scale, const uint16_t *offset,
                    const Activations *a, int64_t b0, float *y, int64_t rows, int64_t cols,
                    int64_t r0, int64_t r1, int tile) {
    const ByteMatrix m = {codes, scale, offset};
    switch (tile) {
    case 1: byte_rows(BYTE_Q4, &m, a, b0, y, rows, cols, r0, r1, 1); break;
    case 2: byte_rows(BYTE_Q4, &m, a, b0, y, rows, cols, r0, r1, 2); break;
    case 3: byte_rows(BYTE_Q4, &m, a, b0, y, rows, cols, r0, r1, 3); break;
    default: byte_rows(BYTE_Q4, &m, a, b0, y, rows, cols, r0, r1, BATCH_TILE);
    }
}

/* One group of int8 values times tile rows of activations, into acc. */
INLINE void group_i8(const int8_t *v, const Activations *a, int64_t b0, int64_t g, int64_t cols,
                     const int tile, __m256 *acc) {
    const int64_t groups = cols / GROUP;
    __m256i w0, w1;
    i8_halves(v + GROUP * g, &w0, &w1);
    for (int b = 0; b < tile; b++) {
        const int64_t ag = (b0 + b) * groups + g;
        const __m256i dot = group_dot(w0, w1, a->q + (b0 + b) * cols, g, groups);
        acc[b] = _mm256_fmadd_ps(_mm256_broadcast_ss(a->step + ag), _mm256_cvtepi32_ps(dot),
                                 acc[b]);
    }
}

/* a constant tile where inlined (rows_i8), two accumulators a row for alternate groups */
INLINE void rows_i8_tile(const int8_t *values, const float *scale, const Activations *a,
                         int64_t b0, float *y, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                         const int tile) {
    const int64_t groups = cols / GROUP;
    for (int64_t r = r0; r < r1; r++) {
        const int8_t *v = values + r * cols;
        __m256 acc[BATCH_TILE], odd[BATCH_TILE];
        for (int b = 0; b < tile; b++) acc[b] = odd[b] = _mm256_setzero_ps();
        int64_t g = 0;
        for (; g + 2 <= groups; g += 2) {
            group_i8(v, a, b0, g, cols, tile, acc);
            group_i8(v, a, b0, g + 1, cols, tile, odd);
        }
        if (g < groups) group_i8(v, a, b0, g, cols, tile, acc);
        for (int b = 0; b < tile; b++)
            y[(b0 + b) * rows + r] = scale[r] * sum8(_mm256_add_ps(acc[b], odd[b]));
    }
}

static void rows_i8(const int8_t *values, const float *scale, const Activations *a, int64_t b0,
                    float *y, int64_t rows, int64_t cols, int64_t r0, int64_t r1, int tile) {
    switch (tile) {
    case 1: rows_i8_tile(values, scale, a, b0, y, rows, cols, r0, r1, 1); break;
    case 2: rows_i8_tile(values, scale, a, b0, y, rows, cols, r0, r1, 2); break;
    case 3: rows_i8_tile(values, scale, a, b0, y, rows, cols, r0, r1, 3); break;
    default: rows_i8_tile(values, scale, a, b0, y, rows, cols, r0, r1, BATCH_TILE);
    }
}

typedef struct {
    int four_bit;            /* 1: codes, scale and offset per group; 0: int8 values, row scale */
    const void *values;      /* uint8 codes [rows, cols / 2] or int8 values [rows, cols] */
    const void *scale;       /* float16 [rows, groups] or float [rows] */
    const uint16_t *offset;  /* float16 [rows, groups]; unused for int8 */
} Weights;

static int wide = 0; /* whether products run products_wide.c's rows (swarm_use_wide) */

int swarm_use_wide(int want) {
    wide = want && swarm_wide_supported();
    return wide;
}

int swarm_wide(void) { return wide; }

/* y [batch, rows] = x [batch, cols] @ w.T; 0 on success, -1 when out of memory */
static int product(const Weights *w, const float *x, float *y, int64_t rows, int64_t cols,
                   int64_t batch, int threads) {
    Activations a;
    if ((w->four_bit ? swarm_split_q8(x, batch, cols, &a) : swarm_split(x, batch, cols, &a)) != 0)
        return -1;
    const int64_t tasks = (rows + ROWS_PER_TASK - 1) / ROWS_PER_TASK;
    const int use_wide = wide, most = use_wide ? WIDE_TILE : BATCH_TILE;
    /* tasks taken as threads come free, not half each: on a machine whose cores are shared, a
       thread held up for a moment no longer holds up the whole product (a 7B decode step's
       products, two threads: median 188 to 162 ms over ten alternated runs); a row is still
       one thread's, so its bits do not change */
#pragma omp parallel for num_threads(threads) schedule(dynamic) if (threads > 1)
    for (int64_t task = 0; task < tasks; task++) {
        const int64_t r0 = task * ROWS_PER_TASK;
        const int64_t r1 = r0 + ROWS_PER_TASK < rows ? r0 + ROWS_PER_TASK : rows;
        for (int64_t b = 0; b < batch; b += most) {
            const int tile = batch - b < most ? (int)(batch - b) : most;
            if (w->four_bit && use_wide)
                swarm_rows_q4_wide(w->values, w->scale, w->offset, &a, b, y, rows, cols, r0, r1,
                                   tile);
            else if (w->four_bit)
                rows_q4(w->values, w->scale, w->offset, &a, b, y, rows, cols, r0, r1, tile);
            else if (use_wide)
                swarm_rows_i8_wide(w->values, w->scale, &a, b, y, rows, cols, r0, r1, tile);
            else
                rows_i8(w->values, w->scale, &a, b, y, rows, cols, r0, r1, tile);
        }
    }
    return 0;
}

int swarm_q4_matmul(const uint8_t *codes, const uint16_t *scale, const uint16_t *offset,
                    const float *x, float *y, int64_t rows, int64_t cols, int64_t batch,
                    int threads) {
    const Weights w = {1, codes, scale, offset};
    return product(&w, x, y, rows, cols, batch, threads);
}

int swarm_i8_matmul(const int8_t *values, const float *scale, const float *x, float *y,
                    int64_t rows, int64_t cols, int64_t batch, int threads) {
    const Weights w = {0, values, scale, NULL};
    return product(&w, x, y, rows, cols, batch, threads);
}
