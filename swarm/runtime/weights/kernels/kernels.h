/* swarm's CPU kernels, as module.c calls them. Every function works on plain C arrays that
   the caller (swarm.runtime.weights.native) allocated, checked for shape and made contiguous. */
#ifndef SWARM_KERNELS_H
#define SWARM_KERNELS_H

#include <stdint.h>

/* y [batch, rows] = x [batch, cols] @ w.T (products.c); 0 on success, -1 out of memory */
int swarm_q4_matmul(const uint8_t *codes, const uint16_t *scale, const uint16_t *offset,
                    const float *x, float *y, int64_t rows, int64_t cols, int64_t batch,
                    int threads);
int swarm_i8_matmul(const int8_t *values, const float *scale, const float *x, float *y,
                    int64_t rows, int64_t cols, int64_t batch, int threads);

/* blocks.c: y [batch, rows] = x [batch, cols] @ w.T with w GGUF blocks of type `kind` (an index
   into block_decode.c's table) as stored, uint8 [rows, row bytes]; grid: the type's int8 grid
   or NULL. 0 on success, -1 out of memory, -2 for an unknown kind or a width its blocks do
   not divide. */
int swarm_block_matmul(int kind, const uint8_t *data, const int8_t *grid, const float *x,
                       float *y, int64_t rows, int64_t cols, int64_t batch, int threads);
/* the name of block kind i, or NULL past the last */
const char *swarm_block_name(int i);

/* Whether the products run their AVX-512 VNNI rows (same results, fewer instructions): asked
   for with want = 1, granted where the CPU has them; returns what is in use. */
int swarm_use_wide(int want);
int swarm_wide(void);

/* layer_ops.c */
void swarm_rms_norm(const float *x, const float *weight, float *y, int64_t rows, int64_t width,
                    float eps);
void swarm_rotate(float *heads, const float *cos, const float *sin, int64_t positions,
                  int64_t heads_per_position, int64_t rotated, int64_t head_dim);

/* attention.c: one decode position for each of `sessions` sessions. heads [sessions, q_heads +
   2 kv_heads, head_dim]: rotated queries, rotated new keys, new values. Each session's new key
   and value go to `position` of its cache, then out [sessions, q_heads * head_dim] is softmax
   attention over positions 0..position. 0 on success, -1 when out of memory. */
typedef struct {
    float *keys, *values; /* this layer's cache of the session: [kv_heads, capacity, head_dim] */
    int64_t position;     /* where the new key and value go */
    int64_t capacity;
} SwarmDecodeCache;

int swarm_decode_attention(const float *heads, const SwarmDecodeCache *caches, int64_t sessions,
                           int64_t q_heads, int64_t kv_heads, int64_t head_dim, float scale,
                           float *out);

/* experts.c: one matrix as the products take it. kind: a block kind (>= 0; a = the blocks,
   b = the type's grid or NULL), or one of the forms below. */
#define SWARM_MATRIX_Q4 -1  /* a = 4-bit codes, b = float16 scales, c = float16 offsets */
#define SWARM_MATRIX_I8 -2  /* a = int8 values, b = float32 scale per row */
#define SWARM_MATRIX_F32 -3 /* a = float32 [rows, cols] */
typedef struct {
    int64_t kind;
    const void *a, *b, *c;
    int64_t rows, cols;
} SwarmMatrix;

/* one expert: gate and up stacked along their rows (one matrix, or two of different types
   whose rows follow each other), then down; their biases or NULL */
typedef struct {
    SwarmMatrix gate_up[2];
    int64_t parts;
    SwarmMatrix down;
    const float *gate_up_bias; /* [2 inner] */
    const float *down_bias;    /* [hidden] */
} SwarmExpert;

#define SWARM_ROUTE_SOFTMAX_TOP_K 0 /* softmax over every expert, then the top k */
#define SWARM_ROUTE_TOP_K_SOFTMAX 1 /* the top k logits, then a softmax over those k */
#define SWARM_GLU_SILU 0            /* silu(gate) * up */
#define SWARM_GLU_CLAMPED 1 /* (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha g), g = min(gate, limit) */

/* How a layer routes and what its experts compute, and the router: [experts, hidden] and its
   bias [experts] or NULL */
typedef struct {
    SwarmMatrix router;
    const float *router_bias;
    int64_t experts, top_k, hidden, inner;
    int64_t routing, normalize, glu; /* normalize: the top k's weights rescaled to sum to 1 */
    float alpha, limit;
} SwarmExpertLayer;

/* out [rows, hidden] = the routed feed-forward of x [rows, hidden]: each row's top k experts
   (written to chosen [rows, top_k]) and their weights as `layer` routes, each chosen expert's
   down(glu(gate_up x)) times its weight, added in ascending expert order. table: one
   SwarmExpert per expert. 0 on success, -1 out of memory, -2 a matrix the products refuse. */
int swarm_routed_experts(const SwarmExpertLayer *layer, const SwarmExpert *table,
                         const float *x, int64_t rows, float *out, int32_t *chosen, int threads);

/* y [batch, m->rows] = x [batch, m->cols] @ w.T for one described matrix (experts.c); 0 on
   success, -1 out of memory, -2 a matrix the products refuse */
int swarm_matrix_product(const SwarmMatrix *m, const float *x, float *y, int64_t batch,
                         int threads);

/* h [rows, inner] = silu(gate) * up, gate and up the halves of each row of gate_up [rows,
   2 inner] (experts.c) */
void swarm_silu_mul(const float *gate_up, float *h, int64_t rows, int64_t inner);

/* dense_layer.c: up to three matrices whose output rows follow each other (q, k and v of
   different types), as one product */
typedef struct {
    SwarmMatrix parts[3];
    int64_t count, rows;
} SwarmStack;

/* A Llama-shaped decoder layer (Llama, Mistral, Qwen2, Qwen3, and the attention of Qwen3-MoE
   and Mixtral) as `swarm_dense_decode` runs it; the biases and q/k norms may be NULL. Its
   feed-forward: gate/up and down, or, where `experts` is not NULL, routed experts (`table`
   one per expert, as swarm_routed_experts takes them; gate_up and down unused) */
typedef struct {
    const float *input_norm, *post_norm;   /* [hidden] */
    const float *qkv_bias, *o_bias;        /* [(heads + 2 kv_heads) head_dim], [hidden] */
    const float *q_norm, *k_norm;          /* [head_dim], Qwen3's per-head norms */
    SwarmStack qkv, o, gate_up, down;
    const SwarmExpertLayer *experts;
    const SwarmExpert *table;
    int64_t hidden, heads, kv_heads, head_dim, inner;
    float eps, scale;
} SwarmDenseLayer;

/* One decode position per row through the whole layer, hidden [rows, hidden] updated in
   place: norm, q/k/v, rotary (cos and sin [rows, head_dim]), each row's key and value written
   to its cache and its attention over it (caches: one per row, as swarm_decode_attention),
   the output projection and residual, norm, gate/up, silu, down and residual. The same calls
   in the same order as the layer step by step, so the same bits. chosen [rows, top_k]: the
   experts each row routed to, where the layer has them (else unused). 0 on success, -1 out
   of memory, -2 a matrix the products refuse. */
int swarm_dense_decode(const SwarmDenseLayer *layer, float *hidden, const float *cos,
                       const float *sin, const SwarmDecodeCache *caches, int64_t rows,
                       int32_t *chosen, int threads);

#endif
