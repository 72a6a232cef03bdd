/* SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104) for a frame's tag: the x86 SHA extensions
 * where the CPU has them, plain C elsewhere. A key's inner and outer states are hashed once
 * (hmac_key) and every tag starts from them, as an HMAC object copied per message does. */

#include "sha256.h"

#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define SWARM_SHA_NI 1
#endif

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2,
};

static const uint32_t H0[8] = {
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
};

static inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static inline uint32_t load_be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline void store_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static void blocks_plain(uint32_t state[8], const uint8_t *data, size_t blocks) {
    for (; blocks; blocks--, data += 64) {
        uint32_t w[64];
        for (int t = 0; t < 16; t++) w[t] = load_be32(data + 4 * t);
        for (int t = 16; t < 64; t++) {
            uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
            uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
            w[t] = w[t - 16] + s0 + w[t - 7] + s1;
        }
        uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
        uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
        for (int t = 0; t < 64; t++) {
            uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                          K[t] + w[t];
            uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
            h = g;
            g = f;
            f = e;
            e = d + t1;
            d = c;
            c = b;
            b = a;
            a = t1 + t2;
        }
        state[0] += a;
        state[1] += b;
        state[2] += c;
        state[3] += d;
        state[4] += e;
        state[5] += f;
        state[6] += g;
        state[7] += h;
    }
}

#ifdef SWARM_SHA_NI
/* The SHA extensions keep the state as two vectors, ABEF and CDGH; each sha256rnds2 runs two
 * rounds, and sha256msg1/msg2 extend the message schedule four words at a time. */
__attribute__((target("sha,sse4.1"))) static void blocks_ni(uint32_t state[8], const uint8_t *data,
                                                           size_t blocks) {
    const __m128i swap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i dcba = _mm_loadu_si128((const __m128i *)&state[0]);
    __m128i hgfe = _mm_loadu_si128((const __m128i *)&state[4]);
    __m128i cdab = _mm_shuffle_epi32(dcba, 0xB1);
    __m128i efgh = _mm_shuffle_epi32(hgfe, 0x1B);
    __m128i abef = _mm_alignr_epi8(cdab, efgh, 8);
    __m128i cdgh = _mm_blend_epi16(efgh, cdab, 0xF0);
    for (; blocks; blocks--, data += 64) {
        const __m128i abef_before = abef, cdgh_before = cdgh;
        __m128i w[4];
        for (int g = 0; g < 16; g++) {
            __m128i words;
            if (g < 4) {
                words = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(data + 16 * g)), swap);
            } else {
                __m128i x = _mm_sha256msg1_epu32(w[g & 3], w[(g + 1) & 3]);
                x = _mm_add_epi32(x, _mm_alignr_epi8(w[(g + 3) & 3], w[(g + 2) & 3], 4));
                words = _mm_sha256msg2_epu32(x, w[(g + 3) & 3]);
            }
            w[g & 3] = words;
            __m128i message = _mm_add_epi32(words, _mm_loadu_si128((const __m128i *)&K[4 * g]));
            cdgh = _mm_sha256rnds2_epu32(cdgh, abef, message);
            abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(message, 0x0E));
        }
        abef = _mm_add_epi32(abef, abef_before);
        cdgh = _mm_add_epi32(cdgh, cdgh_before);
    }
    __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
    __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
    _mm_storeu_si128((__m128i *)&state[0], _mm_blend_epi16(feba, dchg, 0xF0));
    _mm_storeu_si128((__m128i *)&state[4], _mm_alignr_epi8(dchg, feba, 8));
}
#endif

static int ni_checked = 0, ni_present = 0, ni_wanted = 1;

int sha256_uses_extensions(void) {
#ifdef SWARM_SHA_NI
    if (!ni_checked) {
        __builtin_cpu_init();
        ni_present = __builtin_cpu_supports("sha") && __builtin_cpu_supports("sse4.1");
        ni_checked = 1;
    }
    return ni_present && ni_wanted;
#else
    return 0;
#endif
}

int sha256_use_extensions(int wanted) {
    ni_wanted = wanted;
    return sha256_uses_extensions();
}

static void blocks(uint32_t state[8], const uint8_t *data, size_t count) {
#ifdef SWARM_SHA_NI
    if (sha256_uses_extensions()) {
        blocks_ni(state, data, count);
        return;
    }
#endif
    blocks_plain(state, data, count);
}

/* The digest of `prefix_bytes` already hashed into `state` (a multiple of 64) then `data`. */
static void finish(const uint32_t start[8], uint64_t prefix_bytes, const uint8_t *data, size_t n,
                   uint8_t out[32]) {
    uint32_t state[8];
    memcpy(state, start, sizeof state);
    size_t whole = n / 64;
    blocks(state, data, whole);
    uint8_t tail[128] = {0};
    size_t rest = n - whole * 64;
    memcpy(tail, data + whole * 64, rest);
    tail[rest] = 0x80;
    size_t tail_len = rest + 9 <= 64 ? 64 : 128;
    uint64_t bits = (prefix_bytes + n) * 8;
    for (int i = 0; i < 8; i++) tail[tail_len - 1 - i] = (uint8_t)(bits >> (8 * i));
    blocks(state, tail, tail_len / 64);
    for (int i = 0; i < 8; i++) store_be32(out + 4 * i, state[i]);
}

void sha256(const uint8_t *data, size_t n, uint8_t out[32]) { finish(H0, 0, data, n, out); }

void hmac_key(const uint8_t *key, size_t n, struct hmac_key *out) {
    uint8_t block[64] = {0};
    if (n > 64) {
        sha256(key, n, block);
    } else {
        memcpy(block, key, n);
    }
    uint8_t pad[64];
    memcpy(out->inner, H0, sizeof H0);
    memcpy(out->outer, H0, sizeof H0);
    for (int i = 0; i < 64; i++) pad[i] = block[i] ^ 0x36;
    blocks(out->inner, pad, 1);
    for (int i = 0; i < 64; i++) pad[i] = block[i] ^ 0x5c;
    blocks(out->outer, pad, 1);
}

void hmac_sha256(const struct hmac_key *key, const uint8_t *data, size_t n, uint8_t out[32]) {
    uint8_t inner[32];
    finish(key->inner, 64, data, n, inner);
    finish(key->outer, 64, inner, sizeof inner, out);
}
