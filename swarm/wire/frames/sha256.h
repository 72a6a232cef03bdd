#ifndef SWARM_SHA256_H
#define SWARM_SHA256_H

#include <stddef.h>
#include <stdint.h>

struct hmac_key {
    uint32_t inner[8]; /* SHA-256 state after the key xor 0x36, one block */
    uint32_t outer[8]; /* after the key xor 0x5c */
};

void sha256(const uint8_t *data, size_t n, uint8_t out[32]);
void hmac_key(const uint8_t *key, size_t n, struct hmac_key *out);
void hmac_sha256(const struct hmac_key *key, const uint8_t *data, size_t n, uint8_t out[32]);
int sha256_uses_extensions(void); /* whether the CPU's SHA instructions run it */
int sha256_use_extensions(int wanted); /* off: plain C (tests hold both to hashlib) */

#endif
