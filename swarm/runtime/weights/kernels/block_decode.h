/* Each GGUF block type decoded into blocks.h's chunk form: int8 codes, a float scale and
   offset per 16 weights, weight = scale * code + offset.

   The form is exact for every type: codes are the block's own small integers (signed where
   the type subtracts a midpoint; IQ grids' values with their signs; IQ1's grid value * 8 + its
   delta's sign, the scale then divided by 8, a power of two), and scales and offsets are the
   float32 values ggml's reference multiplies by (d * sub-scale, each a product of a float16
   and a small integer, exact in float32). So a product over the chunk form is the product of
   the exact dequantization, up to how the activations were rounded and how sums round.

   Bit layouts follow ggml's block definitions (ggml-common.h); the tests check every type
   against the torch dequantizer (swarm.runtime.weights.dequant), itself checked bit for bit
   against the gguf package's. */
#ifndef SWARM_BLOCK_DECODE_H
#define SWARM_BLOCK_DECODE_H

#include "blocks.h"
#include "products.h"

#include <immintrin.h>
#include <string.h>

#define DECODE static inline __attribute__((always_inline)) void

static inline float half(const uint8_t *p) { return _cvtsh_ss((uint16_t)(p[0] | (p[1] << 8))); }

static inline uint32_t word32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint16_t word16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* group j's scale and offset, for types whose scales come per 32 weights: slots 0..7 of
   the chunk's (slots 8..15 are for types with scales per 16) */
static inline void per32(Chunk *out, int j, float scale, float offset) {
    out->scale[j] = scale;
    out->offset[j] = offset;
}

static inline void store32(int8_t *codes, __m256i v) { _mm256_storeu_si256((__m256i *)codes, v); }

/* the low `bits` bits of each byte of v shifted right by `shift` (a shift of 16-bit lanes,
   then a mask per byte: bits from the neighbouring byte are masked away) */
static inline __m256i field(__m256i v, int shift, int mask) {
    return _mm256_and_si256(_mm256_srli_epi16(v, shift), _mm256_set1_epi8((char)mask));
}

/* 16 bytes of nibbles -> 32 codes: low nibbles are elements 0..15, high ones 16..31 */
static inline __m256i nib32(const uint8_t *qs) {
    const __m128i b = _mm_loadu_si128((const __m128i *)qs), m = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

static inline void nibbles16(const uint8_t *qs, int8_t *codes, int minus) {
    store32(codes, _mm256_sub_epi8(nib32(qs), _mm256_set1_epi8((char)minus)));
}

DECODE q4_0(const uint8_t *src, int blocks, const int8_t *grid, Chunk *out) {
    for (int b = 0; b < blocks; b++, src += 18) {
        nibbles16(src + 2, out->codes + 32 * b, 8);
        per32(out, b, half(src), 0.f);
    }
}

DECODE q4_1(const uint8_t *src, int blocks, const int8_t *grid, Chunk *out) {
    for (int b = 0; b < blocks; b++, src += 20) {
        nibbles16(src + 4, out->codes + 32 * b, 0);
        per32(out, b, half(src), half(src + 2));
    }
}

static inline void five_bit(const uint8_t *qh, const uint8_t *qs, int8_t *codes, int minus) {
    const __m256i q = _mm256_or_si256(nib32(qs), fifth_bits(word32(qh)));
    store32(codes, _mm256_sub_epi8(q, _mm256_set1_epi8((char)minus)));
}

DECODE q5_0(const uint8_t *src, int blocks, const int8_t *grid, Chunk *out) {
    for (int b = 0; b < blocks; b++, src += 22) {
        five_bit(src + 2, src + 6, out->codes + 32 * b, 16);
        per32(out, b, half(src), 0.f);
    }
}

DECODE q5_1(const uint8_t *src, int blocks, const int8_t *grid, Chunk *out) {
    for (int b = 0; b < blocks; b++, src += 24) {
        five_bit(src + 4, src + 8, out->codes + 32 * b, 0);
        per32(out, b, half(src), half(src + 2));
    }
}

DECODE q8_0(const uint8_t *src, int blocks, const int8_t *grid, Chunk *out) {
    for (int b = 0; b < blocks; b++, src += 34) {
        store32(out->codes + 32 * b, _mm256_loadu_si256((const __m256i *)(src + 2)));
        per32(out, b, half(src), 0.f);
    }
}

/* 64 bytes of 2-bit fields -> 256 values: element 128c + 32s + j is bits 2s..2s+1 of byte
   32c + j (Q2_K's and Q3_K's low bits, TQ2_0's codes) */
static inline void crumbs(const uint8_t *qs, int8_t *codes, int minus) {
    for (int c = 0; c < 2; c++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        for (int s = 0; s < 4; s++)
            store32(codes + 128 * c + 32 * s,
                    _mm256_sub_epi8(field(q, 2 * s, 3), _mm256_set1_epi8((char)minus)));
    }
}

DECODE q2_k(const uint8_t *src, int blocks, const int8_t *grid, Chunk *out) {
    const float d = half(src + 80), dmin = half(src + 82);
    crumbs(src + 16, out->codes, 0);
    /* scale s: d times the low nibble of byte s; offset s: minus dmin times its high one */
    const __m128i b = _mm_loadu_si128((const __m128i *)src), m = _mm_set1_epi8(0x0F);
    const __m128i low = _mm_and_si128(b, m), high = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    const __m256 sign = _mm256_set1_ps(-0.f);
    for (int h = 0; h < 2; h++) {
        const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(low, 8 * h)));
        const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(high, 8 * h)));
        _mm256_storeu_ps(out->scale + 8 * h, _mm256_mul_ps(_mm256_set1_ps(d), sc));
        _mm256_storeu_ps(out->offset + 8 * h,
                         _mm256_xor_ps(_mm256_mul_ps(_mm256_set1_ps(dmin), mn), sign));
    }
}

