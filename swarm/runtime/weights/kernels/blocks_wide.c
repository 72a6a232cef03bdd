/* blocks.c's rows for CPUs with AVX-512 (F, BW, VL) and VNNI, as products_wide.c is to
   products.c: a 16-lane register holds a row's two sets of eight lanes (even groups low, odd
   groups high), a pair of groups' codes widen as one, and its integer multiply-adds are one
   madd and one dpwssd. Each lane takes the same integer sums and the same float
   multiply-adds, in the same order, as in blocks.c, and the last unpaired group and the final
   sums fold in as there: the outputs are the same bits. Eight activation rows share each
   decoded chunk (blocks.c: four); how many share it does not change a row's bits. */
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")

#include "block_decode.h"
#include "block_steps.h"
#include "blocks.h"
#include "products.h"
#include "kquant_rows_wide.h"
#include "byte_rows_wide.h"
#include "wide_sums.h"


/* eight lanes of x, then eight of y */
INLINE __m512 pair_of(float x, float y) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(x)), _mm256_set1_ps(y), 1);
}

/* 16 codes at p and 16 at q, widened: p's in lanes 0..15, q's in 16..31 */
INLINE __m512i widen_two(const int8_t *p, const int8_t *q) {
    const __m256i both = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p)),
        _mm_loadu_si128((const __m128i *)q), 1);
    return _mm512_cvtepi8_epi16(both);
}

/* groups j and j + 1 of the chunk (g even, so the activations hold them as a pair) */
INLINE void pair_rows(const int per32, const Chunk *c, int j, int64_t g, const Activations *a,
                      int64_t b0, int64_t cols, const int tile, float f[][CHUNK / SUB],
                      __m512 *acc) {
    const int8_t *codes = c->codes + GROUP * j;
    const __m512i w0 = widen_two(codes, codes + GROUP);           /* elements 0..15 of both */
    const __m512i w1 = widen_two(codes + 16, codes + GROUP + 16); /* elements 16..31 */
    for (int b = 0; b < tile; b++) {
        const int16_t *q = a->q + (b0 + b) * cols + GROUP * g;
        const __m512i lo = _mm512_loadu_si512((const void *)q);
        const __m512i hi = _mm512_loadu_si512((const void *)(q + GROUP));
        if (per32) {
            const __m512i dot = _mm512_dpwssd_epi32(_mm512_madd_epi16(w0, lo), w1, hi);
            acc[b] = _mm512_fmadd_ps(pair_of(f[b][j], f[b][j + 1]), _mm512_cvtepi32_ps(dot),
                                     acc[b]);
        } else {
            const __m512i d0 = _mm512_madd_epi16(w0, lo), d1 = _mm512_madd_epi16(w1, hi);
            acc[b] = _mm512_fmadd_ps(pair_of(f[b][2 * j], f[b][2 * j + 2]),
                                     _mm512_cvtepi32_ps(d0), acc[b]);
            acc[b] = _mm512_fmadd_ps(pair_of(f[b][2 * j + 1], f[b][2 * j + 3]),
                                     _mm512_cvtepi32_ps(d1), acc[b]);
        }
    }
}

/* a row's last unpaired group (only 32-weight types have one, and they are per32) into the
   even lanes, as blocks.c's group_rows does */
INLINE void last_group(const Chunk *c, int j, int64_t g, const Activations *a, int64_t b0,
                       int64_t cols, const int tile, float f[][CHUNK / SUB], __m512 *acc) {
    const int64_t groups = cols / GROUP;
    __m256i w0, w1;
    i8_halves(c->codes + GROUP * j, &w0, &w1);
    for (int b = 0; b < tile; b++) {
        const __m256i dot = group_dot(w0, w1, a->q + (b0 + b) * cols, g, groups);
        const __m256 even = _mm256_fmadd_ps(_mm256_broadcast_ss(&f[b][j]), _mm256_cvtepi32_ps(dot),
                                            _mm512_castps512_ps256(acc[b]));
        acc[b] = _mm512_insertf32x8(acc[b], even, 0);
    }
}

/* Output rows r..r + R - 1 (R a constant: 2 for one activation row, else 1) over tile
   activation rows. With one activation row a row's sums are one chain of dependent
   multiply-adds (two a pair of groups for types with scales per 16), so two output rows run
   side by side, each its own chain; each row's lanes see the same operations in the same
   order either way, so its bits do not change (Q8_0, one thread, 3584 x 18944: 8.7 to
   7.5 ms). */
