/* The K-quant types most files are made of (Q2_K to Q6_K, and IQ4_XS) times activations on AVX2,
   their blocks decoded in registers, each block's products summed as integers.

   blocks.c's general rows spend most of a decode step writing each decoded chunk to memory
   and reading it back, and two float multiply-adds per 32 weights; for these types that work,
   not memory, bound a decode step. Here a piece of 64 weights (a quarter of a block) is
   decoded to its codes in registers (Q4_K 0..15, Q5_K 0..31, Q6_K -32..31), and the
   activations are rounded once per block of 256 to 8 bits (swarm_split_kquant: -127..127,
   step = absmax / 127, the rounding llama.cpp gives these types' activations) instead of to
   16 bits per group of 32. So a whole block's products are one integer sum per lane: lane i
   of a piece takes quad i (weights 4i..4i+3) times its sub-block's integer scale, over the
   block's four pieces, and the block adds d * step times that lane, one float multiply-add
   per block where per-32 steps cost one per piece. The codes stay bytes and multiply the
   activations' bytes: pairs of byte products (maddubs: 127 * 32 * 2 at most, never
   saturating) times the sub-scale (madd, or dpwssd on AVX-512 VNNI), one of each per 32
   weights (or 64) and activation row. maddubs takes one unsigned operand: Q4_K's and Q5_K's
   codes are unsigned and take the signed activations; Q6_K's are signed and take the
   activations plus 128, less 128 times the codes' own sums (bias, once per piece and output
   row, whatever the number of activation rows; one activation row takes the codes as stored
   instead, kquant_q6_k_stored).
   No sum comes near 32 bits: 16 weights a lane, |a| <= 127, |code * sub-scale| <= 32 * 128.
   (16-bit activations took a second byte product per weight, and a batch's codes had to be
   widened to 16 bits: Q4_K 37888 x 3584, two threads from memory, one row 2.8-3.2 ms at 16
   bits, 2.4-2.7 at 8; one thread, 64 rows, 37-40 GMAC/s against 58-61.)

   The contract both this file and blocks_wide.c's twin (kquant_rows_wide.h) keep, so that
   AVX2 and AVX-512 nodes, and a row alone or in any batch, give the same bits:
   * a row's sum has 16 float lanes; lane i of a block is the exact integer above (lanes 0..7
     the quads of each piece's first 32 weights, 8..15 of its last 32; for Q3_K the exact
     sum of its quads' activations times values times scales, kquant_quads), converted to
     float
     and multiplied by d * step (float) into the lane with one multiply-add, blocks in order;
   * the offsets of Q4_K and Q5_K (-dmin * min) multiply the groups' sums of the rounded
     activations (their integers' sum times the step, as floats) into eight lanes, a block at
     a time; Q2_K's are kquant_shift's eight integer lanes times -dmin * step, likewise;
   * the result is sum8(lanes 0..7 + lanes 8..15) + sum8(offset lanes).
   So each output is the product of the exact dequantization with the activations rounded
   per block, up to float32 conversions and sums.
   (3584 x 18944 and 37888 x 3584, against the rows with per-32 steps: see
   docs/quantization.md.) */
#ifndef SWARM_KQUANT_ROWS_H
#define SWARM_KQUANT_ROWS_H

#include "block_decode.h"
#include "grid_codes.h"
#include "products.h"