/* Q3_K's 16 scales, -32..31, as bytes, from its 12 packed bytes: scale i is the low (i < 8)
   or high nibble of packed[i % 8], bits 2(i / 4).. of packed[8 + i % 4] on top, less 32. The
   12 bytes end 2 before the block's: a 16-byte load ran past a matrix's last block (and
   faulted where that was the end of a mapping). */
static inline __m128i q3_k_scales(const uint8_t *packed) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)packed), m = _mm_set1_epi8(0x0F);
    const __m128i low = _mm_unpacklo_epi64(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    /* byte i of word j's copy shifted right 2j: bits 2(i / 4).. of packed[8 + i % 4] at its
       bottom (a shift across bytes moves only bits above the two kept) */
    const __m128i tops = _mm_srlv_epi32(_mm_set1_epi32((int)word32(packed + 8)), _mm_setr_epi32(0, 2, 4, 6));
    const __m128i high = _mm_and_si128(tops, _mm_set1_epi8(3));
    return _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16(high, 4)), _mm_set1_epi8(32));
}

DECODE q3_k(const uint8_t *src, int blocks, const int8_t *grid, Chunk *out) {
    const uint8_t *hmask = src, *packed = src + 96;
    const float d = half(src + 108);
    /* element 128c + 32s + j: bits 2s..2s+1 of qs[32c + j], less 4 where bit 4c + s of
       hmask[j] is clear */
    const __m256i h = _mm256_loadu_si256((const __m256i *)hmask);
    for (int c = 0; c < 2; c++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(src + 32 + 32 * c));
        for (int s = 0; s < 4; s++) {
            const __m256i high = _mm256_slli_epi16(field(h, 4 * c + s, 1), 2);
            const __m256i code = _mm256_or_si256(field(q, 2 * s, 3), high);
            store32(out->codes + 128 * c + 32 * s, _mm256_sub_epi8(code, _mm256_set1_epi8(4)));
        }
    }
    /* scale i: q3_k_scales' byte i times d */
    const __m128i sc = q3_k_scales(packed);
    for (int h = 0; h < 2; h++) {
        const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8 * h)));
        _mm256_storeu_ps(out->scale + 8 * h, _mm256_mul_ps(_mm256_set1_ps(d), v));
    }
}

/* Q4_K's and Q5_K's eight 6-bit scales and eight 6-bit mins (ggml's get_scale_min_k4) as
   bytes: scales in 0..7, mins in 8..15. In the 12 bytes q, scale and min j < 4 are the low six
   bits of q[j] and q[j + 4]; for j >= 4, the low and high nibbles of q[j + 4] are their low
   four bits, and the top two bits of q[j - 4] and q[j] their top two. So words 0 and 1 give
   0..3 as they are, and word 2's nibbles with the top bits of words 0 and 1 give 4..7. */
