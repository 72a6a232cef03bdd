/* The small per-layer steps around the products, each one pass over its rows: at decode a
   576-wide layer spends more time dispatching torch's five-op RMS norm and six-op rotary than
   computing them. Rows are independent and each is summed in a fixed order (eight lanes, then
   the lanes in turn), so a row's result never depends on its batch. */
#include <immintrin.h>
#include <math.h>

#include "kernels.h"

/* y = weight * (x / sqrt(mean(x^2) + eps)), per row of `width` */
void swarm_rms_norm(const float *x, const float *weight, float *y, int64_t rows, int64_t width,
                    float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *v = x + r * width;
        float *out = y + r * width;
        __m256 lanes = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= width; i += 8) {
            const __m256 t = _mm256_loadu_ps(v + i);
            lanes = _mm256_add_ps(lanes, _mm256_mul_ps(t, t));
        }
        float partial[8], squares = 0.f;
        _mm256_storeu_ps(partial, lanes);
        for (int j = 0; j < 8; j++) squares += partial[j];
        for (; i < width; i++) squares += v[i] * v[i];
        const float inverse = 1.f / sqrtf(squares / (float)width + eps);
        const __m256 scale = _mm256_set1_ps(inverse);
        for (i = 0; i + 8 <= width; i += 8)
            _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(weight + i),
                                                    _mm256_mul_ps(_mm256_loadu_ps(v + i), scale)));
        for (; i < width; i++) out[i] = weight[i] * (v[i] * inverse);
    }
}

/* Rotary position embedding in place, on the first `rotated` heads of each position:
   heads [positions, heads_per_position, head_dim], cos and sin [positions, head_dim].
   x' = x * cos + rotate_half(x) * sin, rotate_half(x) = (-x[half:], x[:half]). */
void swarm_rotate(float *heads, const float *cos, const float *sin, int64_t positions,
                  int64_t heads_per_position, int64_t rotated, int64_t head_dim) {
    const int64_t half = head_dim / 2;
    for (int64_t p = 0; p < positions; p++) {
        const float *c = cos + p * head_dim, *s = sin + p * head_dim;
        for (int64_t h = 0; h < rotated; h++) {
            float *x = heads + (p * heads_per_position + h) * head_dim;
            for (int64_t i = 0; i < half; i++) {
                const float a = x[i], b = x[i + half];
                x[i] = a * c[i] - b * s[i];
                x[i + half] = b * c[i + half] + a * s[i + half];
            }
        }
    }
}
