/* The Python module `swarm.runtime.weights._kernels`: thin fast-call wrappers over kernels.h.
   Arguments are addresses and sizes that swarm.runtime.weights.native checked; the products release
   the interpreter lock while they run (the node's event loop goes on), as does a whole
   layer's decode step; the small layer steps and a decode step's attention keep it (they
   take microseconds). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "kernels.h"

static int addresses(PyObject *const *args, Py_ssize_t n, void **out) {
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = PyLong_AsVoidPtr(args[i]);
        if (out[i] == NULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "null address");
            return -1;
        }
    }
    return 0;
}

static int sizes(PyObject *const *args, Py_ssize_t n, int64_t *out) {
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = PyLong_AsLongLong(args[i]);
        if (out[i] == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

static int count(const char *name, Py_ssize_t got, Py_ssize_t want) {
    if (got == want) return 0;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, not %zd", name, want, got);
    return -1;
}

/* q4_matmul(codes, scale, offset, x, y, rows, cols, batch, threads) */
static PyObject *q4_matmul(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *p[5];
    int64_t s[4];
    if (count("q4_matmul", n, 9) || addresses(args, 5, p) || sizes(args + 5, 4, s)) return NULL;
    int status;
    Py_BEGIN_ALLOW_THREADS status = swarm_q4_matmul(p[0], p[1], p[2], p[3], p[4], s[0], s[1],
                                                    s[2], (int)s[3]);
    Py_END_ALLOW_THREADS if (status != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* i8_matmul(values, scale, x, y, rows, cols, batch, threads) */
static PyObject *i8_matmul(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *p[4];
    int64_t s[4];
    if (count("i8_matmul", n, 8) || addresses(args, 4, p) || sizes(args + 4, 4, s)) return NULL;
    int status;
    Py_BEGIN_ALLOW_THREADS status =
        swarm_i8_matmul(p[0], p[1], p[2], p[3], s[0], s[1], s[2], (int)s[3]);
    Py_END_ALLOW_THREADS if (status != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* block_matmul(kind, data, grid, x, y, rows, cols, batch, threads); grid may be 0 */
static PyObject *block_matmul(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *p[4];
    int64_t s[5];
    if (count("block_matmul", n, 9) || sizes(args, 1, s) || addresses(args + 1, 1, p)) return NULL;
    void *grid = PyLong_AsVoidPtr(args[2]); /* NULL for types without a grid */
    if (grid == NULL && PyErr_Occurred()) return NULL;
    if (addresses(args + 3, 2, p + 2) || sizes(args + 5, 4, s + 1)) return NULL;
    int status;
    Py_BEGIN_ALLOW_THREADS status = swarm_block_matmul((int)s[0], p[0], grid, p[2], p[3], s[1],
                                                       s[2], s[3], (int)s[4]);
    Py_END_ALLOW_THREADS if (status == -1) return PyErr_NoMemory();
    if (status != 0) {
        PyErr_SetString(PyExc_ValueError, "unknown block kind, or a width its blocks do not divide");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* block_types() -> the block kinds' names, in the order block_matmul numbers them */
static PyObject *block_types(PyObject *self, PyObject *unused) {
    PyObject *names = PyList_New(0);
    if (names == NULL) return NULL;
    for (int i = 0; swarm_block_name(i) != NULL; i++) {
        PyObject *name = PyUnicode_FromString(swarm_block_name(i));
        if (name == NULL || PyList_Append(names, name) != 0) {
            Py_XDECREF(name);
            Py_DECREF(names);
            return NULL;
        }
        Py_DECREF(name);
    }
    return names;
}

/* rms_norm(x, weight, y, rows, width, eps) */
static PyObject *rms_norm(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *p[3];
    int64_t s[2];
    if (count("rms_norm", n, 6) || addresses(args, 3, p) || sizes(args + 3, 2, s)) return NULL;
    const double eps = PyFloat_AsDouble(args[5]);
    if (eps == -1.0 && PyErr_Occurred()) return NULL;
    swarm_rms_norm(p[0], p[1], p[2], s[0], s[1], (float)eps);
    Py_RETURN_NONE;
}

/* rotate(heads, cos, sin, positions, heads_per_position, rotated, head_dim) */
static PyObject *rotate(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *p[3];
    int64_t s[4];
    if (count("rotate", n, 7) || addresses(args, 3, p) || sizes(args + 3, 4, s)) return NULL;
    swarm_rotate(p[0], p[1], p[2], s[0], s[1], s[2], s[3]);
    Py_RETURN_NONE;
}

#define ATTENTION_KEEPS_LOCK_BELOW (1 << 22) /* multiply-adds: ~0.2 ms here */

/* `count` caches from (keys, values, position, capacity) arguments, checked; PyMem_Free them.
   NULL with the error set. */
static SwarmDecodeCache *read_caches(PyObject *const *args, Py_ssize_t count) {
    SwarmDecodeCache *caches = PyMem_Malloc(sizeof(SwarmDecodeCache) * (size_t)(count + 1));
    if (caches == NULL) return (SwarmDecodeCache *)PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < count; i++) {
        void *kv[2];
        int64_t where[2];
        if (addresses(args + 4 * i, 2, kv) || sizes(args + 2 + 4 * i, 2, where)) {
            PyMem_Free(caches);
            return NULL;
        }
        if (where[0] < 0 || where[0] >= where[1]) { /* the kernel would write past the cache */
            PyMem_Free(caches);
            PyErr_Format(PyExc_ValueError, "position %lld outside a cache of %lld",
                         (long long)where[0], (long long)where[1]);
            return NULL;
        }
        caches[i] = (SwarmDecodeCache){kv[0], kv[1], where[0], where[1]};
    }
    return caches;
}

/* decode_attention(heads, out, q_heads, kv_heads, head_dim, scale,
                    then per session: keys, values, position, capacity) */
static PyObject *decode_attention(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n < 6 || (n - 6) % 4 != 0) {
        PyErr_SetString(PyExc_TypeError, "decode_attention takes 6 + 4 per session arguments");
        return NULL;
    }
    void *p[2];
    int64_t s[3];
    if (addresses(args, 2, p) || sizes(args + 2, 3, s)) return NULL;
    const double scale = PyFloat_AsDouble(args[5]);
    if (scale == -1.0 && PyErr_Occurred()) return NULL;
    const Py_ssize_t sessions = (n - 6) / 4;
    SwarmDecodeCache *caches = read_caches(args + 6, sessions);
    if (caches == NULL) return NULL;
    /* At a decode step's usual lengths this takes microseconds, and handing the interpreter
       lock to the event loop and waiting to take it back cost more than that: one node behind
       HTTP ran at 0.77-0.81x one process with the lock given up here, 0.94-0.95x without
       (python -m bench.swarm). Long caches give it up, as the products do. */
    int64_t work = 0; /* multiply-adds of the scores and of the weighted values */
    for (Py_ssize_t i = 0; i < sessions; i++) work += 2 * (caches[i].position + 1) * s[0] * s[2];
    PyThreadState *released = work < ATTENTION_KEEPS_LOCK_BELOW ? NULL : PyEval_SaveThread();
    const int status =
        swarm_decode_attention(p[0], caches, sessions, s[0], s[1], s[2], (float)scale, p[1]);
    if (released != NULL) PyEval_RestoreThread(released);
    PyMem_Free(caches);
    if (status != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* matrix(kind, a, b, c, rows, cols) -> bytes: one matrix described for routed_experts;
   b and c may be 0 */
static PyObject *matrix(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t s[6];
    if (count("matrix", n, 6) || sizes(args, 1, s)) return NULL;
    SwarmMatrix m = {.kind = s[0]};
    const void **at[3] = {&m.a, &m.b, &m.c};
    for (int i = 0; i < 3; i++) {
        *at[i] = PyLong_AsVoidPtr(args[1 + i]);
        if (*at[i] == NULL && PyErr_Occurred()) return NULL;
    }
    if (m.a == NULL || sizes(args + 4, 2, s + 4)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "null address");
        return NULL;
    }
    m.rows = s[4];
    m.cols = s[5];
    return PyBytes_FromStringAndSize((const char *)&m, sizeof m);
}

static int described(PyObject *bytes, const SwarmMatrix **m) {
    if (!PyBytes_Check(bytes) || PyBytes_GET_SIZE(bytes) != (Py_ssize_t)sizeof(SwarmMatrix)) {
        PyErr_SetString(PyExc_TypeError, "expected a matrix described by matrix()");
        return -1;
    }
    *m = (const SwarmMatrix *)PyBytes_AS_STRING(bytes);
    return 0;
}

static int optional_address(PyObject *arg, const float **out) {
    *out = PyLong_AsVoidPtr(arg); /* 0: none */
    return *out == NULL && PyErr_Occurred() ? -1 : 0;
}

/* expert(down, gate_up_bias, down_bias, *gate_up_parts) -> bytes: one expert of
   routed_experts' table; the biases' addresses or 0; 1 or 2 gate/up parts */
static PyObject *expert(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n < 4 || n > 5) {
        PyErr_SetString(PyExc_TypeError, "expert takes down, two biases and 1 or 2 gate/up parts");
        return NULL;
    }
    SwarmExpert e = {.parts = n - 3};
    const SwarmMatrix *m;
    if (described(args[0], &m) || optional_address(args[1], &e.gate_up_bias) ||
        optional_address(args[2], &e.down_bias))
        return NULL;
    e.down = *m;
    for (Py_ssize_t i = 3; i < n; i++) {
        if (described(args[i], &m)) return NULL;
        e.gate_up[i - 3] = *m;
    }
    return PyBytes_FromStringAndSize((const char *)&e, sizeof e);
}

/* expert_layer(router, router_bias, experts, top_k, hidden, inner, routing, normalize, glu,
                alpha, limit) -> bytes: how routed_experts routes and computes a layer */
static PyObject *expert_layer(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    SwarmExpertLayer layer = {0};
    const SwarmMatrix *router;
    int64_t s[7];
    if (count("expert_layer", n, 11) || described(args[0], &router) ||
        optional_address(args[1], &layer.router_bias) || sizes(args + 2, 7, s))
        return NULL;
    const double alpha = PyFloat_AsDouble(args[9]), limit = PyFloat_AsDouble(args[10]);
    if (PyErr_Occurred()) return NULL;
    layer.router = *router;
    layer.experts = s[0];
    layer.top_k = s[1];
    layer.hidden = s[2];
    layer.inner = s[3];
    layer.routing = s[4];
    layer.normalize = s[5];
    layer.glu = s[6];
    layer.alpha = (float)alpha;
    layer.limit = (float)limit;
    if (layer.top_k < 1 || layer.top_k > layer.experts || router->rows != layer.experts ||
        router->cols != layer.hidden) {
        PyErr_SetString(PyExc_ValueError, "a router and a routing that do not agree");
        return NULL;
    }
    return PyBytes_FromStringAndSize((const char *)&layer, sizeof layer);
}

/* routed_experts(layer, table, x, rows, out, chosen, threads); layer: expert_layer(), table:
   expert() for each expert in turn */
static PyObject *routed_experts(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t s[2];
    void *p[3];
    if (count("routed_experts", n, 7) || addresses(args + 2, 1, p) || sizes(args + 3, 1, s) ||
        addresses(args + 4, 2, p + 1) || sizes(args + 6, 1, s + 1))
        return NULL;
    if (!PyBytes_Check(args[0]) ||
        PyBytes_GET_SIZE(args[0]) != (Py_ssize_t)sizeof(SwarmExpertLayer)) {
        PyErr_SetString(PyExc_TypeError, "expected a layer described by expert_layer()");
        return NULL;
    }
    const SwarmExpertLayer *layer = (const SwarmExpertLayer *)PyBytes_AS_STRING(args[0]);
    if (!PyBytes_Check(args[1]) ||
        PyBytes_GET_SIZE(args[1]) != (Py_ssize_t)(layer->experts * (int64_t)sizeof(SwarmExpert))) {
        PyErr_SetString(PyExc_ValueError, "an expert table of another number of experts");
        return NULL;
    }
    const SwarmExpert *table = (const SwarmExpert *)PyBytes_AS_STRING(args[1]);
    int status;
    Py_BEGIN_ALLOW_THREADS status =
        swarm_routed_experts(layer, table, p[0], s[0], p[1], p[2], (int)s[1]);
    Py_END_ALLOW_THREADS if (status == -1) return PyErr_NoMemory();
    if (status != 0) {
        PyErr_SetString(PyExc_ValueError, "an expert matrix the products do not run");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* the matrices of one stack: 1 to 3 matrix() descriptions joined, their rows following each
   other (0, b"", where `empty` allows it) */
static int stacked(PyObject *bytes, SwarmStack *stack, int empty) {
    const Py_ssize_t size = PyBytes_Check(bytes) ? PyBytes_GET_SIZE(bytes) : -1;
    const Py_ssize_t count = size / (Py_ssize_t)sizeof(SwarmMatrix);
    if (count < (empty ? 0 : 1) || count > 3 || count * (Py_ssize_t)sizeof(SwarmMatrix) != size) {
        PyErr_SetString(PyExc_TypeError, "expected 1 to 3 matrices described by matrix()");
        return -1;
    }
    memcpy(stack->parts, PyBytes_AS_STRING(bytes), (size_t)size);
    stack->count = count;
    stack->rows = 0;
    for (Py_ssize_t i = 0; i < count; i++) stack->rows += stack->parts[i].rows;
    return 0;
}

/* dense_layer(qkv, o, gate_up, down, experts, table, input_norm, post_norm, qkv_bias, o_bias,
               q_norm, k_norm, hidden, heads, kv_heads, head_dim, inner, eps, scale) -> bytes:
   a layer as dense_decode runs it; the stacks from matrix(); experts and table as
   routed_experts takes them, or None (then gate_up and down, else b"" for both); the norms'
   and biases' addresses (0: none). The layer points into experts and table: keep them. */
static PyObject *dense_layer(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    SwarmDenseLayer layer = {0};
    if (count("dense_layer", n, 19)) return NULL;
    const int routed = args[4] != Py_None;
    if (stacked(args[0], &layer.qkv, 0) || stacked(args[1], &layer.o, 0) ||
        stacked(args[2], &layer.gate_up, routed) || stacked(args[3], &layer.down, routed))
        return NULL;
    if (routed) {
        if (!PyBytes_Check(args[4]) ||
            PyBytes_GET_SIZE(args[4]) != (Py_ssize_t)sizeof(SwarmExpertLayer)) {
            PyErr_SetString(PyExc_TypeError, "expected a layer described by expert_layer()");
            return NULL;
        }
        layer.experts = (const SwarmExpertLayer *)PyBytes_AS_STRING(args[4]);
        if (!PyBytes_Check(args[5]) ||
            PyBytes_GET_SIZE(args[5]) !=
                (Py_ssize_t)(layer.experts->experts * (int64_t)sizeof(SwarmExpert))) {
            PyErr_SetString(PyExc_ValueError, "an expert table of another number of experts");
            return NULL;
        }
        layer.table = (const SwarmExpert *)PyBytes_AS_STRING(args[5]);
    }
    const float **vectors[6] = {&layer.input_norm, &layer.post_norm, &layer.qkv_bias,
                                &layer.o_bias,     &layer.q_norm,    &layer.k_norm};
    for (int i = 0; i < 6; i++)
        if (optional_address(args[6 + i], vectors[i])) return NULL;
    int64_t s[5];
    if (sizes(args + 12, 5, s)) return NULL;
    const double eps = PyFloat_AsDouble(args[17]), scale = PyFloat_AsDouble(args[18]);
    if (PyErr_Occurred()) return NULL;
    layer.hidden = s[0];
    layer.heads = s[1];
    layer.kv_heads = s[2];
    layer.head_dim = s[3];
    layer.inner = s[4];
    layer.eps = (float)eps;
    layer.scale = (float)scale;
    const int64_t qkv = (layer.heads + 2 * layer.kv_heads) * layer.head_dim;
    if (layer.input_norm == NULL || layer.post_norm == NULL ||
        (layer.q_norm == NULL) != (layer.k_norm == NULL) || layer.kv_heads < 1 ||
        layer.heads % layer.kv_heads || layer.head_dim % 2 || layer.qkv.rows != qkv ||
        layer.o.rows != layer.hidden ||
        (routed ? layer.experts->hidden != layer.hidden
                : layer.gate_up.rows != 2 * layer.inner || layer.down.rows != layer.hidden)) {
        PyErr_SetString(PyExc_ValueError, "a layer whose shapes do not agree");
        return NULL;
    }
    return PyBytes_FromStringAndSize((const char *)&layer, sizeof layer);
}

/* dense_decode(layer, hidden, cos, sin, chosen, rows, threads, then per row: keys, values,
                position, capacity); hidden [rows, hidden] updated in place; chosen: int32
                [rows, top_k] for a layer with experts, else 0 */
static PyObject *dense_decode(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n < 7 || (n - 7) % 4 != 0 || !PyBytes_Check(args[0]) ||
        PyBytes_GET_SIZE(args[0]) != (Py_ssize_t)sizeof(SwarmDenseLayer)) {
        PyErr_SetString(PyExc_TypeError,
                        "dense_decode takes a dense_layer() and 7 + 4 per row arguments");
        return NULL;
    }
    const SwarmDenseLayer *layer = (const SwarmDenseLayer *)PyBytes_AS_STRING(args[0]);
    void *p[3];
    int64_t s[2];
    int32_t *chosen = PyLong_AsVoidPtr(args[4]);
    if (addresses(args + 1, 3, p) || (chosen == NULL && PyErr_Occurred()) ||
        sizes(args + 5, 2, s))
        return NULL;
    if (s[0] != (n - 7) / 4 || (layer->experts != NULL && chosen == NULL)) {
        PyErr_SetString(PyExc_ValueError, "one cache per row, and where experts route, chosen");
        return NULL;
    }
    SwarmDecodeCache *caches = read_caches(args + 7, s[0]);
    if (caches == NULL) return NULL;
    int status;
    Py_BEGIN_ALLOW_THREADS status =
        swarm_dense_decode(layer, p[0], p[1], p[2], caches, s[0], chosen, (int)s[1]);
    Py_END_ALLOW_THREADS PyMem_Free(caches);
    if (status == -1) return PyErr_NoMemory();
    if (status != 0) {
        PyErr_SetString(PyExc_ValueError, "a layer matrix the products do not run");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* silu_mul(gate_up, h, rows, inner): h [rows, inner] = silu(gate) * up */
static PyObject *silu_mul(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *p[2];
    int64_t s[2];
    if (count("silu_mul", n, 4) || addresses(args, 2, p) || sizes(args + 2, 2, s)) return NULL;
    swarm_silu_mul(p[0], p[1], s[0], s[1]);
    Py_RETURN_NONE;
}

/* use_wide(want) -> whether the products now run their AVX-512 VNNI rows */
static PyObject *use_wide(PyObject *self, PyObject *want) {
    const int truth = PyObject_IsTrue(want);
    if (truth < 0) return NULL;
    return PyBool_FromLong(swarm_use_wide(truth));
}

/* wide() -> whether the products run their AVX-512 VNNI rows */
static PyObject *wide(PyObject *self, PyObject *unused) { return PyBool_FromLong(swarm_wide()); }

static PyMethodDef methods[] = {
    {"use_wide", (PyCFunction)use_wide, METH_O, NULL},
    {"wide", (PyCFunction)wide, METH_NOARGS, NULL},
    {"q4_matmul", (PyCFunction)(void (*)(void))q4_matmul, METH_FASTCALL, NULL},
    {"i8_matmul", (PyCFunction)(void (*)(void))i8_matmul, METH_FASTCALL, NULL},
    {"block_matmul", (PyCFunction)(void (*)(void))block_matmul, METH_FASTCALL, NULL},
    {"block_types", (PyCFunction)block_types, METH_NOARGS, NULL},
    {"rms_norm", (PyCFunction)(void (*)(void))rms_norm, METH_FASTCALL, NULL},
    {"rotate", (PyCFunction)(void (*)(void))rotate, METH_FASTCALL, NULL},
    {"decode_attention", (PyCFunction)(void (*)(void))decode_attention, METH_FASTCALL, NULL},
    {"matrix", (PyCFunction)(void (*)(void))matrix, METH_FASTCALL, NULL},
    {"expert", (PyCFunction)(void (*)(void))expert, METH_FASTCALL, NULL},
    {"expert_layer", (PyCFunction)(void (*)(void))expert_layer, METH_FASTCALL, NULL},
    {"routed_experts", (PyCFunction)(void (*)(void))routed_experts, METH_FASTCALL, NULL},
    {"dense_layer", (PyCFunction)(void (*)(void))dense_layer, METH_FASTCALL, NULL},
    {"dense_decode", (PyCFunction)(void (*)(void))dense_decode, METH_FASTCALL, NULL},
    {"silu_mul", (PyCFunction)(void (*)(void))silu_mul, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels", NULL, -1, methods};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
