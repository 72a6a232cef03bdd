/* The K-quant types most files are made of (Q4_K, Q5_K, Q6_K) times activations on AVX2,
   their blocks decoded in registers, each 4 consecutive weights' products summed in one
   32-bit lane.

   blocks.c's general rows spend most of a decode step writing each decoded chunk to memory
   and reading it back, and two float multiply-adds per 32 weights (per 16 for Q6_K's
   scales); for these types that work, not memory, bound a decode step (two threads, 3584 x
   18944 Q6_K: 3.7-4.9 ms, ~13 GB/s of the ~25 two cores read). Here a piece of 64 weights
   (a quarter of a block) is decoded to its signed codes in registers (Q4_K 0..15, Q5_K 0..31,
   Q6_K -32..31), and lane i of a piece takes quad i's exact sum (weights 4i..4i+3) in one of
   two ways (products.h), the same integer either way:
   * a batch: the codes split into each quad's first two and last two and widened to int16,
     once per piece for all rows, times the activations stored the same way (quads): two
     multiply-adds of 16-bit pairs (madd, or madd and dpwssd on AVX-512 VNNI);
   * one activation row, where that split would be paid per row: the codes stay bytes and
     multiply the activations' two bytes, a = 256 (high - 128) + low: sum(low * u) and
     sum(high * u) are byte multiply-adds (maddubs, or one dpbusd each), and
         sum(a * u) = 256 (sum(high * u) - 128 sum(u)) + sum(low * u).
   (Two threads, 3584 x 18944: Q4_K one row 1.8-2.5 ms as bytes, 2.7-3.6 in quads; 64 rows
   single-threaded 116-119 ms in quads, 183-214 as bytes.)

   The contract both this file and blocks_wide.c's twin (kquant_rows_wide.h) keep, so that
   AVX2 and AVX-512 nodes, and a row alone or in any batch, give the same bits:
   * a row's sum has 16 float lanes; lane i of piece p (weights 64p..64p+63 of a block) is
     the exact integer sum of code * a over its weights 4i..4i+3 (|sum| < 2^23: exact as float);
   * its factor is (d * sub-scale) * step of the group, as the type's decoder and chunk_steps
     compute them; each lane takes one multiply-add per piece, pieces in order;
   * the offsets of Q4_K and Q5_K (-dmin * min) multiply the groups' float sums of the
     unrounded activations into eight lanes, a block at a time, as chunk_steps does;
   * the result is sum8(lanes 0..7 + lanes 8..15) + sum8(offset lanes).
   So each output is the product of the exact dequantization with the rounded activations,
   up to float32 sums, as for every other block type. */
#ifndef SWARM_KQUANT_ROWS_H
#define SWARM_KQUANT_ROWS_H

#include "block_decode.h"
#include "block_steps.h"
#include "products.h"

enum { KQUANT_Q4_K, KQUANT_Q5_K, KQUANT_Q6_K };

/* which of them a decoder (block_decode.h) is, or -1 */
INLINE int kquant_kind(Decoder decode) {
    return decode == q4_k ? KQUANT_Q4_K : decode == q5_k ? KQUANT_Q5_K : decode == q6_k ? KQUANT_Q6_K : -1;
}

INLINE int64_t kquant_block_size(const int kind) {
    return kind == KQUANT_Q4_K ? 144 : kind == KQUANT_Q5_K ? 176 : 210;
}

