/* A decode step through a whole Llama-shaped layer in one call. Step by step from Python the
   layer took ~12 calls into the kernels and torch, ~100 interpreter calls around them: at the
   embedded model's width, more time than its arithmetic, and more still in a hop whose
   interpreter went cold while the other hops computed (a split layer ran ~30% slower than
   the same layer in one process).

   It calls the kernels the layer step by step calls, in the same order, on the same rows, so
   its output is that path's to the bit (tests/test_dense_layer.py): a node that runs a step
   here and a replay or a prefill step by step agrees with itself. */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

/* y [batch, stack->rows] = x @ the stacked matrices' rows; part: scratch [batch, rows] */
static int stack_product(const SwarmStack *stack, const float *x, float *y, float *part,
                         int64_t batch, int threads) {
    if (stack->count == 1) return swarm_matrix_product(&stack->parts[0], x, y, batch, threads);
    int64_t at = 0;
    for (int64_t p = 0; p < stack->count; p++) {
        const SwarmMatrix *m = &stack->parts[p];
        const int status = swarm_matrix_product(m, x, part, batch, threads);
        if (status != 0) return status;
        for (int64_t r = 0; r < batch; r++)
            memcpy(y + r * stack->rows + at, part + r * m->rows, sizeof(float) * (size_t)m->rows);
        at += m->rows;
    }
    return 0;
}

/* y [n, width] += bias [width], per row; the same single rounding as torch's add */
static void add_rows(float *y, const float *bias, int64_t n, int64_t width) {
    if (bias == NULL) return;
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < width; c++) y[r * width + c] += bias[c];
}

/* hidden [n] += add [n] */
static void add_into(float *hidden, const float *add, int64_t n) {
    for (int64_t i = 0; i < n; i++) hidden[i] += add[i];
}

int swarm_dense_decode(const SwarmDenseLayer *layer, float *hidden, const float *cos,
                       const float *sin, const SwarmDecodeCache *caches, int64_t rows,
                       int32_t *chosen, int threads) {
    const int64_t width = layer->hidden, dim = layer->head_dim, inner = layer->inner;
    const int64_t per_row = layer->heads + 2 * layer->kv_heads, rotated = layer->heads +
                                                                           layer->kv_heads;
    const int64_t qkv = per_row * dim, attended = layer->heads * dim;
    int64_t widest = qkv > 2 * inner ? qkv : 2 * inner;
    if (width > widest) widest = width;
    int status = -1;
    float *x = malloc(sizeof(float) * (size_t)(rows * width + 1));
    float *heads = malloc(sizeof(float) * (size_t)(rows * qkv + 1));
    float *attention = malloc(sizeof(float) * (size_t)(rows * attended + 1));
    float *out = malloc(sizeof(float) * (size_t)(rows * width + 1));
    float *gate_up = malloc(sizeof(float) * (size_t)(rows * 2 * inner + 1));
    float *h = malloc(sizeof(float) * (size_t)(rows * inner + 1));
    float *part = malloc(sizeof(float) * (size_t)(rows * widest + 1));
    if (!x || !heads || !attention || !out || !gate_up || !h || !part) goto done;

    swarm_rms_norm(hidden, layer->input_norm, x, rows, width, layer->eps);
    if ((status = stack_product(&layer->qkv, x, heads, part, rows, threads)) != 0) goto done;
    add_rows(heads, layer->qkv_bias, rows, qkv);
    if (layer->q_norm != NULL) /* each head a row of head_dim, normed in place */
        for (int64_t r = 0; r < rows; r++) {
            float *row = heads + r * qkv;
            swarm_rms_norm(row, layer->q_norm, row, layer->heads, dim, layer->eps);
            float *keys = row + layer->heads * dim;
            swarm_rms_norm(keys, layer->k_norm, keys, layer->kv_heads, dim, layer->eps);
        }
    swarm_rotate(heads, cos, sin, rows, per_row, rotated, dim);
    status = swarm_decode_attention(heads, caches, rows, layer->heads, layer->kv_heads, dim,
                                    layer->scale, attention);
    if (status != 0) goto done;
    if ((status = stack_product(&layer->o, attention, out, part, rows, threads)) != 0) goto done;
    add_rows(out, layer->o_bias, rows, width);
    add_into(hidden, out, rows * width);

    swarm_rms_norm(hidden, layer->post_norm, x, rows, width, layer->eps);
    if (layer->experts != NULL) {
        status = swarm_routed_experts(layer->experts, layer->table, x, rows, out, chosen, threads);
        if (status != 0) goto done;
    } else {
        if ((status = stack_product(&layer->gate_up, x, gate_up, part, rows, threads)) != 0)
            goto done;
        swarm_silu_mul(gate_up, h, rows, inner);
        if ((status = stack_product(&layer->down, h, out, part, rows, threads)) != 0) goto done;
    }
    add_into(hidden, out, rows * width);
    status = 0;
done:
    free(x);
    free(heads);
    free(attention);
    free(out);
    free(gate_up);
    free(h);
    free(part);
    return status;
}
