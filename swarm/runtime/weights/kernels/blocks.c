/* Products of float activations with GGUF's blocks as the file stores them, for every block
   type (block_decode.c), on AVX2.

   The weights stay in their blocks (1.00x the file's bytes). A pass over an output row
   decodes one chunk of up to 256 weights at a time into int8 codes with a float scale and
   offset per 16 weights (blocks.h; exact for every type), and multiplies the chunk with up to
   BLOCK_TILE activation rows while it sits in L1, so a batch decodes each chunk once.

   Activations are rounded as products.c rounds them (int16 per group of 32, step = absmax /
   32767, the same scratch). A group's sum of codes times rounded activations is integer
   multiply-adds, exact in 32 bits and in its conversion to float (|code| <= 128, four
   products a lane: < 2^24); it is scaled by scale * step, per 32 weights where the type's
   scales are (one multiply-add), per 16 where they are not (Q2_K, Q3_K, Q6_K, IQ2_XS, IQ2_S,
   IQ1_M: two); a chunk's scales times its steps are one vector product, its offsets times the
   activations' sums one multiply-add. Offsets (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) multiply the float sums of the
   activations they cover, unrounded. So each output is the product of the exact
   dequantization with the rounded activations, up to float32 sums.

   As in products.c, one thread computes each output, group after group in the same order
   whatever the batch, the tile and the thread count, in two sets of eight lanes (even and odd
   groups) added at the end: a row's result never depends on the rows that share its call.
   On CPUs with AVX-512 VNNI, blocks_wide.c runs the same rows a pair of groups per
   instruction, with the same bits (chosen as products.c chooses: swarm_use_wide).

   Q2_K to Q6_K and IQ4_XS, most of a K-quant file's bytes, take rows of their own instead
   (kquant_rows.h): their blocks decode in registers and a block's products sum as integers,
   the activations rounded per block of 256, with the same guarantees. So do Q8_0, Q5_0,
   Q5_1 and IQ4_NL (byte_rows.h): their codes multiply activations rounded to bytes per group
   of 32. */
#include "block_decode.h"
#include "block_steps.h"
#include "blocks.h"
#include "kernels.h"
#include "products.h"
#include "kquant_rows.h"
#include "byte_rows.h"

#define ROWS_PER_TASK 64 /* output rows a thread takes at a time */
#define BLOCK_TILE 4     /* activation rows sharing one decoded chunk */

/* one group (32 weights: codes j * 32 of the chunk) times tile rows of activations; f[b]
   holds each row's scale * step for the chunk (per group where per32, else per 16 weights) */
INLINE void group_rows(const int per32, const Chunk *c, int j, int64_t g, const Activations *a,
                       int64_t b0, int64_t cols, const int tile, float f[][CHUNK / SUB],
                       __m256 *acc) {
    const int64_t groups = cols / GROUP;
    __m256i w0, w1;
    i8_halves(c->codes + GROUP * j, &w0, &w1);
    for (int b = 0; b < tile; b++) {
        const int16_t *lo = a->q + (b0 + b) * cols + low_half_at(g, groups);
        const int16_t *hi = lo + high_half_after(g, groups);
        const __m256i d0 = _mm256_madd_epi16(w0, _mm256_loadu_si256((const __m256i *)lo));
        const __m256i d1 = _mm256_madd_epi16(w1, _mm256_loadu_si256((const __m256i *)hi));
        if (per32) {
            acc[b] = _mm256_fmadd_ps(_mm256_broadcast_ss(&f[b][j]),
                                     _mm256_cvtepi32_ps(_mm256_add_epi32(d0, d1)), acc[b]);
        } else {
            acc[b] = _mm256_fmadd_ps(_mm256_broadcast_ss(&f[b][2 * j]), _mm256_cvtepi32_ps(d0),
                                     acc[b]);
            acc[b] = _mm256_fmadd_ps(_mm256_broadcast_ss(&f[b][2 * j + 1]),
                                     _mm256_cvtepi32_ps(d1), acc[b]);
        }
    }
}

