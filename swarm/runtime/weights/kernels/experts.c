/* A mixture-of-experts layer's routed feed-forward in one call: the router's logits, the
   softmax and top k, and each routed expert's down(silu(gate x) * up x) weighed and summed.

   From Python the same step took ~15 torch ops and two product calls per expert, a decode
   step of a 48-layer, 8-of-64 model ~400 calls whose dispatch cost more than the products.

   Every row is computed alone with the same arithmetic whatever the rows beside it: the
   router's dot products sum in a fixed order, an expert's rows go through the products
   (which compute each row alone), and a row adds its experts' outputs in ascending expert
   order. So a batch of sessions, a prefill and a verify step give each row the bits it gets
   alone, which failover replays and speculation's exact text rely on. */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

int swarm_matrix_product(const SwarmMatrix *m, const float *x, float *y, int64_t batch,
                         int threads) {
    switch (m->kind) {
    case SWARM_MATRIX_Q4:
        return swarm_q4_matmul(m->a, m->b, m->c, x, y, m->rows, m->cols, batch, threads);
    case SWARM_MATRIX_I8:
        return swarm_i8_matmul(m->a, m->b, x, y, m->rows, m->cols, batch, threads);
    case SWARM_MATRIX_F32: {
        /* only the router is float: a few dozen rows; 16 lanes, then the lanes in turn */
        const float *w = m->a;
        for (int64_t r = 0; r < batch; r++) {
            const float *v = x + r * m->cols;
            for (int64_t o = 0; o < m->rows; o++) {
                const float *wo = w + o * m->cols;
                __m256 l0 = _mm256_setzero_ps(), l1 = _mm256_setzero_ps();
                int64_t i = 0;
                for (; i + 16 <= m->cols; i += 16) {
                    l0 = _mm256_add_ps(l0, _mm256_mul_ps(_mm256_loadu_ps(wo + i),
                                                         _mm256_loadu_ps(v + i)));
                    l1 = _mm256_add_ps(l1, _mm256_mul_ps(_mm256_loadu_ps(wo + i + 8),
                                                         _mm256_loadu_ps(v + i + 8)));
                }
                float lanes[16], sum = 0.f;
                _mm256_storeu_ps(lanes, l0);
                _mm256_storeu_ps(lanes + 8, l1);
                for (int j = 0; j < 16; j++) sum += lanes[j];
                for (; i < m->cols; i++) sum += wo[i] * v[i];
                y[r * m->rows + o] = sum;
            }
        }
        return 0;
    }
    default:
        if (m->kind < 0) return -2;
        return swarm_block_matmul(m->kind, m->a, m->b, x, y, m->rows, m->cols, batch, threads);
    }
}

/* e^x for 8 lanes: x = n ln2 + r, |r| <= ln2 / 2, e^r by a degree-6 polynomial (within 2 ulp
   of expf over the range silu meets; below -87 it is 0, above 88 it saturates) */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
    const __m256i bias = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(bias, 23)));
}

/* h [rows, inner] = silu(gate) * up, gate and up the halves of each row of gate_up
   [rows, 2 inner] */
void swarm_silu_mul(const float *gate_up, float *h, int64_t rows, int64_t inner) {
    const __m256 one = _mm256_set1_ps(1.f);
    for (int64_t r = 0; r < rows; r++) {
        const float *gate = gate_up + r * 2 * inner, *up = gate + inner;
        float *out = h + r * inner;
        int64_t i = 0;
        for (; i + 8 <= inner; i += 8) {
            const __m256 g = _mm256_loadu_ps(gate + i);
            const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
            const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
            _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
        }
        for (; i < inner; i++) out[i] = gate[i] / (1.f + expf(-gate[i])) * up[i];
    }
}

/* h [inner] = glu(gate, up), gate and up the halves of one row of gate_up [2 inner] */
static void glu(const SwarmExpertLayer *layer, const float *gate_up, float *h) {
    const int64_t inner = layer->inner;
    const float *gate = gate_up, *up = gate_up + inner;
    const __m256 one = _mm256_set1_ps(1.f);
    int64_t i = 0;
    if (layer->glu == SWARM_GLU_CLAMPED) {
        const float alpha = layer->alpha, limit = layer->limit;
        const __m256 a = _mm256_set1_ps(alpha), top = _mm256_set1_ps(limit),
                     bottom = _mm256_set1_ps(-limit);
        for (; i + 8 <= inner; i += 8) {
            const __m256 g = _mm256_min_ps(_mm256_loadu_ps(gate + i), top);
            const __m256 u = _mm256_max_ps(_mm256_min_ps(_mm256_loadu_ps(up + i), top), bottom);
            const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(g, a)));
            const __m256 sigmoid = _mm256_div_ps(one, _mm256_add_ps(one, e));
            _mm256_storeu_ps(h + i, _mm256_mul_ps(_mm256_add_ps(u, one), _mm256_mul_ps(g, sigmoid)));
        }
        for (; i < inner; i++) {
            const float g = gate[i] < limit ? gate[i] : limit;
            const float u = up[i] < -limit ? -limit : (up[i] > limit ? limit : up[i]);
            h[i] = (u + 1.f) * (g * (1.f / (1.f + expf(-(g * alpha)))));
        }
        return;
    }
    swarm_silu_mul(gate_up, h, 1, inner);
}

/* One row's routing: the top k logits (ties to the lower expert) and their weights, a softmax
   over every expert's or over the k's, rescaled to sum to 1 where `normalize` */