/* the 32 codes of half h of piece p: elements 64p + 32h .. 64p + 32h + 31 of the block */
INLINE __m256i kquant_codes(const int kind, const uint8_t *block, int p, int h) {
    if (kind == KQUANT_Q4_K) /* low nibbles of qs[32p + t], then high ones */
        return field(_mm256_loadu_si256((const __m256i *)(block + 16 + 32 * p)), 4 * h, 0x0F);
    if (kind == KQUANT_Q5_K) { /* and bit 2p + h of qh[t] as the fifth bit */
        const __m256i q = _mm256_loadu_si256((const __m256i *)(block + 48 + 32 * p));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(block + 16));
        return _mm256_or_si256(field(q, 4 * h, 0x0F), _mm256_slli_epi16(field(qh, 2 * p + h, 1), 4));
    }
    /* Q6_K, piece p = 2c + nib: the low (nib 0) or high nibble of ql[64c + 32h + t], bits
       2s..2s+1 of qh[32c + t] above them (s = 2 nib + h), less 32 */
    const int c = p / 2, nib = p % 2, s = 2 * nib + h;
    const __m256i ql = _mm256_loadu_si256((const __m256i *)(block + 64 * c + 32 * h));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(block + 128 + 32 * c));
    const __m256i top = s <= 2 ? _mm256_slli_epi16(qh, 4 - 2 * s) : _mm256_srli_epi16(qh, 2);
    const __m256i u = _mm256_or_si256(field(ql, 4 * nib, 0x0F), _mm256_and_si256(top, _mm256_set1_epi8(0x30)));
    return _mm256_sub_epi8(u, _mm256_set1_epi8(32));
}

/* a block's scales (d * sub-scale: Q6_K's 16 in scale[0] and scale[1], Q4_K's and Q5_K's 8
   in scale[0]) and offsets (-dmin * min, Q4_K's and Q5_K's 8), as the decoders compute them;
   once per block, whatever the number of activation rows */
typedef struct {
    __m256 scale[2], offset;
} KquantScales;

INLINE KquantScales kquant_scales(const int kind, const uint8_t *block) {
    KquantScales s;
    if (kind == KQUANT_Q6_K) {
        const __m128i sc = _mm_loadu_si128((const __m128i *)(block + 192));
        const __m256 d = _mm256_set1_ps(half(block + 208));
        s.scale[0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
        s.scale[1] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))));
        s.offset = _mm256_setzero_ps();
        return s;
    }
    const __m128i bytes = k_scale_bytes(block + 4);
    s.scale[0] = _mm256_mul_ps(_mm256_set1_ps(half(block)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)));
    s.scale[1] = _mm256_setzero_ps();
    s.offset = _mm256_mul_ps(_mm256_set1_ps(-half(block + 2)),
                             _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8))));
    return s;
}

/* a block's factors for activation row b, its groups from g0: scale * step (Q6_K's 16 in
   f[0] and f[1], Q4_K's and Q5_K's 8 in f[0]), and the offsets times the groups' sums added
   into *shift */
INLINE void kquant_factors(const int kind, const KquantScales *s, const Activations *a, int64_t b,
                           int64_t groups, int64_t g0, __m256 f[2], __m256 *shift) {
    const __m256 steps = _mm256_loadu_ps(a->step + b * groups + g0);
    if (kind == KQUANT_Q6_K) {
        f[0] = _mm256_mul_ps(s->scale[0], _mm256_permutevar8x32_ps(steps, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)));
        f[1] = _mm256_mul_ps(s->scale[1], _mm256_permutevar8x32_ps(steps, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7)));
        return;
    }
    f[0] = _mm256_mul_ps(s->scale[0], steps);
    *shift = _mm256_fmadd_ps(s->offset, _mm256_loadu_ps(a->sum + b * groups + g0), *shift);
}

/* the lane indices of half h of piece p into kquant_factors' f[p / 2] (Q6_K) or f[0] */
INLINE __m256i kquant_pick(const int kind, int p, int h) {
    if (kind != KQUANT_Q6_K) return _mm256_set1_epi32(2 * p + h);
    const int e = 4 * (p % 2) + 2 * h; /* sub-blocks 4p + 2h and 4p + 2h + 1, four lanes each */
    return _mm256_setr_epi32(e, e, e, e, e + 1, e + 1, e + 1, e + 1);
}

/* 128 times the sums of each 4 codes: what the high bytes' bias adds to their products */
INLINE __m256i byte_bias(__m256i u) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8((char)0x80), u), _mm256_set1_epi16(1));
}

/* lanes: the exact sums of a * u over each 4 of the 32 weights from `at` of the activations
   as bytes; bias: byte_bias(u). Pairs of products (255 * 32 * 2 at most) fit int16: maddubs
   never saturates. */