/* The type's decoder, sizes and flags and `tile` are constants where this is inlined
   (BLOCK_ROWS), so that the decoder inlines and the accumulators stay in registers. */
INLINE void rows_tile(const Decoder decode, const int elements, const int nbytes,
                      const int per32, const int offsets, const uint8_t *data,
                      const int8_t *grid, const Activations *a, int64_t b0, float *y,
                      int64_t rows, int64_t cols, int64_t r0, int64_t r1, const int tile) {
    const int kquant = kquant_kind(decode);
    if (kquant >= 0) {
        kquant_rows(kquant, data, grid, a, b0, y, rows, cols, r0, r1, tile);
        return;
    }
    const int bytes = byte_kind(decode);
    if (bytes >= 0) {
        const ByteMatrix m = {data, NULL, NULL};
        byte_rows(bytes, &m, a, b0, y, rows, cols, r0, r1, tile);
        return;
    }
    const int64_t row_bytes = cols / elements * nbytes, groups = cols / GROUP;
    Chunk c = {0};
    float f[BLOCK_TILE][CHUNK / SUB];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = data + r * row_bytes;
        __m256 even[BLOCK_TILE], odd[BLOCK_TILE], shift[BLOCK_TILE];
        for (int b = 0; b < tile; b++) even[b] = odd[b] = shift[b] = _mm256_setzero_ps();
        for (int64_t start = 0; start < cols; start += CHUNK) {
            const int n = cols - start < CHUNK ? (int)(cols - start) : CHUNK;
            const uint8_t *src = row + start / elements * nbytes;
            for (int at = 0; at < CHUNK / elements * nbytes; at += 64)
                _mm_prefetch((const char *)(src + BLOCK_PREFETCH_AHEAD + at), _MM_HINT_T0);
            decode(src, n / elements, grid, &c);
            const int64_t g0 = start / GROUP; /* even: a chunk is 8 groups, or the row's end */
            chunk_steps(per32, offsets, &c, g0, n / GROUP, a, b0, groups, tile, f, shift);
            int j = 0;
            for (; j + 2 <= n / GROUP; j += 2) {
                group_rows(per32, &c, j, g0 + j, a, b0, cols, tile, f, even);
                group_rows(per32, &c, j + 1, g0 + j + 1, a, b0, cols, tile, f, odd);
            }
            if (j < n / GROUP) group_rows(per32, &c, j, g0 + j, a, b0, cols, tile, f, even);
        }
        for (int b = 0; b < tile; b++)
            y[(b0 + b) * rows + r] = sum8(_mm256_add_ps(even[b], odd[b])) + sum8(shift[b]);
    }
}

typedef void (*Rows)(const uint8_t *data, const int8_t *grid, const Activations *a, int64_t b0,
                     float *y, int64_t rows, int64_t cols, int64_t r0, int64_t r1, int tile);

/* rows_NAME: the rows of one type, its decoder NAME (block_decode.h) inlined; E and B its
   block's elements and bytes, P whether its scales and offsets come per 32 weights, O whether
   it has offsets */
#define BLOCK_ROWS(NAME, E, B, P, O)                                                          \
    static void rows_##NAME(const uint8_t *data, const int8_t *grid, const Activations *a,  \
                            int64_t b0, float *y, int64_t rows, int64_t cols, int64_t r0,   \
                            int64_t r1, int tile) {                                         \
        switch (tile) {                                                                     \
        case 1: rows_tile(NAME, E, B, P, O, data, grid, a, b0, y, rows, cols, r0, r1, 1); break; \
        case 2: rows_tile(NAME, E, B, P, O, data, grid, a, b0, y, rows, cols, r0, r1, 2); break; \
        case 3: rows_tile(NAME, E, B, P, O, data, grid, a, b0, y, rows, cols, r0, r1, 3); break; \
        default:                                                                            \
            rows_tile(NAME, E, B, P, O, data, grid, a, b0, y, rows, cols, r0, r1, BLOCK_TILE); \
        }                                                                                   \
    }

#define BLOCK_KIND(NAME, GGUF, E, B, P, O) BLOCK_ROWS(NAME, E, B, P, O)
#include "block_kinds.h"
#undef BLOCK_KIND