/* Q3_K, Q2_K and IQ4_XS, the types of the low-bit mixes, run here too: Q2_K's codes (0..3)
   are unsigned and multiply as Q4_K's do, with 16 4-bit scales and 16 4-bit mins, one each
   per 16 weights: its offsets are -dmin * step times the integer sum over its sub-blocks of
   min times the activations' integer sum (sum16), eight exact integer lanes a block with one
   multiply-add. Q3_K's values (-4..3, the third bit from hmask) are taken plus 4, as
   unsigned codes (0..7), with 16 scales (-32..31) one per 16 weights; the 4 comes off in the
   integers, per quad, before the block's lanes are converted (its factor is the codes' own
   d * step): -4 times each quad's scale times the sum of its four activations (sum4), two
   madds a half (two dpwssd a block on AVX-512), so that each lane is exactly what Q3_K's
   rows at batch sum (kquant_rows_wide.h's q3_k_ready_rows: values times scales as bytes,
   one dpbusd a piece; no AVX2 instruction multiplies those bytes without saturating). A
   signed form, activations plus 128 less a bias per output row, as Q6_K's, took 0.95 ms a
   4096² row where the codes plus 4 take 0.77; the 4 off as Q2_K's mins are, 2.00 ms at
   eight rows where the rows at batch take 1.43-1.46. IQ4_XS's values
   (-127..113 from its 16-entry table, one 6-bit scale per 32) are too wide for a byte
   product with activations plus 128 (2 * 255 * 127 saturates int16) and multiply as Q8_0's
   do: |w| times the activation with w's sign (at most 2 * 127 * 127). Lanes as above; an
   IQ4_XS lane sums 16 products of at most 127 * 127 * 32: < 2^24, exact as a float. The grid
   types (grid_codes.h) multiply as IQ4_XS does: their values are signed (|v| <= 62) and
   never zero. */
enum { KQUANT_Q4_K, KQUANT_Q5_K, KQUANT_Q6_K, KQUANT_Q3_K, KQUANT_Q2_K, KQUANT_IQ4_XS, KQUANT_GRID };

/* a grid type's grid_codes.h type (kind KQUANT_GRID + type), or -1 */
INLINE int kquant_grid(const int kind) { return kind >= KQUANT_GRID ? kind - KQUANT_GRID : -1; }

/* which of them a decoder (block_decode.h) is, or -1 */
INLINE int kquant_kind(Decoder decode) {
    return decode == q4_k   ? KQUANT_Q4_K
           : decode == q5_k ? KQUANT_Q5_K
           : decode == q6_k ? KQUANT_Q6_K
           : decode == q3_k ? KQUANT_Q3_K
           : decode == q2_k ? KQUANT_Q2_K
           : decode == iq4_xs ? KQUANT_IQ4_XS
           : decode == iq2_xxs ? KQUANT_GRID + GRID_IQ2_XXS
           : decode == iq2_xs ? KQUANT_GRID + GRID_IQ2_XS
           : decode == iq2_s ? KQUANT_GRID + GRID_IQ2_S
           : decode == iq3_xxs ? KQUANT_GRID + GRID_IQ3_XXS
           : decode == iq3_s ? KQUANT_GRID + GRID_IQ3_S
           : decode == iq1_s ? KQUANT_GRID + GRID_IQ1_S
           : decode == iq1_m ? KQUANT_GRID + GRID_IQ1_M
                              : -1;
}

INLINE int64_t kquant_block_size(const int kind) {
    return kquant_grid(kind) >= 0 ? grid_block_size(kquant_grid(kind))
           : kind == KQUANT_Q4_K ? 144
           : kind == KQUANT_Q5_K ? 176
           : kind == KQUANT_Q6_K ? 210
           : kind == KQUANT_Q3_K ? 110
           : kind == KQUANT_Q2_K ? 84
                                 : 136;
}

/* codes signed and small (Q6_K): they take the activations plus 128, less a bias */
INLINE int kquant_biased(const int kind) { return kind == KQUANT_Q6_K; }

/* one scale per 16 weights (Q6_K, Q3_K, Q2_K), else per 32 */
INLINE int kquant_per16(const int kind) {
    return kind == KQUANT_Q6_K || kind == KQUANT_Q3_K || kind == KQUANT_Q2_K ||
           (kquant_grid(kind) >= 0 && grid_per16(kquant_grid(kind)));
}

/* values too wide for the biased form (IQ4_XS, the grid types): |w| times the activation with
   w's sign */
INLINE int kquant_signed(const int kind) { return kind == KQUANT_IQ4_XS || kquant_grid(kind) >= 0; }

/* float offsets per 32 weights against the activations' float sums (Q4_K, Q5_K) */
INLINE int kquant_offsets(const int kind) { return kind == KQUANT_Q4_K || kind == KQUANT_Q5_K; }

/* Q6_K's codes of half h of piece p as stored, 0..63 (its values plus 32), piece p = 2c + nib:
   elements 128c + 32s + t, s = 2 nib + h: the low (nib 0) or high nibble of ql[64c + 32h + t],
   bits 2s..2s+1 of qh[32c + t] above them */