static inline __m128i k_scale_bytes(const uint8_t *q) {
    uint32_t w[3];
    memcpy(w, q, 12);
    const uint32_t six = 0x3F3F3F3F, nibble = 0x0F0F0F0F, top = 0x03030303;
    const uint32_t scales_hi = (w[2] & nibble) | (((w[0] >> 6) & top) << 4);
    const uint32_t mins_hi = ((w[2] >> 4) & nibble) | (((w[1] >> 6) & top) << 4);
    return _mm_setr_epi32((int)(w[0] & six), (int)scales_hi, (int)(w[1] & six), (int)mins_hi);
}

static inline void k_scales_out(const uint8_t *src, Chunk *out) {
    const __m128i bytes = k_scale_bytes(src + 4);
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
    const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)));
    /* d * sc and -(dmin * mn), each a product of a float16 and a small integer, as ggml's */
    _mm256_storeu_ps(out->scale, _mm256_mul_ps(_mm256_set1_ps(half(src)), sc));
    _mm256_storeu_ps(out->offset, _mm256_mul_ps(_mm256_set1_ps(-half(src + 2)), mn));
}

DECODE q4_k(const uint8_t *src, int blocks, const int8_t *grid, Chunk *out) {
    const uint8_t *qs = src + 16;
    for (int c = 0; c < 4; c++) { /* elements 64c..64c+31: low nibbles of qs[32c..], then high */
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        store32(out->codes + 64 * c, field(q, 0, 0x0F));
        store32(out->codes + 64 * c + 32, field(q, 4, 0x0F));
    }
    k_scales_out(src, out);
}

DECODE q5_k(const uint8_t *src, int blocks, const int8_t *grid, Chunk *out) {
    const uint8_t *qs = src + 48;
    const __m256i h = _mm256_loadu_si256((const __m256i *)(src + 16));
    for (int c = 0; c < 4; c++) { /* sub-block s takes bit s of qh[j] as its fifth bit */
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        const __m256i lo = _mm256_slli_epi16(field(h, 2 * c, 1), 4);
        const __m256i hi = _mm256_slli_epi16(field(h, 2 * c + 1, 1), 4);
        store32(out->codes + 64 * c, _mm256_or_si256(field(q, 0, 0x0F), lo));
        store32(out->codes + 64 * c + 32, _mm256_or_si256(field(q, 4, 0x0F), hi));
    }
    k_scales_out(src, out);
}

DECODE q6_k(const uint8_t *src, int blocks, const int8_t *grid, Chunk *out) {
    const uint8_t *ql = src, *qh = src + 128;
    const int8_t *scales = (const int8_t *)(src + 192);
    const float d = half(src + 208);
    /* element 128c + 32s + j: the low or high nibble of ql[64c + 32(s % 2) + j] (high from
       s = 2 on), bits 2s..2s+1 of qh[32c + j] on top, less 32 */
    for (int c = 0; c < 2; c++) {
        const __m256i a = _mm256_loadu_si256((const __m256i *)(ql + 64 * c));
        const __m256i b = _mm256_loadu_si256((const __m256i *)(ql + 64 * c + 32));
        const __m256i h = _mm256_loadu_si256((const __m256i *)(qh + 32 * c));
        const __m256i low[4] = {field(a, 0, 0x0F), field(b, 0, 0x0F), field(a, 4, 0x0F),
                                field(b, 4, 0x0F)};
        for (int s = 0; s < 4; s++) {
            const __m256i code = _mm256_or_si256(low[s], _mm256_slli_epi16(field(h, 2 * s, 3), 4));
            store32(out->codes + 128 * c + 32 * s, _mm256_sub_epi8(code, _mm256_set1_epi8(32)));
        }
    }
    const __m128i sc = _mm_loadu_si128((const __m128i *)scales);
    for (int h = 0; h < 2; h++) {
        const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8 * h)));
        _mm256_storeu_ps(out->scale + 8 * h, _mm256_mul_ps(_mm256_set1_ps(d), v));
    }
}

static inline void iq4_codes(const uint8_t *qs, int8_t *codes) {
    const __m256i values = _mm256_broadcastsi128_si256(iq4_values());
    store32(codes, _mm256_shuffle_epi8(values, nib32(qs)));
}

DECODE iq4_nl(const uint8_t *src, int blocks, const int8_t *grid, Chunk *out) {
    for (int b = 0; b < blocks; b++, src += 18) {
        iq4_codes(src + 2, out->codes + 32 * b);
        per32(out, b, half(src), 0.f);
    }
}

/* MXFP4: e2m1 codes doubled (ggml's kvalues_mxfp4) and an E8M0 exponent, its value halved
   (ggml_e8m0_to_fp32_half): weight = 2^(e - 128) * code, exact */