/* blocks_wide.c's twins, the same bits on AVX-512 VNNI */
#define BLOCK_KIND(NAME, GGUF, E, B, P, O)                                                    \
    void swarm_wide_rows_##NAME(const uint8_t *data, const int8_t *grid, const Activations *a, \
                                int64_t b0, float *y, int64_t rows, int64_t cols, int64_t r0,  \
                                int64_t r1, int tile);
#include "block_kinds.h"
#undef BLOCK_KIND
/* Q3_K's output rows r0..r1 times all activation rows on AVX-512 VNNI (blocks_wide.c): the
   same bits; -1 when out of memory */
int swarm_wide_q3_k_batch(const uint8_t *data, const Activations *a, int64_t batch, float *y,
                          int64_t rows, int64_t cols, int64_t r0, int64_t r1);

typedef struct {
    const char *name; /* GGUF's name for the type */
    int elements;     /* weights per block */
    Decoder decode;   /* its decoder (block_decode.h) */
    Rows rows, wide;  /* AVX2 rows, AVX-512 rows */
} BlockKind;

/* Swarm's Python side takes this order by name (block_types()), never by position. */
static const BlockKind KINDS[] = {
#define BLOCK_KIND(NAME, GGUF, E, B, P, O) {GGUF, E, NAME, rows_##NAME, swarm_wide_rows_##NAME},
#include "block_kinds.h"
#undef BLOCK_KIND
};
#define KIND_COUNT ((int)(sizeof(KINDS) / sizeof(KINDS[0])))

int swarm_block_matmul(int kind, const uint8_t *data, const int8_t *grid, const float *x,
                       float *y, int64_t rows, int64_t cols, int64_t batch, int threads) {
    if (kind < 0 || kind >= KIND_COUNT) return -2;
    const BlockKind *k = &KINDS[kind];
    if (cols % k->elements != 0 || cols % GROUP != 0) return -2;
    /* the K-quant rows (kquant_rows.h) take activations rounded to bytes per block of 256, the
       byte rows (byte_rows.h) per group of 32 */
    const int kquant = kquant_kind(k->decode) >= 0, bytes = byte_kind(k->decode) >= 0;
    Activations a;
    const int split = kquant  ? swarm_split_kquant(x, batch, cols, &a)
                      : bytes ? swarm_split_q8(x, batch, cols, &a)
                              : swarm_split(x, batch, cols, &a);
    if (split != 0) return -1;
    const int64_t tasks = (rows + ROWS_PER_TASK - 1) / ROWS_PER_TASK;
    const int use_wide = swarm_wide(), most = use_wide ? WIDE_TILE : BLOCK_TILE;
    const Rows run = use_wide ? k->wide : k->rows;
    const int q3_k_batch = use_wide && batch > 1 && k->decode == q3_k;
    int failed = 0;
    /* tasks taken as threads come free, not half each: on a machine whose cores are shared, a
       thread held up for a moment no longer holds up the whole product (a 7B decode step's
       products, two threads: median 188 to 162 ms over ten alternated runs); a row is still
       one thread's, so its bits do not change */
#pragma omp parallel for num_threads(threads) schedule(dynamic) if (threads > 1) reduction(| : failed)
    for (int64_t task = 0; task < tasks; task++) {
        const int64_t r0 = task * ROWS_PER_TASK;
        const int64_t r1 = r0 + ROWS_PER_TASK < rows ? r0 + ROWS_PER_TASK : rows;
        if (q3_k_batch) {
            failed |= swarm_wide_q3_k_batch(data, &a, batch, y, rows, cols, r0, r1) != 0;
            continue;
        }
        for (int64_t b = 0; b < batch; b += most) {
            const int tile = batch - b < most ? (int)(batch - b) : most;
            run(data, grid, &a, b, y, rows, cols, r0, r1, tile);
        }
    }
    return failed ? -1 : 0;
}

const char *swarm_block_name(int i) {
    return i >= 0 && i < KIND_COUNT ? KINDS[i].name : NULL;
}
