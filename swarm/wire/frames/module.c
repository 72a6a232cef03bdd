/* swarm.wire._frames: a decode step's frame sealed and opened in one call each.
 *
 * The frame is the one swarm/wire/frame.py describes, and these functions write and read the
 * same bytes as its Python path (tests/test_native_frames.py holds them to it, byte for byte).
 * They cover the common case only, a step or result frame with an uncompressed body in the
 * form swarm's encoder writes; for anything else they return None and the caller takes the
 * Python path, so every error a frame can raise still comes from one place. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

#include "sha256.h"

#define PRELUDE_BYTES 28
#define TAG_BYTES 32
#define VERSION 2

/* ------------------------------------------------------------------ writing msgpack */

struct out {
    uint8_t *p;   /* next byte */
    uint8_t *end; /* one past the buffer */
};

static int room(struct out *o, size_t n) { return (size_t)(o->end - o->p) >= n; }

static int put(struct out *o, const void *bytes, size_t n) {
    if (!room(o, n)) return 0;
    memcpy(o->p, bytes, n);
    o->p += n;
    return 1;
}

static int put_byte(struct out *o, uint8_t b) { return put(o, &b, 1); }

static int put_be(struct out *o, uint8_t type, uint64_t v, int bytes) {
    uint8_t buf[9];
    buf[0] = type;
    for (int i = 0; i < bytes; i++) buf[1 + i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
    return put(o, buf, 1 + (size_t)bytes);
}

static int put_uint(struct out *o, uint64_t v) {
    if (v < 128) return put_byte(o, (uint8_t)v);
    if (v < 256) return put_be(o, 0xcc, v, 1);
    if (v < 65536) return put_be(o, 0xcd, v, 2);
    if (v < 4294967296ULL) return put_be(o, 0xce, v, 4);
    return put_be(o, 0xcf, v, 8);
}

/* msgpack's shortest form of an integer, as msgpack-python packs a Python int */
static int put_int(struct out *o, PyObject *value) {
    if (!PyLong_CheckExact(value)) return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(value);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        return put_uint(o, u);
    }
    if (overflow < 0 || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    if (v >= 0) return put_uint(o, (uint64_t)v);
    if (v >= -32) return put_byte(o, (uint8_t)(int8_t)v);
    if (v >= -128) return put_be(o, 0xd0, (uint64_t)v, 1);
    if (v >= -32768) return put_be(o, 0xd1, (uint64_t)v, 2);
    if (v >= -2147483648LL) return put_be(o, 0xd2, (uint64_t)v, 4);
    return put_be(o, 0xd3, (uint64_t)v, 8);
}

static int put_str_bytes(struct out *o, const char *s, Py_ssize_t n) {
    if (n < 32) {
        if (!put_byte(o, (uint8_t)(0xa0 | n))) return 0;
    } else if (n < 256) {
        if (!put_be(o, 0xd9, (uint64_t)n, 1)) return 0;
    } else if (n < 65536) {
        if (!put_be(o, 0xda, (uint64_t)n, 2)) return 0;
    } else {
        return 0; /* longer than any id or session: the Python path */
    }
    return put(o, s, (size_t)n);
}

static int put_str(struct out *o, PyObject *value) {
    if (!PyUnicode_CheckExact(value)) return 0;
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(value, &n);
    if (s == NULL) {
        PyErr_Clear();
        return 0;
    }
    return put_str_bytes(o, s, n);
}

#define PUT_KEY(o, key) put_str_bytes((o), (key), (Py_ssize_t)(sizeof(key) - 1))

/* a float as msgpack-python packs a Python float (float 64); an int as an int */
static int put_number(struct out *o, PyObject *value) {
    if (PyFloat_CheckExact(value)) {
        double d = PyFloat_AS_DOUBLE(value);
        uint64_t bits;
        memcpy(&bits, &d, sizeof bits);
        return put_be(o, 0xcb, bits, 8);
    }
    return put_int(o, value);
}

static int put_container(struct out *o, int is_map, Py_ssize_t n) {
    if (n < 16) return put_byte(o, (uint8_t)((is_map ? 0x80 : 0x90) | n));
    if (n < 65536) return put_be(o, is_map ? 0xde : 0xdc, (uint64_t)n, 2);
    return 0;
}

/* ------------------------------------------------------------------ the timings */

static PyObject *timing_names[7]; /* HopTimes' fields in the order of their wire keys */
static const char *timing_keys[7] = {"id", "q", "c", "w", "d", "r", "s"};
static const char *timing_fields[7] = {"node", "queue", "compute", "wire",
                                       "dispatch", "resume", "send"};

static int put_timings(struct out *o, PyObject *timings) {
    if (!PyTuple_CheckExact(timings)) return 0;
    Py_ssize_t n = PyTuple_GET_SIZE(timings);
    if (!put_container(o, 0, n)) return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *timing = PyTuple_GET_ITEM(timings, i);
        if (!put_byte(o, 0x87)) return 0;
        for (int f = 0; f < 7; f++) {
            PyObject *value = PyObject_GetAttr(timing, timing_names[f]);
            if (value == NULL) {
                PyErr_Clear();
                return 0;
            }
            int ok = put_str_bytes(o, timing_keys[f], 1 + (f == 0)) &&
                     (f == 0 ? put_str(o, value) : put_number(o, value));
            Py_DECREF(value);
            if (!ok) return 0;
        }
    }
    return 1;
}

