/* swarm's CPU kernels, as module.c calls them. Every function works on plain C arrays that
   the caller (swarm.runtime.native) allocated, checked for shape and made contiguous. */
#ifndef SWARM_KERNELS_H
#define SWARM_KERNELS_H

#include <stdint.h>

/* y [batch, rows] = x [batch, cols] @ w.T (products.c); 0 on success, -1 out of memory */
int swarm_q4_matmul(const uint8_t *codes, const uint16_t *scale, const uint16_t *offset,
                    const float *x, float *y, int64_t rows, int64_t cols, int64_t batch,
                    int threads);
int swarm_i8_matmul(const int8_t *values, const float *scale, const float *x, float *y,
                    int64_t rows, int64_t cols, int64_t batch, int threads);

/* layer_ops.c */
void swarm_rms_norm(const float *x, const float *weight, float *y, int64_t rows, int64_t width,
                    float eps);
void swarm_rotate(float *heads, const float *cos, const float *sin, int64_t positions,
                  int64_t heads_per_position, int64_t rotated, int64_t head_dim);

#endif
