/* Attention for one decode position of several sessions in one call: each session writes its
   new key and value into its own cache and attends over every position it holds. In torch this
   is a cache write, a slice and a scaled-dot-product call per session and layer, whose
   dispatch costs more than the arithmetic at the lengths a decode step sees.

   Each session is computed alone, in a fixed order (scores, their maximum, exponentials summed
   in position order, the weighted sum of values in position order), so its result does not
   depend on which other sessions share the call. */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>

#include "kernels.h"

static __thread float *scores = NULL; /* grown to the longest call so far, never freed */
static __thread int64_t scores_held = 0;

static inline float dot(const float *a, const float *b, int64_t n) {
    __m256 lanes = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        lanes = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), lanes);
    float partial[8], sum = 0.f;
    _mm256_storeu_ps(partial, lanes);
    for (int j = 0; j < 8; j++) sum += partial[j];
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

/* out += weight * v, over n */
static inline void add_scaled(float *out, const float *v, float weight, int64_t n) {
    const __m256 w = _mm256_set1_ps(weight);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i,
                         _mm256_fmadd_ps(w, _mm256_loadu_ps(v + i), _mm256_loadu_ps(out + i)));
    for (; i < n; i++) out[i] += weight * v[i];
}

int swarm_decode_attention(const float *heads, const SwarmDecodeCache *caches, int64_t sessions,
                           int64_t q_heads, int64_t kv_heads, int64_t head_dim, float scale,
                           float *out) {
    const int64_t per_session = q_heads + 2 * kv_heads, group = q_heads / kv_heads;
    for (int64_t s = 0; s < sessions; s++) {
        const SwarmDecodeCache *c = caches + s;
        const int64_t length = c->position + 1;
        if (length > scores_held) {
            float *grown = realloc(scores, sizeof(float) * (size_t)length);
            if (grown == NULL) return -1;
            scores = grown;
            scores_held = length;
        }
        const float *q = heads + s * per_session * head_dim;
        const float *k_new = q + q_heads * head_dim, *v_new = k_new + kv_heads * head_dim;
        for (int64_t j = 0; j < kv_heads; j++) {
            float *keys = c->keys + j * c->capacity * head_dim;
            float *values = c->values + j * c->capacity * head_dim;
            for (int64_t i = 0; i < head_dim; i++) {
                keys[c->position * head_dim + i] = k_new[j * head_dim + i];
                values[c->position * head_dim + i] = v_new[j * head_dim + i];
            }
            for (int64_t h = j * group; h < (j + 1) * group; h++) {
                const float *query = q + h * head_dim;
                float top = -INFINITY;
                for (int64_t t = 0; t < length; t++) {
                    scores[t] = dot(query, keys + t * head_dim, head_dim) * scale;
                    top = scores[t] > top ? scores[t] : top;
                }
                float total = 0.f;
                for (int64_t t = 0; t < length; t++) {
                    scores[t] = expf(scores[t] - top);
                    total += scores[t];
                }
                float *o = out + (s * q_heads + h) * head_dim;
                for (int64_t i = 0; i < head_dim; i++) o[i] = 0.f;
                for (int64_t t = 0; t < length; t++)
                    add_scaled(o, values + t * head_dim, scores[t], head_dim);
                const float inverse = 1.f / total;
                for (int64_t i = 0; i < head_dim; i++) o[i] *= inverse;
            }
        }
    }
    return 0;
}