static void route(const SwarmExpertLayer *layer, float *logits, int32_t *chosen,
                  float *weights) {
    const int64_t experts = layer->experts, top_k = layer->top_k;
    if (layer->router_bias != NULL)
        for (int64_t e = 0; e < experts; e++) logits[e] += layer->router_bias[e];
    for (int64_t j = 0; j < top_k; j++) {
        int64_t best = -1;
        for (int64_t e = 0; e < experts; e++) {
            int taken = 0;
            for (int64_t i = 0; i < j; i++) taken |= chosen[i] == e;
            if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
        }
        chosen[j] = (int32_t)best;
    }
    /* softmax: the largest logit is the first chosen, over every expert or the k */
    const float most = logits[chosen[0]];
    float total = 0.f;
    if (layer->routing == SWARM_ROUTE_SOFTMAX_TOP_K)
        for (int64_t e = 0; e < experts; e++) total += expf(logits[e] - most);
    else
        for (int64_t j = 0; j < top_k; j++) total += expf(logits[chosen[j]] - most);
    for (int64_t j = 0; j < top_k; j++) weights[j] = expf(logits[chosen[j]] - most) / total;
    if (layer->normalize) {
        float sum = 0.f;
        for (int64_t j = 0; j < top_k; j++) sum += weights[j];
        for (int64_t j = 0; j < top_k; j++) weights[j] = weights[j] / sum;
    }
}

/* y [n, rows] += bias [rows] per row */
static void add_bias(float *y, const float *bias, int64_t n, int64_t rows) {
    if (bias == NULL) return;
    for (int64_t i = 0; i < n; i++)
        for (int64_t c = 0; c < rows; c++) y[i * rows + c] += bias[c];
}

int swarm_routed_experts(const SwarmExpertLayer *layer, const SwarmExpert *table,
                         const float *x, int64_t rows, float *out, int32_t *chosen,
                         int threads) {
    const int64_t experts = layer->experts, top_k = layer->top_k, hidden = layer->hidden,
                  inner = layer->inner;
    if (rows == 0) return 0;
    int status = -1;
    float *logits = malloc(sizeof(float) * (size_t)(rows * experts));
    float *weights = malloc(sizeof(float) * (size_t)(rows * top_k));
    int64_t *members = malloc(sizeof(int64_t) * (size_t)rows);
    float *shares = malloc(sizeof(float) * (size_t)rows);
    float *gathered = malloc(sizeof(float) * (size_t)(rows * hidden));
    float *gate_up = malloc(sizeof(float) * (size_t)(rows * 2 * inner));
    float *part = malloc(sizeof(float) * (size_t)(rows * 2 * inner));
    float *h = malloc(sizeof(float) * (size_t)(rows * inner));
    float *down = malloc(sizeof(float) * (size_t)(rows * hidden));
    if (!logits || !weights || !members || !shares || !gathered || !gate_up || !part || !h ||
        !down)
        goto done;
    if ((status = swarm_matrix_product(&layer->router, x, logits, rows, threads)) != 0) goto done;
    for (int64_t r = 0; r < rows; r++)
        route(layer, logits + r * experts, chosen + r * top_k, weights + r * top_k);
    memset(out, 0, sizeof(float) * (size_t)(rows * hidden));
    for (int64_t e = 0; e < experts; e++) {
        int64_t n = 0;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < top_k; j++)
                if (chosen[r * top_k + j] == e) {
                    members[n] = r;
                    shares[n] = weights[r * top_k + j];
                    memcpy(gathered + n * hidden, x + r * hidden, sizeof(float) * (size_t)hidden);
                    n++;
                }
        if (n == 0) continue;
        const SwarmExpert *ex = &table[e];
        if (ex->parts == 1) {
            if ((status = swarm_matrix_product(&ex->gate_up[0], gathered, gate_up, n, threads)) != 0)
                goto done;
        } else { /* gate and up of different types: each its own product, joined per row */
            int64_t at = 0;
            for (int p = 0; p < ex->parts; p++) {
                const SwarmMatrix *m = &ex->gate_up[p];
                if ((status = swarm_matrix_product(m, gathered, part, n, threads)) != 0) goto done;
                for (int64_t i = 0; i < n; i++)
                    memcpy(gate_up + i * 2 * inner + at, part + i * m->rows,
                           sizeof(float) * (size_t)m->rows);
                at += m->rows;
            }
        }
        add_bias(gate_up, ex->gate_up_bias, n, 2 * inner);
        for (int64_t i = 0; i < n; i++) glu(layer, gate_up + i * 2 * inner, h + i * inner);
        if ((status = swarm_matrix_product(&ex->down, h, down, n, threads)) != 0) goto done;
        add_bias(down, ex->down_bias, n, hidden);
        for (int64_t i = 0; i < n; i++) {
            float *o = out + members[i] * hidden;
            const float *d = down + i * hidden, w = shares[i];
            const __m256 wv = _mm256_set1_ps(w);
            int64_t c = 0;
            for (; c + 8 <= hidden; c += 8)
                _mm256_storeu_ps(o + c, _mm256_add_ps(_mm256_loadu_ps(o + c),
                                                      _mm256_mul_ps(_mm256_loadu_ps(d + c), wv)));
            for (; c < hidden; c++) o[c] += d[c] * w;
        }
    }
    status = 0;
done:
    free(logits);
    free(weights);
    free(members);
    free(shares);
    free(gathered);
    free(gate_up);
    free(part);
    free(h);
    free(down);
    return status;
}