static const int8_t MXFP4_VALUES[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static inline float e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float v;
    memcpy(&v, &bits, 4);
    return v;
}

DECODE mxfp4(const uint8_t *src, int blocks, const int8_t *grid, Chunk *out) {
    const __m256i values = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)MXFP4_VALUES));
    for (int b = 0; b < blocks; b++, src += 17) {
        store32(out->codes + 32 * b, _mm256_shuffle_epi8(values, nib32(src + 1)));
        per32(out, b, e8m0_half(src[0]), 0.f);
    }
}

/* IQ4_XS's scale of sub-block s (0..7), -32..31: the low or high nibble of byte 4 + s / 2,
   bits 2s..2s+1 of the word at 2 on top, less 32 */
static inline int iq4_xs_scale(const uint8_t *block, int s) {
    const int low = (block[4 + s / 2] >> (4 * (s % 2))) & 0x0F;
    return (low | (((word16(block + 2) >> (2 * s)) & 3) << 4)) - 32;
}

DECODE iq4_xs(const uint8_t *src, int blocks, const int8_t *grid, Chunk *out) {
    const float d = half(src);
    for (int s = 0; s < 8; s++) {
        iq4_codes(src + 8 + 16 * s, out->codes + 32 * s);
        per32(out, s, d * (float)iq4_xs_scale(src, s), 0.f);
    }
}

/* the eight signs of a 7-bit sign index: the eighth bit makes the parity even (ggml's
   ksigns_iq2xs) */
static inline int signs8(uint32_t index) {
    return (int)(index | ((uint32_t)__builtin_parity(index) << 7));
}

/* eight grid values times their signs (bit k of `signs` negates value k) */
static inline void signed8(const int8_t *values, int signs, int8_t *codes) {
    for (int k = 0; k < 8; k++) codes[k] = (int8_t)((signs >> k) & 1 ? -values[k] : values[k]);
}

DECODE iq2_xxs(const uint8_t *src, int blocks, const int8_t *grid, Chunk *out) {
    const float d = half(src);
    for (int s = 0; s < 8; s++) {
        const uint8_t *sub = src + 2 + 8 * s;
        const uint32_t aux = word32(sub + 4);
        for (int l = 0; l < 4; l++)
            signed8(grid + 8 * sub[l], signs8((aux >> (7 * l)) & 0x7F), out->codes + 32 * s + 8 * l);
        per32(out, s, d * (0.5f + (float)(aux >> 28)) * 0.25f, 0.f);
    }
}

static inline void iq2_scales16(const uint8_t *scales, float d, Chunk *out) {
    for (int s = 0; s < 16; s++) {
        out->scale[s] = d * (0.5f + (float)((scales[s / 2] >> (4 * (s % 2))) & 0x0F)) * 0.25f;
        out->offset[s] = 0.f;
    }
}

DECODE iq2_xs(const uint8_t *src, int blocks, const int8_t *grid, Chunk *out) {
    for (int m = 0; m < 32; m++) {
        const uint16_t q = word16(src + 2 + 2 * m);
        signed8(grid + 8 * (q & 511), signs8(q >> 9), out->codes + 8 * m);
    }
    iq2_scales16(src + 66, half(src), out);
}

DECODE iq2_s(const uint8_t *src, int blocks, const int8_t *grid, Chunk *out) {
    const uint8_t *qs = src + 2, *signs = src + 34, *qh = src + 66;
    for (int m = 0; m < 32; m++) {
        const int index = qs[m] | (((qh[m / 4] >> (2 * (m % 4))) & 3) << 8);
        signed8(grid + 8 * index, signs[m], out->codes + 8 * m);
    }
    iq2_scales16(src + 74, half(src), out);
}

/* four values of a 4-wide grid entry with four sign bits */
static inline void signed4(const int8_t *values, int signs, int8_t *codes) {
    for (int k = 0; k < 4; k++) codes[k] = (int8_t)((signs >> k) & 1 ? -values[k] : values[k]);
}

DECODE iq3_xxs(const uint8_t *src, int blocks, const int8_t *grid, Chunk *out) {
    const float d = half(src);
    const uint8_t *qs = src + 2;
    for (int s = 0; s < 8; s++) {
        const uint32_t aux = word32(src + 66 + 4 * s);
        for (int l = 0; l < 4; l++) {
            const int signs = signs8((aux >> (7 * l)) & 0x7F);
            int8_t *codes = out->codes + 32 * s + 8 * l;
            signed4(grid + 4 * qs[8 * s + 2 * l], signs, codes);
            signed4(grid + 4 * qs[8 * s + 2 * l + 1], signs >> 4, codes + 4);
        }
        per32(out, s, d * (0.5f + (float)(aux >> 28)) * 0.5f, 0.f);
    }
}