INLINE __m256i q6_k_codes(const uint8_t *block, int p, int h) {
    const int c = p / 2, nib = p % 2, s = 2 * nib + h;
    const __m256i ql = _mm256_loadu_si256((const __m256i *)(block + 64 * c + 32 * h));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(block + 128 + 32 * c));
    const __m256i top = s <= 2 ? _mm256_slli_epi16(qh, 4 - 2 * s) : _mm256_srli_epi16(qh, 2);
    return _mm256_or_si256(field(ql, 4 * nib, 0x0F), _mm256_and_si256(top, _mm256_set1_epi8(0x30)));
}

/* the 32 codes of half h of piece p: elements 64p + 32h .. 64p + 32h + 31 of the block (grid:
   the grid types' table) */
INLINE __m256i kquant_codes(const int kind, const uint8_t *block, const int8_t *grid, int p, int h) {
    if (kquant_grid(kind) >= 0) return grid_values(kquant_grid(kind), block, grid, 2 * p + h);
    if (kind == KQUANT_Q4_K) /* low nibbles of qs[32p + t], then high ones */
        return field(_mm256_loadu_si256((const __m256i *)(block + 16 + 32 * p)), 4 * h, 0x0F);
    if (kind == KQUANT_Q5_K) { /* and bit 2p + h of qh[t] as the fifth bit */
        const __m256i q = _mm256_loadu_si256((const __m256i *)(block + 48 + 32 * p));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(block + 16));
        return _mm256_or_si256(field(q, 4 * h, 0x0F), _mm256_slli_epi16(field(qh, 2 * p + h, 1), 4));
    }
    if (kind == KQUANT_IQ4_XS) { /* sub-block 2p + h's 16 bytes, through the table */
        const __m256i values = _mm256_broadcastsi128_si256(iq4_values());
        return _mm256_shuffle_epi8(values, nib32(block + 8 + 16 * (2 * p + h)));
    }
    /* Q3_K and Q2_K, piece p = 2c + nib: elements 128c + 32s + t, s = 2 nib + h */
    const int c = p / 2, s = 2 * (p % 2) + h;
    if (kind == KQUANT_Q2_K) /* bits 2s..2s+1 of qs[32c + t] */
        return field(_mm256_loadu_si256((const __m256i *)(block + 16 + 32 * c)), 2 * s, 3);
    if (kind == KQUANT_Q3_K) { /* those of its qs, bit 4c + s of hmask[t] as the third: the
                                  value plus 4 */
        const __m256i q = _mm256_loadu_si256((const __m256i *)(block + 32 + 32 * c));
        const __m256i hmask = _mm256_loadu_si256((const __m256i *)block);
        return _mm256_or_si256(field(q, 2 * s, 3), _mm256_slli_epi16(field(hmask, 4 * c + s, 1), 2));
    }
    return _mm256_sub_epi8(q6_k_codes(block, p, h), _mm256_set1_epi8(32)); /* Q6_K: less 32 */
}

/* a block's integer sub-scales (Q4_K, Q5_K: 8, 0..63; IQ4_XS: 8, -32..31; one per 32
   weights; Q6_K: 16, -128..127; Q3_K: 16, -32..31; Q2_K: 16, 0..15; one per 16), its d,
   Q4_K's and Q5_K's offsets (-dmin * min, exact products of a float16 and a small integer,
   as ggml's), Q2_K's 16 mins (0..15) and -dmin (Q3_K: -4 times its scales; Q6_K: -32 times
   them, for kquant_q6_k_stored); the grid types' as grid_subs gives them; once per block,
   whatever the number of activation rows */
typedef struct {
    _Alignas(32) int16_t sub[16];
    float d, minus_dmin;
    __m256 offset;
    __m256i mins;
} KquantScales;