INLINE __m256i byte_sums(__m256i u, __m256i bias, const Activations *a, int64_t at) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i low = _mm256_loadu_si256((const __m256i *)(a->low + at));
    const __m256i high = _mm256_loadu_si256((const __m256i *)(a->high + at));
    const __m256i lo = _mm256_madd_epi16(_mm256_maddubs_epi16(low, u), ones);
    const __m256i hi = _mm256_sub_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(high, u), ones), bias);
    return _mm256_add_epi32(_mm256_slli_epi32(hi, 8), lo);
}

/* half a piece's 32 codes as each quad's first two codes (elements 4i, 4i + 1 in lanes 2i,
   2i + 1), then its last two, widened to int16 */
INLINE void quad_codes(__m256i u, __m256i *first, __m256i *last) {
    const __m256i pairs = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                           0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    /* per 128-bit lane: its quads' first pairs, then their last pairs; then the firsts of
       both lanes low, the lasts high */
    const __m256i split = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(u, pairs), _MM_SHUFFLE(3, 1, 2, 0));
    *first = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(split));
    *last = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(split, 1));
}

/* the exact sums of the 8 quads of half h of the piece whose activations start at `piece` */
INLINE __m256i quad_sums(__m256i first, __m256i last, const int16_t *piece, int h) {
    const __m256i a0 = _mm256_loadu_si256((const __m256i *)(piece + 16 * h));
    const __m256i a1 = _mm256_loadu_si256((const __m256i *)(piece + 32 + 16 * h));
    return _mm256_add_epi32(_mm256_madd_epi16(first, a0), _mm256_madd_epi16(last, a1));
}

/* output rows r0..r1 times activation rows b0..b0 + tile - 1 (tile at most 4); quads: whether
   the activations are in quads, else as bytes */
INLINE void kquant_rows(const int kind, const int quads, const uint8_t *data, const Activations *a,
                        int64_t b0, float *y, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                        const int tile) {
    const int64_t size = kquant_block_size(kind), row_bytes = cols / 256 * size, groups = cols / GROUP;
    for (int64_t r = r0; r < r1; r++) {
        __m256 acc[4][2], shift[4];
        for (int b = 0; b < tile; b++) acc[b][0] = acc[b][1] = shift[b] = _mm256_setzero_ps();
        for (int64_t start = 0; start < cols; start += 256) {
            const uint8_t *block = data + r * row_bytes + start / 256 * size;
            for (int at = 0; at < size; at += 64)
                _mm_prefetch((const char *)(block + BLOCK_PREFETCH_AHEAD + at), _MM_HINT_T0);
            const KquantScales scales = kquant_scales(kind, block);
            __m256 f[4][2];
            for (int b = 0; b < tile; b++)
                kquant_factors(kind, &scales, a, b0 + b, groups, start / GROUP, f[b], &shift[b]);
            for (int p = 0; p < 4; p++)
                for (int h = 0; h < 2; h++) {
                    const __m256i pick = kquant_pick(kind, p, h), u = kquant_codes(kind, block, p, h);
                    __m256i first = u, last = u, bias = u;
                    if (quads)
                        quad_codes(u, &first, &last);
                    else
                        bias = byte_bias(u);
                    for (int b = 0; b < tile; b++) {
                        const int64_t at = (b0 + b) * cols + start + 64 * p; /* the piece's */
                        const __m256i sums = quads ? quad_sums(first, last, a->quads + at, h)
                                                   : byte_sums(u, bias, a, at + 32 * h);
                        const __m256 factor = _mm256_permutevar8x32_ps(f[b][kind == KQUANT_Q6_K ? p / 2 : 0], pick);
                        acc[b][h] = _mm256_fmadd_ps(factor, _mm256_cvtepi32_ps(sums), acc[b][h]);
                    }
                }
        }
        for (int b = 0; b < tile; b++)
            y[(b0 + b) * rows + r] = sum8(_mm256_add_ps(acc[b][0], acc[b][1])) + sum8(shift[b]);
    }
}

#endif