DECODE iq3_s(const uint8_t *src, int blocks, const int8_t *grid, Chunk *out) {
    const float d = half(src);
    const uint8_t *qs = src + 2, *qh = src + 66, *signs = src + 74, *scales = src + 106;
    for (int m = 0; m < 64; m++) {
        const int index = qs[m] | (((qh[m / 8] >> (m % 8)) & 1) << 8);
        signed4(grid + 4 * index, signs[m / 2] >> (4 * (m % 2)), out->codes + 4 * m);
    }
    for (int s = 0; s < 8; s++)
        per32(out, s, d * (float)(1 + 2 * ((scales[s / 2] >> (4 * (s % 2))) & 0x0F)), 0.f);
}

/* eight IQ1 grid values (-1, 0, 1) plus a delta of +-1/8, as codes of eighths */
static inline void iq1_codes(const int8_t *values, int negative, int8_t *codes) {
    for (int k = 0; k < 8; k++) codes[k] = (int8_t)(8 * values[k] + (negative ? -1 : 1));
}

DECODE iq1_s(const uint8_t *src, int blocks, const int8_t *grid, Chunk *out) {
    const float d = half(src);
    const uint8_t *qs = src + 2;
    for (int s = 0; s < 8; s++) {
        const uint16_t qh = word16(src + 34 + 2 * s);
        for (int l = 0; l < 4; l++) {
            const int index = qs[4 * s + l] | (((qh >> (3 * l)) & 7) << 8);
            iq1_codes(grid + 8 * index, qh & 0x8000, out->codes + 32 * s + 8 * l);
        }
        per32(out, s, d * (float)(2 * ((qh >> 12) & 7) + 1) * 0.125f, 0.f);
    }
}

/* IQ1_M's d: a float16 spread over the top nibbles of its four scale words (from byte 48) */
static inline float iq1_m_d(const uint8_t *src) {
    uint16_t sc[4];
    for (int j = 0; j < 4; j++) sc[j] = word16(src + 48 + 2 * j);
    return _cvtsh_ss((uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) |
                                (sc[3] & 0xF000)));
}

DECODE iq1_m(const uint8_t *src, int blocks, const int8_t *grid, Chunk *out) {
    const uint8_t *qs = src, *qh = src + 32;
    uint16_t sc[4];
    for (int j = 0; j < 4; j++) sc[j] = word16(src + 48 + 2 * j);
    const float d = iq1_m_d(src);
    for (int m = 0; m < 32; m++) {
        const int nibble = (qh[m / 2] >> (4 * (m % 2))) & 0x0F;
        iq1_codes(grid + 8 * (qs[m] | ((nibble & 7) << 8)), nibble & 8, out->codes + 8 * m);
    }
    for (int s = 0; s < 16; s++) {
        out->scale[s] = d * (float)(2 * ((sc[s / 4] >> (3 * (s % 4))) & 7) + 1) * 0.125f;
        out->offset[s] = 0.f;
    }
}

/* base-3 digits kept as fixed-point fractions: byte * 3^p (mod 256) has digit p on top */
static inline int8_t trit(uint8_t byte, int p) {
    static const uint8_t powers[5] = {1, 3, 9, 27, 81};
    const uint8_t q = (uint8_t)(byte * powers[p]);
    return (int8_t)((((uint16_t)q * 3) >> 8) - 1);
}

DECODE tq1_0(const uint8_t *src, int blocks, const int8_t *grid, Chunk *out) {
    for (int p = 0; p < 5; p++) {
        for (int j = 0; j < 32; j++) out->codes[32 * p + j] = trit(src[j], p);
        for (int j = 0; j < 16; j++) out->codes[160 + 16 * p + j] = trit(src[32 + j], p);
    }
    for (int p = 0; p < 4; p++)
        for (int j = 0; j < 4; j++) out->codes[240 + 4 * p + j] = trit(src[48 + j], p);
    const float d = half(src + 52);
    for (int s = 0; s < 8; s++) per32(out, s, d, 0.f);
}

DECODE tq2_0(const uint8_t *src, int blocks, const int8_t *grid, Chunk *out) {
    crumbs(src, out->codes, 1);
    const float d = half(src + 64);
    for (int s = 0; s < 8; s++) per32(out, s, d, 0.f);
}

#endif