INLINE void rows_block(const Decoder decode, const int elements, const int nbytes,
                       const int per32, const int offsets, const uint8_t *data,
                       const int8_t *grid, const Activations *a, int64_t b0, float *y,
                       int64_t rows, int64_t cols, int64_t r, const int tile, const int R,
                       Chunk c[2]) {
    const int64_t row_bytes = cols / elements * nbytes, groups = cols / GROUP;
    float f[2][WIDE_TILE][CHUNK / SUB];
    __m512 acc[2][WIDE_TILE];
    __m256 shift[2][WIDE_TILE];
    wide_sums_start(acc, shift, R, tile);
    for (int64_t start = 0; start < cols; start += CHUNK) {
        const int n = cols - start < CHUNK ? (int)(cols - start) : CHUNK;
        const int64_t g0 = start / GROUP;
        for (int k = 0; k < R; k++) {
            const int64_t done = start / elements * nbytes;
            const uint8_t *src = data + (r + k) * row_bytes + done;
            const uint8_t *next = blocks_ahead(src, done, row_bytes, R);
            for (int at = 0; at < CHUNK / elements * nbytes; at += 64)
                _mm_prefetch((const char *)(next + at), _MM_HINT_T0);
            decode(src, n / elements, grid, &c[k]);
            chunk_steps(per32, offsets, &c[k], g0, n / GROUP, a, b0, groups, tile, f[k],
                        shift[k]);
        }
        int j = 0;
        for (; j + 2 <= n / GROUP; j += 2)
            for (int k = 0; k < R; k++)
                pair_rows(per32, &c[k], j, g0 + j, a, b0, cols, tile, f[k], acc[k]);
        if (j < n / GROUP)
            for (int k = 0; k < R; k++)
                last_group(&c[k], j, g0 + j, a, b0, cols, tile, f[k], acc[k]);
    }
    wide_sums_fold(acc, shift, R, tile, y, rows, b0, r);
}

/* Whether one activation row's output rows run two side by side: for long rows, where the
   two chains of multiply-adds hide each other's latency (Q6_K 3584 x 18944, two threads: 2.7
   to 2.3 ms), not for short ones, where the two streams of blocks cost the prefetching more
   than that (a Q6_K head of 152064 x 3584: 17.5 ms one at a time, 21.3 side by side). */
INLINE int side_by_side(int64_t cols) { return cols >= 8192; }

INLINE void rows_tile(const Decoder decode, const int elements, const int nbytes,
                      const int per32, const int offsets, const uint8_t *data,
                      const int8_t *grid, const Activations *a, int64_t b0, float *y,
                      int64_t rows, int64_t cols, int64_t r0, int64_t r1, const int tile) {
    int64_t r = r0;
    const int kquant = kquant_kind(decode);
    if (kquant >= 0) { /* kquant_rows.h; a batch one output row at a time over up to
                          WIDE_TILE activation rows (Q4_K 37888 x 3584, 64 rows, one
                          thread: 54-65 GMAC/s, 43-50 with two output rows over 4 or 8) */
        if (tile == 1 && side_by_side(cols))
            for (; r + 2 <= r1; r += 2) kquant_rows_wide(kquant, data, grid, a, b0, y, rows, cols, r, 1, 2);
        for (; r < r1; r++) kquant_rows_wide(kquant, data, grid, a, b0, y, rows, cols, r, tile, 1);
        return;
    }
    const int bytes = byte_kind(decode);
    if (bytes >= 0) {
        const ByteMatrix m = {data, NULL, NULL};
        byte_rows_wide(bytes, &m, a, b0, y, rows, cols, r0, r1, tile);
        return;
    }
    Chunk c[2] = {0};
    if (tile == 1 && side_by_side(cols))
        for (; r + 2 <= r1; r += 2)
            rows_block(decode, elements, nbytes, per32, offsets, data, grid, a, b0, y, rows,
                       cols, r, 1, 2, c);
    for (; r < r1; r++)
        rows_block(decode, elements, nbytes, per32, offsets, data, grid, a, b0, y, rows, cols,
                   r, tile, 1, c);
}