INLINE KquantScales kquant_scales(const int kind, const uint8_t *block) {
    KquantScales s;
    s.offset = _mm256_setzero_ps();
    s.mins = _mm256_setzero_si256();
    s.minus_dmin = 0.f;
    if (kquant_grid(kind) >= 0) {
        _mm256_store_si256((__m256i *)s.sub, grid_subs(kquant_grid(kind), block, &s.d));
        return s;
    }
    if (kind == KQUANT_Q6_K) { /* its codes as stored are values plus 32 (kquant_q6_k_stored) */
        const __m256i sub = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(block + 192)));
        _mm256_store_si256((__m256i *)s.sub, sub);
        s.mins = _mm256_slli_epi16(_mm256_sub_epi16(_mm256_setzero_si256(), sub), 5);
        s.d = half(block + 208);
        return s;
    }
    if (kind == KQUANT_Q3_K) { /* codes are values plus 4: each scale less 4 times itself */
        const __m256i sub = _mm256_cvtepi8_epi16(q3_k_scales(block + 96));
        _mm256_store_si256((__m256i *)s.sub, sub);
        s.mins = _mm256_slli_epi16(_mm256_sub_epi16(_mm256_setzero_si256(), sub), 2);
        s.d = half(block + 108);
        return s;
    }
    if (kind == KQUANT_Q2_K) { /* byte i: scale i in its low nibble, min i in its high one */
        const __m128i b = _mm_loadu_si128((const __m128i *)block), m = _mm_set1_epi8(0x0F);
        _mm256_store_si256((__m256i *)s.sub, _mm256_cvtepu8_epi16(_mm_and_si128(b, m)));
        s.mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(b, 4), m));
        s.d = half(block + 80);
        s.minus_dmin = -half(block + 82);
        return s;
    }
    if (kind == KQUANT_IQ4_XS) { /* iq4_xs_scale's eight, in registers */
        const __m256i low = _mm256_and_si256(
            _mm256_srlv_epi32(_mm256_set1_epi32((int)word32(block + 4)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
            _mm256_set1_epi32(0x0F));
        const __m256i high = _mm256_and_si256(
            _mm256_srlv_epi32(_mm256_set1_epi32(word16(block + 2)), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
            _mm256_set1_epi32(3));
        const __m256i ls = _mm256_sub_epi32(_mm256_or_si256(low, _mm256_slli_epi32(high, 4)), _mm256_set1_epi32(32));
        /* [0..3, 0 x 4 | 4..7, 0 x 4] to [0..7, 0 x 8] */
        const __m256i packed = _mm256_packs_epi32(ls, _mm256_setzero_si256());
        _mm256_store_si256((__m256i *)s.sub, _mm256_permute4x64_epi64(packed, _MM_SHUFFLE(3, 1, 2, 0)));
        s.d = half(block);
        return s;
    }
    const __m128i bytes = k_scale_bytes(block + 4);
    _mm256_store_si256((__m256i *)s.sub, _mm256_cvtepu8_epi16(bytes)); /* 8 scales, 8 mins */
    s.d = half(block);
    s.offset = _mm256_mul_ps(_mm256_set1_ps(-half(block + 2)),
                             _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8))));
    return s;
}

/* the sub-scale of each of the 16 pairs of codes of half h of piece p: per 32 weights,
   sub-block 2p + h's; per 16, 4p + 2h for pairs 0..7, 4p + 2h + 1 for pairs 8..15 */
INLINE __m256i kquant_sub_pairs(const int kind, const KquantScales *s, int p, int h) {
    if (!kquant_per16(kind)) return _mm256_set1_epi16(s->sub[2 * p + h]);
    const int j = 4 * p + 2 * h;
    return _mm256_setr_m128i(_mm_set1_epi16(s->sub[j]), _mm_set1_epi16(s->sub[j + 1]));
}

/* d * step of activation row b's block: the factor of the block's lanes */
INLINE float kquant_factor(const KquantScales *s, const Activations *a, int64_t b, int64_t blocks,
                           int64_t block) {
    return s->d * a->block_step[b * blocks + block];
}

/* the codes' unsigned operand of maddubs: the codes, or, for IQ4_XS, their magnitudes */
INLINE __m256i kquant_unsigned(const int kind, __m256i u) {
    return kquant_signed(kind) ? _mm256_abs_epi8(u) : u;
}

/* one activation row's bytes from `at` (32 of them) times half a piece's codes u (mag:
   kquant_unsigned's), pairs times their sub-scales, added into its sums */