/* ------------------------------------------------------------------ sealing */

static int read_key_state(PyObject *object, struct hmac_key *key) {
    if (!PyBytes_CheckExact(object) || PyBytes_GET_SIZE(object) != (Py_ssize_t)sizeof *key) {
        PyErr_SetString(PyExc_TypeError, "a key state from _frames.key()");
        return 0;
    }
    memcpy(key, PyBytes_AS_STRING(object), sizeof *key);
    return 1;
}

static void put_le(uint8_t *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* A raw tensor's dtype name from its buffer's format: numpy's float32 and float16. */
static const char *raw_dtype(const Py_buffer *values) {
    const char *format = values->format;
    if (format == NULL) return NULL;
    if (format[0] == '<' || format[0] == '=' || format[0] == '@') format++;
    if (strcmp(format, "f") == 0 && values->itemsize == 4) return "float32";
    if (strcmp(format, "e") == 0 && values->itemsize == 2) return "float16";
    return NULL;
}

/* seal_step(key, type, sender, receiver, counter, session, step, position, route, entry,
 *           timings, verify, values) -> bytes | None
 * route and entry: their msgpack bytes (a step's), or None (a result's); timings: HopTimes;
 * values: the hidden state as a C-contiguous float32 or float16 array (Codec.RAW). */
static PyObject *seal_step(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 13) {
        PyErr_SetString(PyExc_TypeError, "seal_step takes 13 arguments");
        return NULL;
    }
    struct hmac_key key;
    if (!read_key_state(args[0], &key)) return NULL;
    long type = PyLong_AsLong(args[1]);
    unsigned long long counter = PyLong_AsUnsignedLongLong(args[4]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *sender = args[2], *receiver = args[3], *route = args[8], *entry = args[9];
    if (!PyBytes_CheckExact(sender) || !PyBytes_CheckExact(receiver) || type < 0 || type > 65535)
        Py_RETURN_NONE;
    Py_ssize_t sender_len = PyBytes_GET_SIZE(sender), receiver_len = PyBytes_GET_SIZE(receiver);
    if (sender_len < 1 || sender_len > 255 || receiver_len > 255) Py_RETURN_NONE;
    if ((route == Py_None) != (entry == Py_None)) Py_RETURN_NONE;
    if (route != Py_None && (!PyBytes_CheckExact(route) || !PyBytes_CheckExact(entry)))
        Py_RETURN_NONE;
    int verify = PyObject_IsTrue(args[11]);
    if (verify < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    Py_buffer values;
    if (PyObject_GetBuffer(args[12], &values, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    const char *dtype = raw_dtype(&values);
    if (dtype == NULL || values.ndim < 1 || values.len == 0) { /* the Python path's cases */
        PyBuffer_Release(&values);
        Py_RETURN_NONE;
    }

    /* the header, {"m": fields, "t": [spec]}, into a buffer on the stack */
    uint8_t header_buf[4096];
    struct out h = {header_buf, header_buf + sizeof header_buf};
    int ok = put_byte(&h, 0x82) && PUT_KEY(&h, "m") &&
             put_container(&h, 1, (route != Py_None ? 6 : 4) + verify) &&
             PUT_KEY(&h, "session") && put_str(&h, args[5]) && PUT_KEY(&h, "step") &&
             put_int(&h, args[6]) && PUT_KEY(&h, "pos") && put_int(&h, args[7]);
    if (ok && route != Py_None) {
        ok = PUT_KEY(&h, "route") &&
             put(&h, PyBytes_AS_STRING(route), (size_t)PyBytes_GET_SIZE(route)) &&
             PUT_KEY(&h, "entry") &&
             put(&h, PyBytes_AS_STRING(entry), (size_t)PyBytes_GET_SIZE(entry));
    }
    ok = ok && PUT_KEY(&h, "timings") && put_timings(&h, args[10]);
    if (ok && verify) ok = PUT_KEY(&h, "verify") && put_byte(&h, 0xc3);
    ok = ok && PUT_KEY(&h, "t") && put_byte(&h, 0x91) && put_byte(&h, 0x84) &&
         PUT_KEY(&h, "dtype") && put_str_bytes(&h, dtype, (Py_ssize_t)strlen(dtype)) &&
         PUT_KEY(&h, "shape") && put_container(&h, 0, values.ndim);
    for (int i = 0; ok && i < values.ndim; i++) ok = put_uint(&h, (uint64_t)values.shape[i]);
    ok = ok && PUT_KEY(&h, "codec") && put_byte(&h, 0) && PUT_KEY(&h, "nbytes") &&
         put_uint(&h, (uint64_t)values.len);
    if (!ok) {
        PyErr_Clear();
        PyBuffer_Release(&values);
        Py_RETURN_NONE;
    }
    size_t header_len = (size_t)(h.p - header_buf);
    size_t body_len = header_len + (size_t)values.len;
    if (body_len > 0xffffffffu) {
        PyBuffer_Release(&values);
        Py_RETURN_NONE;
    }
    size_t signed_len = PRELUDE_BYTES + (size_t)sender_len + (size_t)receiver_len + body_len;
    PyObject *frame = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(signed_len + TAG_BYTES));
    if (frame == NULL) {
        PyBuffer_Release(&values);
        return NULL;
    }
    uint8_t *p = (uint8_t *)PyBytes_AS_STRING(frame);
    p[0] = 'S';
    p[1] = 'W';
    p[2] = VERSION;
    p[3] = 0; /* flags: the body goes as it is */
    put_le(p + 4, (uint64_t)type, 2);
    p[6] = (uint8_t)sender_len;
    p[7] = (uint8_t)receiver_len;
    put_le(p + 8, counter, 8);
    put_le(p + 16, header_len, 4);
    put_le(p + 20, body_len, 4);
    put_le(p + 24, body_len, 4);
    uint8_t *q = p + PRELUDE_BYTES;
    memcpy(q, PyBytes_AS_STRING(sender), (size_t)sender_len);
    q += sender_len;
    memcpy(q, PyBytes_AS_STRING(receiver), (size_t)receiver_len);
    q += receiver_len;
    memcpy(q, header_buf, header_len);
    q += header_len;
    memcpy(q, values.buf, (size_t)values.len);
    PyBuffer_Release(&values);
    hmac_sha256(&key, p, signed_len, p + signed_len);
    return frame;
}

/* ------------------------------------------------------------------ reading msgpack */

/* A reader over a frame's header. Every read returns 0 where the bytes are not what swarm's
 * encoder writes there: open_step then answers None and the Python path reads the frame. */
struct in {
    const uint8_t *p, *end;
    Py_ssize_t max_str, max_array, max_map; /* the unpacker's caps (WireLimits) */
};

static uint64_t get_be(const uint8_t *p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v = (v << 8) | p[i];
    return v;
}

static int take(struct in *r, size_t n, const uint8_t **at) {
    if ((size_t)(r->end - r->p) < n) return 0;
    *at = r->p;
    r->p += n;
    return 1;
}

/* a length-prefixed item's length, given its fix form's mask and base and its 8/16/32 codes */
static int read_len(struct in *r, uint8_t fix_base, uint8_t fix_mask, uint8_t code8,
                    uint8_t code16, uint8_t code32, Py_ssize_t *len) {
    const uint8_t *b;
    if (!take(r, 1, &b)) return 0;
    if ((*b & (uint8_t)~fix_mask) == fix_base) {
        *len = *b & fix_mask;
        return 1;
    }
    int bytes = *b == code8 && code8 ? 1 : *b == code16 ? 2 : *b == code32 ? 4 : 0;
    const uint8_t *v;
    if (!bytes || !take(r, (size_t)bytes, &v)) return 0;
    *len = (Py_ssize_t)get_be(v, bytes);
    return 1;
}

static int read_str(struct in *r, const char **s, Py_ssize_t *n) {
    const uint8_t *at;
    if (!read_len(r, 0xa0, 0x1f, 0xd9, 0xda, 0xdb, n) || *n > r->max_str) return 0;
    if (!take(r, (size_t)*n, &at)) return 0;
    *s = (const char *)at;
    return 1;
}

static int read_map(struct in *r, Py_ssize_t expected) {
    Py_ssize_t n;
    return read_len(r, 0x80, 0x0f, 0, 0xde, 0xdf, &n) && n <= r->max_map && n == expected;
}

static int read_array(struct in *r, Py_ssize_t *n) {
    return read_len(r, 0x90, 0x0f, 0, 0xdc, 0xdd, n) && *n <= r->max_array;
}

/* the next key, which must be `key` (swarm writes its fields in one order) */
static int read_key(struct in *r, const char *key) {
    const char *s;
    Py_ssize_t n;
    return read_str(r, &s, &n) && (size_t)n == strlen(key) && memcmp(s, key, (size_t)n) == 0;
}

/* a non-empty string as a str (the Fields.get_str of every id and the session) */
static PyObject *read_text(struct in *r) {
    const char *s;
    Py_ssize_t n;
    if (!read_str(r, &s, &n) || n == 0) return NULL;
    PyObject *text = PyUnicode_DecodeUTF8(s, n, NULL);
    if (text == NULL) PyErr_Clear();
    return text;
}

/* an integer in [0, 2**63 - 1], in any of msgpack's integer forms */
static int read_count(struct in *r, uint64_t *v) {
    const uint8_t *b, *x;
    if (!take(r, 1, &b)) return 0;
    if (*b < 0x80) {
        *v = *b;
        return 1;
    }
    int bytes = 0, is_signed = 0;
    switch (*b) {
        case 0xcc: bytes = 1; break;
        case 0xcd: bytes = 2; break;
        case 0xce: bytes = 4; break;
        case 0xcf: bytes = 8; break;
        case 0xd0: bytes = 1; is_signed = 1; break;
        case 0xd1: bytes = 2; is_signed = 1; break;
        case 0xd2: bytes = 4; is_signed = 1; break;
        case 0xd3: bytes = 8; is_signed = 1; break;
        default: return 0;
    }
    if (!take(r, (size_t)bytes, &x)) return 0;
    uint64_t u = get_be(x, bytes);
    if (is_signed && (x[0] & 0x80)) return 0; /* negative */
    if (u > 0x7fffffffffffffffULL) return 0;
    *v = u;
    return 1;
}

/* a finite float 64 >= 0: what a hop writes for each part of its timing */
static int read_part(struct in *r, double *d) {
    const uint8_t *b, *x;
    if (!take(r, 1, &b) || *b != 0xcb || !take(r, 8, &x)) return 0;
    uint64_t bits = get_be(x, 8);
    memcpy(d, &bits, sizeof *d);
    return *d >= 0.0 && *d < HUGE_VAL;
}

/* the route's bytes, checked to be an array of {id, addr, start, end} maps (the Python
 * side builds the hops from them once per route and keeps them) */
static PyObject *read_route(struct in *r) {
    const uint8_t *start = r->p;
    Py_ssize_t hops;
    if (!read_array(r, &hops) || hops < 1) return NULL;
    for (Py_ssize_t i = 0; i < hops; i++) {
        const char *s;
        Py_ssize_t n;
        uint64_t v;
        if (!read_map(r, 4) || !read_key(r, "id") || !read_str(r, &s, &n) ||
            !read_key(r, "addr") || !read_str(r, &s, &n) || !read_key(r, "start") ||
            !read_count(r, &v) || !read_key(r, "end") || !read_count(r, &v))
            return NULL;
    }
    return PyBytes_FromStringAndSize((const char *)start, r->p - start);
}

static const char *part_keys[6] = {"q", "c", "w", "d", "r", "s"};

static PyObject *read_timings(struct in *r) {
    Py_ssize_t count;
    if (!read_array(r, &count)) return NULL;
    PyObject *timings = PyTuple_New(count);
    if (timings == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *timing = PyTuple_New(7);
        if (timing == NULL) goto fail;
        PyTuple_SET_ITEM(timings, i, timing);
        PyObject *node;
        if (!read_map(r, 7) || !read_key(r, "id") || (node = read_text(r)) == NULL) goto fail;
        PyTuple_SET_ITEM(timing, 0, node);
        for (int f = 0; f < 6; f++) {
            double d;
            PyObject *part;
            if (!read_key(r, part_keys[f]) || !read_part(r, &d)) goto fail;
            if ((part = PyFloat_FromDouble(d)) == NULL) goto fail;
            PyTuple_SET_ITEM(timing, 1 + f, part);
        }
    }
    return timings;
fail:
    Py_DECREF(timings);
    return NULL;
}

/* ------------------------------------------------------------------ opening */

#define STEP_TYPE 3   /* MessageType.STEP */
#define RESULT_TYPE 4 /* MessageType.RESULT */

static uint64_t get_le(const uint8_t *p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* open_step(data, key, max_frame, max_header, max_body, max_str, max_array, max_map,
 *           max_elements[, into])
 *   -> (type, sender, receiver, counter, session, step, position, verify, route, entry_id,
 *       entry_address, timings, dtype, shape, values) | None
 * A step or result frame whose envelope, tag and header are as swarm seals them, its one
 * tensor a raw float32 or float16 [1, rows, width]: route is the route's msgpack bytes and
 * entry_* the entry's fields (None for a result), timings tuples of (node, q, c, w, d, r, s),
 * values a writable copy of the tensor's bytes: `into` itself where it is a writable
 * contiguous buffer of exactly that many bytes (they are copied into it), else a new
 * bytearray. None for anything else, the tag included:
 * the Python path then reads the frame and says what is wrong with it. Nothing is recorded
 * here (the replay window and the receiver's checks are the caller's). */
static PyObject *open_step(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 9 && n != 10) {
        PyErr_SetString(PyExc_TypeError, "open_step takes 9 or 10 arguments");
        return NULL;
    }
    PyObject *into = n == 10 ? args[9] : Py_None;
    struct hmac_key key;
    if (!read_key_state(args[1], &key)) return NULL;
    Py_ssize_t caps[7];
    for (int i = 0; i < 7; i++) {
        caps[i] = PyLong_AsSsize_t(args[2 + i]);
        if (caps[i] == -1 && PyErr_Occurred()) return NULL;
    }
    Py_buffer frame;
    if (PyObject_GetBuffer(args[0], &frame, PyBUF_SIMPLE) != 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *out = NULL, *sender = NULL, *receiver = NULL, *session = NULL, *route = NULL;
    PyObject *entry_id = NULL, *entry_address = NULL, *timings = NULL, *shape = NULL;
    PyObject *values = NULL;
    const uint8_t *p = frame.buf;
    size_t size = (size_t)frame.len;
    if (size > (size_t)caps[0] || size < PRELUDE_BYTES + TAG_BYTES) goto none;
    if (p[0] != 'S' || p[1] != 'W' || p[2] != VERSION || p[3] != 0) goto none;
    uint64_t type = get_le(p + 4, 2), counter = get_le(p + 8, 8);
    size_t sender_len = p[6], receiver_len = p[7];
    size_t header_len = get_le(p + 16, 4), body_len = get_le(p + 20, 4);
    size_t raw_len = get_le(p + 24, 4);
    size_t ids_end = PRELUDE_BYTES + sender_len + receiver_len;
    if ((type != STEP_TYPE && type != RESULT_TYPE) || sender_len == 0) goto none;
    if (ids_end + body_len + TAG_BYTES != size || body_len != raw_len) goto none;
    if (raw_len > (size_t)caps[2] || header_len > (size_t)caps[1] || header_len == 0 ||
        header_len > raw_len)
        goto none;
    uint8_t tag[32], differ = 0;
    hmac_sha256(&key, p, size - TAG_BYTES, tag);
    for (int i = 0; i < TAG_BYTES; i++) differ |= (uint8_t)(tag[i] ^ p[size - TAG_BYTES + i]);
    if (differ) goto none;
    sender = PyUnicode_DecodeUTF8((const char *)p + PRELUDE_BYTES, (Py_ssize_t)sender_len, NULL);
    receiver = PyUnicode_DecodeUTF8((const char *)p + PRELUDE_BYTES + sender_len,
                                    (Py_ssize_t)receiver_len, NULL);
    if (sender == NULL || receiver == NULL) goto none;

    struct in r = {p + ids_end, p + ids_end + header_len, caps[3], caps[4], caps[5]};
    int is_step = type == STEP_TYPE;
    uint64_t step, position;
    int verify = 0;
    if (!read_map(&r, 2) || !read_key(&r, "m")) goto none;
    /* the fields' count says whether "verify" (true) closes them */
    const uint8_t *fields_at = r.p;
    if (!take(&r, 1, &fields_at)) goto none;
    Py_ssize_t fields = (*fields_at & 0xf0) == 0x80 ? *fields_at & 0x0f : -1;
    Py_ssize_t plain = is_step ? 6 : 4;
    if ((fields != plain && fields != plain + 1) || fields > r.max_map) goto none;
    if (!read_key(&r, "session") || (session = read_text(&r)) == NULL) goto none;
    if (!read_key(&r, "step") || !read_count(&r, &step)) goto none;
    if (!read_key(&r, "pos") || !read_count(&r, &position)) goto none;
    if (is_step) {
        if (!read_key(&r, "route") || (route = read_route(&r)) == NULL) goto none;
        if (!read_key(&r, "entry") || !read_map(&r, 2) || !read_key(&r, "id") ||
            (entry_id = read_text(&r)) == NULL || !read_key(&r, "addr") ||
            (entry_address = read_text(&r)) == NULL)
            goto none;
    }
    if (!read_key(&r, "timings") || (timings = read_timings(&r)) == NULL) goto none;
    if (fields == plain + 1) {
        const uint8_t *b;
        if (!read_key(&r, "verify") || !take(&r, 1, &b) || (*b != 0xc2 && *b != 0xc3))
            goto none;
        verify = *b == 0xc3;
    }
    /* "t": one raw tensor, [1, rows >= 1, width] */
    Py_ssize_t tensors, rank;
    const char *dtype;
    Py_ssize_t dtype_len;
    uint64_t dims[3], codec, nbytes;
    if (!read_key(&r, "t") || !read_array(&r, &tensors) || tensors != 1 || !read_map(&r, 4) ||
        !read_key(&r, "dtype") || !read_str(&r, &dtype, &dtype_len) || !read_key(&r, "shape") ||
        !read_array(&r, &rank) || rank != 3)
        goto none;
    for (int i = 0; i < 3; i++)
        if (!read_count(&r, &dims[i])) goto none;
    if (!read_key(&r, "codec") || !read_count(&r, &codec) || codec != 0 ||
        !read_key(&r, "nbytes") || !read_count(&r, &nbytes) || r.p != r.end)
        goto none;
    size_t itemsize = dtype_len == 7 && memcmp(dtype, "float32", 7) == 0   ? 4
                      : dtype_len == 7 && memcmp(dtype, "float16", 7) == 0 ? 2
                                                                           : 0;
    uint64_t max_elements = (uint64_t)caps[6];
    if (!itemsize || dims[0] != 1 || dims[1] < 1 || dims[2] < 1 || dims[1] > max_elements ||
        dims[2] > max_elements || dims[1] > max_elements / dims[2])
        goto none;
    if (dims[1] * dims[2] * itemsize != nbytes || nbytes != raw_len - header_len) goto none;
    shape = Py_BuildValue("(KKK)", (unsigned long long)dims[0], (unsigned long long)dims[1],
                          (unsigned long long)dims[2]);
    if (into != Py_None) {
        Py_buffer spare;
        if (PyObject_GetBuffer(into, &spare, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) == 0) {
            if ((uint64_t)spare.len == nbytes) {
                memcpy(spare.buf, r.end, (size_t)nbytes);
                Py_INCREF(into);
                values = into;
            }
            PyBuffer_Release(&spare);
        } else {
            PyErr_Clear();
        }
    }
    if (values == NULL)
        values = PyByteArray_FromStringAndSize((const char *)r.end, (Py_ssize_t)nbytes);
    if (shape == NULL || values == NULL) goto none;
    out = Py_BuildValue("(KNNKNKKOOOONs#NN)", (unsigned long long)type, sender, receiver,
                        (unsigned long long)counter, session, (unsigned long long)step,
                        (unsigned long long)position, verify ? Py_True : Py_False,
                        route ? route : Py_None, entry_id ? entry_id : Py_None,
                        entry_address ? entry_address : Py_None, timings, dtype, dtype_len,
                        shape, values);
    Py_XDECREF(route);
    Py_XDECREF(entry_id);
    Py_XDECREF(entry_address);
    PyBuffer_Release(&frame);
    return out; /* the N arguments' references went to the tuple (or were dropped with it) */
none:
    Py_XDECREF(sender);
    Py_XDECREF(receiver);
    Py_XDECREF(session);
    Py_XDECREF(route);
    Py_XDECREF(entry_id);
    Py_XDECREF(entry_address);
    Py_XDECREF(timings);
    Py_XDECREF(shape);
    Py_XDECREF(values);
    PyErr_Clear();
    PyBuffer_Release(&frame);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ keys and tags */

static PyObject *key(PyObject *self, PyObject *arg) {
    Py_buffer raw;
    if (PyObject_GetBuffer(arg, &raw, PyBUF_SIMPLE) != 0) return NULL;
    struct hmac_key state;
    hmac_key(raw.buf, (size_t)raw.len, &state);
    PyBuffer_Release(&raw);
    return PyBytes_FromStringAndSize((const char *)&state, sizeof state);
}

/* tag(key, data) -> the HMAC-SHA256 of data */
static PyObject *tag(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "tag takes a key state and the data");
        return NULL;
    }
    struct hmac_key state;
    if (!read_key_state(args[0], &state)) return NULL;
    Py_buffer data;
    if (PyObject_GetBuffer(args[1], &data, PyBUF_SIMPLE) != 0) return NULL;
    uint8_t out[32];
    hmac_sha256(&state, data.buf, (size_t)data.len, out);
    PyBuffer_Release(&data);
    return PyBytes_FromStringAndSize((const char *)out, sizeof out);
}

static PyObject *sha_extensions(PyObject *self, PyObject *unused) {
    return PyBool_FromLong(sha256_uses_extensions());
}

static PyObject *use_sha_extensions(PyObject *self, PyObject *wanted) {
    int want = PyObject_IsTrue(wanted);
    if (want < 0) return NULL;
    return PyBool_FromLong(sha256_use_extensions(want));
}

static PyMethodDef methods[] = {
    {"key", key, METH_O, "A key's HMAC-SHA256 state, for seal_step and tag."},
    {"tag", (PyCFunction)(void (*)(void))tag, METH_FASTCALL, "HMAC-SHA256 of a buffer."},
    {"seal_step", (PyCFunction)(void (*)(void))seal_step, METH_FASTCALL,
     "A step or result frame, or None where the Python path must seal it."},
    {"open_step", (PyCFunction)(void (*)(void))open_step, METH_FASTCALL,
     "A step or result frame's parts, or None where the Python path must open it."},
    {"sha_extensions", sha_extensions, METH_NOARGS, "Whether the CPU's SHA instructions run."},
    {"use_sha_extensions", use_sha_extensions, METH_O,
     "Run SHA-256 on the CPU's SHA instructions where it has them (True) or in plain C."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_frames", NULL, -1, methods};

PyMODINIT_FUNC PyInit__frames(void) {
    for (int f = 0; f < 7; f++) {
        timing_names[f] = PyUnicode_InternFromString(timing_fields[f]);
        if (timing_names[f] == NULL) return NULL;
    }
    return PyModule_Create(&module);
}