#define WIDE_ROWS(NAME, E, B, P, O)                                                           \
    void swarm_wide_rows_##NAME(const uint8_t *data, const int8_t *grid, const Activations *a, \
                                int64_t b0, float *y, int64_t rows, int64_t cols, int64_t r0,  \
                                int64_t r1, int tile) {                                        \
        switch (tile) {                                                                        \
        case 1: rows_tile(NAME, E, B, P, O, data, grid, a, b0, y, rows, cols, r0, r1, 1); break; \
        case 2: rows_tile(NAME, E, B, P, O, data, grid, a, b0, y, rows, cols, r0, r1, 2); break; \
        case 3: rows_tile(NAME, E, B, P, O, data, grid, a, b0, y, rows, cols, r0, r1, 3); break; \
        case 4: rows_tile(NAME, E, B, P, O, data, grid, a, b0, y, rows, cols, r0, r1, 4); break; \
        case 5: rows_tile(NAME, E, B, P, O, data, grid, a, b0, y, rows, cols, r0, r1, 5); break; \
        case 6: rows_tile(NAME, E, B, P, O, data, grid, a, b0, y, rows, cols, r0, r1, 6); break; \
        case 7: rows_tile(NAME, E, B, P, O, data, grid, a, b0, y, rows, cols, r0, r1, 7); break; \
        default:                                                                               \
            rows_tile(NAME, E, B, P, O, data, grid, a, b0, y, rows, cols, r0, r1, WIDE_TILE);  \
        }                                                                                      \
    }

#define BLOCK_KIND(NAME, GGUF, E, B, P, O) WIDE_ROWS(NAME, E, B, P, O)
#include "block_kinds.h"

/* Q3_K at batch (kquant_rows_wide.h's q3_k_ready_rows): output rows r0..r1 times all `batch`
   activation rows, SCALED_ROWS output rows' blocks made ready at a time, taken a span of
   blocks at a time so that the span's ready blocks (384 bytes each) stay within 32 KiB of
   the first-level cache while every activation row passes (3584 x 18944, 64 rows: 47.9-49.8
   ms read whole from the second level, whether 4 rows or 1 at a time) */
int swarm_wide_q3_k_batch(const uint8_t *data, const Activations *a, int64_t batch, float *y,
                          int64_t rows, int64_t cols, int64_t r0, int64_t r1) {
    const int64_t blocks = cols / 256, row_bytes = blocks * kquant_block_size(KQUANT_Q3_K);
    const int64_t span_fit = (32 * 1024) / ((int64_t)sizeof(Q3Block) * SCALED_ROWS);
    const int64_t span = span_fit < 1 ? 1 : span_fit;
    /* the ready blocks, then the rows' sums between spans, in the thread's own buffer */
    static __thread void *scratch = NULL;
    static __thread size_t scratch_bytes = 0;
    const size_t ready_bytes = sizeof(Q3Block) * SCALED_ROWS * (size_t)blocks;
    const size_t acc_bytes = blocks > span ? sizeof(__m512) * SCALED_ROWS * (size_t)batch : 0;
    if (swarm_grow(&scratch, &scratch_bytes, ready_bytes + acc_bytes) != 0) return -1;
    Q3Block *ready = scratch;
    __m512 *acc = (__m512 *)((char *)scratch + ready_bytes);
    for (int64_t r = r0; r < r1; r += SCALED_ROWS) {
        const int G = r1 - r < SCALED_ROWS ? (int)(r1 - r) : SCALED_ROWS;
        for (int k = 0; k < G; k++)
            for (int64_t j = 0; j < blocks; j++)
                q3_k_prepare(data + (r + k) * row_bytes + j * kquant_block_size(KQUANT_Q3_K), &ready[k * blocks + j]);
        for (int64_t j0 = 0; j0 < blocks; j0 += span) {
            const int64_t j1 = j0 + span < blocks ? j0 + span : blocks;
            switch (G) {
            case 1: q3_k_ready_rows(ready, a, batch, y, rows, cols, r, j0, j1, acc, 1); break;
            case 2: q3_k_ready_rows(ready, a, batch, y, rows, cols, r, j0, j1, acc, 2); break;
            case 3: q3_k_ready_rows(ready, a, batch, y, rows, cols, r, j0, j1, acc, 3); break;
            default: q3_k_ready_rows(ready, a, batch, y, rows, cols, r, j0, j1, acc, SCALED_ROWS);
            }
        }
    }
    return 0;
}