INLINE __m256i byte_sums(const int kind, __m256i u, __m256i mag, __m256i sub, const Activations *a,
                         int64_t at, __m256i sums) {
    __m256i pairs;
    if (kquant_biased(kind))
        pairs = _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(a->biased_bytes + at)), u);
    else if (kquant_signed(kind))
        pairs = _mm256_maddubs_epi16(
            mag, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(a->signed_bytes + at)), u));
    else
        pairs = _mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(a->signed_bytes + at)));
    return _mm256_add_epi32(sums, _mm256_madd_epi16(pairs, sub));
}

/* Q6_K's bias for half a piece's codes u: 128 times each pair's sum, times its
   sub-scale */
INLINE __m256i byte_bias(__m256i u, __m256i sub) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8((char)0x80), u), sub);
}

/* Q3_K's 4 less per value, as integers in the lanes, so that each lane is the exact integer
   sum of its quads' activations times their values times their scales, as the rows that
   take Q3_K's values times scales as bytes (kquant_rows_wide.h's q3_k_ready_rows) have
   it: lane L (of 16) less, over the four pieces p, 4 times the scale of quad L of piece p
   (sub-block 4p + L / 4) times that quad's integer sum (sum4). kquant_quad_scales gives the
   16-bit pairs (-4 times scale 4p + L/4 of pieces 0 and 1 in ab[h], of 2 and 3 in cd[h],
   lanes 8h..8h+7), to multiply sum4's pairs with one madd each per half (dpwssd per block on
   AVX-512) */
INLINE int kquant_quads(const int kind) { return kind == KQUANT_Q3_K; }

/* Q6_K with one activation row takes its codes as stored (0..63) and the 32 off as Q3_K's 4
   (kquant_quads: -32 times each quad's scale times its activations' sum), where the biased
   form's bias, once per output row whatever the batch, costs a second byte product and madd
   per 32 weights: each lane is the same exact integer, so the same bits at any batch. Codes
   0..63 times activations -127..127 in pairs stay within int16 (2 * 63 * 127), and -32 times a
   scale (-128..127) within it too. (Q6_K 1536 x 8960, one row, one thread, from memory:
   0.94-1.13 ms biased, 0.79-0.87 as stored.) */
INLINE int kquant_q6_k_stored(const int kind, const int tile) { return kind == KQUANT_Q6_K && tile == 1; }

typedef struct {
    __m256i ab[2], cd[2];
} QuadScales;

INLINE QuadScales kquant_quad_scales(const KquantScales *s) {
    /* pairs (mins a, mins 4 + a) for a = 0..3 in 32-bit lanes 0..3, (8 + a, 12 + a) in 4..7 */
    const __m256i pairs = _mm256_unpacklo_epi16(s->mins, _mm256_bsrli_epi128(s->mins, 8));
    QuadScales q;
    for (int h = 0; h < 2; h++) {
        const __m256i lanes = _mm256_setr_epi32(2 * h, 2 * h, 2 * h, 2 * h, 2 * h + 1, 2 * h + 1, 2 * h + 1, 2 * h + 1);
        q.ab[h] = _mm256_permutevar8x32_epi32(pairs, lanes);
        q.cd[h] = _mm256_permutevar8x32_epi32(pairs, _mm256_add_epi32(lanes, _mm256_set1_epi32(4)));
    }
    return q;
}

/* half h's eight lanes of the correction for activation row b's block */
INLINE __m256i kquant_quad_fix(const QuadScales *q, const Activations *a, int64_t b, int64_t cols,
                               int64_t start, int h) {
    const int16_t *sums = a->sum4 + (b * cols + start) / 4 + 16 * h;
    return _mm256_add_epi32(_mm256_madd_epi16(q->ab[h], _mm256_loadu_si256((const __m256i *)sums)),
                            _mm256_madd_epi16(q->cd[h], _mm256_loadu_si256((const __m256i *)(sums + 32))));
}

/* the offsets' share of a block for activation row b into shift: Q4_K's and Q5_K's float
   offsets times the activations' float sums per 32; Q2_K's mins times the activations'
   integer sums per 16 (eight exact lanes), times -dmin * step */
INLINE __m256 kquant_shift(const int kind, const KquantScales *s, const Activations *a, int64_t b,
                           int64_t cols, int64_t start, __m256 shift) {
    if (kquant_offsets(kind))
        return _mm256_fmadd_ps(s->offset, _mm256_loadu_ps(a->sum + b * (cols / GROUP) + start / GROUP),
                               shift);
    if (kind != KQUANT_Q2_K) return shift;
    const __m256i sums = _mm256_loadu_si256((const __m256i *)(a->sum16 + b * (cols / 16) + start / 16));
    const float f = s->minus_dmin * a->block_step[b * (cols / 256) + start / 256];
    return _mm256_fmadd_ps(_mm256_set1_ps(f), _mm256_cvtepi32_ps(_mm256_madd_epi16(s->mins, sums)), shift);
}

/* output rows r0..r1 times activation rows b0..b0 + tile - 1 (tile at most 4) */
INLINE void kquant_rows(const int kind, const uint8_t *data, const int8_t *grid, const Activations *a,
                        int64_t b0, float *y, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                        const int tile) {
    const int64_t size = kquant_block_size(kind), row_bytes = cols / 256 * size;
    const int64_t blocks = cols / 256;
    const int stored = kquant_q6_k_stored(kind, tile);
    for (int64_t r = r0; r < r1; r++) {
        __m256 acc[4][2], shift[4];
        for (int b = 0; b < tile; b++) acc[b][0] = acc[b][1] = shift[b] = _mm256_setzero_ps();
        for (int64_t start = 0; start < cols; start += 256) {
            const uint8_t *block = data + r * row_bytes + start / 256 * size;
            for (int at = 0; at < size; at += 64)
                _mm_prefetch((const char *)(block + BLOCK_PREFETCH_AHEAD + at), _MM_HINT_T0);
            const KquantScales scales = kquant_scales(kind, block);
            /* per activation row and half: the block's sums; Q6_K's bias */
            __m256i sums[4][2], bias[2];
            for (int h = 0; h < 2; h++) {
                bias[h] = _mm256_setzero_si256();
                for (int b = 0; b < tile; b++) sums[b][h] = _mm256_setzero_si256();
            }
            _Pragma("GCC unroll 4")
            for (int p = 0; p < 4; p++)
                _Pragma("GCC unroll 2")
                for (int h = 0; h < 2; h++) {
                    const __m256i sub = kquant_sub_pairs(kind, &scales, p, h);
                    if (stored) { /* as Q4_K's codes: unsigned, times the signed activations */
                        const __m256i u = q6_k_codes(block, p, h);
                        sums[0][h] = byte_sums(KQUANT_Q4_K, u, u, sub, a, b0 * cols + start + 64 * p + 32 * h, sums[0][h]);
                        continue;
                    }
                    const __m256i u = kquant_codes(kind, block, grid, p, h), mag = kquant_unsigned(kind, u);
                    if (kquant_biased(kind)) bias[h] = _mm256_add_epi32(bias[h], byte_bias(u, sub));
                    for (int b = 0; b < tile; b++) {
                        const int64_t at = (b0 + b) * cols + start + 64 * p + 32 * h;
                        sums[b][h] = byte_sums(kind, u, mag, sub, a, at, sums[b][h]);
                    }
                }
            const QuadScales quads = kquant_quad_scales(&scales);
            for (int b = 0; b < tile; b++) {
                if (kquant_quads(kind) || stored)
                    for (int h = 0; h < 2; h++)
                        sums[b][h] = _mm256_add_epi32(sums[b][h], kquant_quad_fix(&quads, a, b0 + b, cols, start, h));
                const __m256 f = _mm256_set1_ps(kquant_factor(&scales, a, b0 + b, blocks, start / 256));
                for (int h = 0; h < 2; h++) {
                    const __m256i lanes = _mm256_sub_epi32(sums[b][h], bias[h]);
                    acc[b][h] = _mm256_fmadd_ps(f, _mm256_cvtepi32_ps(lanes), acc[b][h]);
                }
                shift[b] = kquant_shift(kind, &scales, a, b0 + b, cols, start, shift[b]);
            }
        }
        for (int b = 0; b < tile; b++)
            y[(b0 + b) * rows + r] = sum8(_mm256_add_ps(acc[b][0], acc[b][1])) + sum8(shift[b]);
    }
}

#endif
