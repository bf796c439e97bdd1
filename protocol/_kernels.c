/* Fused int-b quantize + bit-pack and unpack + dequantize, one pass over the tensor.
 *
 * The bytes and values are exactly those of protocol/codecs/dense.py's numpy path (the fallback
 * when this module is not built): the same float operations in the same order (built with
 * -ffp-contract=off, never -ffast-math), the same counter-based dither, the same LSB-first bit
 * stream as protocol/bitpack.py. tests/test_kernels.py compares the two byte for byte.
 *
 * Codes are packed in records of 8 values, which are exactly `bits` bytes; with `bits` a
 * compile-time constant in each specialisation the record is straight-line shifts. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the bit stream is assembled in little-endian words"
#endif

#define CHUNK 4096 /* values quantized into a local buffer before packing: stays in L1 */


/* The hot loops are built twice on x86-64 (AVX2 and the baseline) and the loader picks one: the
   same operations, only wider, so the bytes do not depend on the machine. AVX-512 (x86-64-v4)
   also converts doubles to integers in vectors, which the b > 16 path needs. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define HOT __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HOT __attribute__((target_clones("avx2", "default")))
#else
#define HOT
#endif

/* Round half to even for 0 <= y < 2^23 (float) or 2^52 (double), as rint in the default mode:
   adding the magic constant leaves no fraction bits. Negative y (a rounding below 0) gives at
   most -0.5, which the clip that follows turns into 0, as it does rint's -0. */
static inline float rint_pos_f(float y) { return (y + 0x1p23f) - 0x1p23f; }
static inline double rint_pos_d(double y) { return (y + 0x1p52) - 0x1p52; }

static inline double u32_to_d(uint32_t c) { /* exact, and vectorises */
    const uint64_t bits = 0x4330000000000000ULL | (uint64_t)c;
    double d;
    memcpy(&d, &bits, 8);
    return d - 0x1p52;
}

/* An integral 0 <= f < 2^32 as uint32: f + 2^52 is exact and its low 32 mantissa bits are f. Plain
   integer ops, so it vectorises without AVX-512 (which alone converts doubles to 64-bit integers). */
static inline uint32_t d_to_u32(double f) {
    const double shifted = f + 0x1p52;
    uint64_t bits;
    memcpy(&bits, &shifted, 8);
    return (uint32_t)bits;
}

static inline uint32_t mix32(uint32_t x) { /* lowbias32 (C. Wellons): a bijective integer hash */
    x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16;
    return x;
}

/* ---- packing: one function per bit-length ------------------------------------------------ */
#define PACK_RECORD(B, c, o) do {                                                  \
        if ((B) <= 8) { /* the record fits one 64-bit word */                      \
            uint64_t w = 0;                                                        \
            for (int j = 0; j < 8; j++) w |= (uint64_t)(c)[j] << (j * (B));        \
            memcpy((o), &w, (B));                                                  \
        } else { /* a 64-bit accumulator flushed 32 bits at a time: with B constant and  \
                    the loop unrolled, every shift and flush point is a constant */        \
            uint64_t acc = 0;                                                      \
            int nb = 0;                                                            \
            uint8_t *p = (o);                                                      \
            for (int j = 0; j < 8; j++) {                                          \
                acc |= (uint64_t)(c)[j] << nb;                                     \
                nb += (B);                                                         \
                if (nb >= 32) {                                                    \
                    const uint32_t w = (uint32_t)acc;                              \
                    memcpy(p, &w, 4);                                              \
                    p += 4;                                                        \
                    acc >>= 32;                                                    \
                    nb -= 32;                                                      \
                }                                                                  \
            }                                                                      \
            memcpy(p, &acc, nb >> 3); /* 8 values end on a byte */                 \
        }                                                                          \
    } while (0)

#define UNPACK_RECORD(B, in, c) do {                                               \
        if ((B) <= 8) {                                                            \
            uint64_t w = 0;                                                        \
            memcpy(&w, (in), (B));                                                 \
            for (int j = 0; j < 8; j++) (c)[j] = (uint32_t)(w >> (j * (B))) & ((1u << ((B) & 31)) - 1u); \
        } else {                                                                   \
            uint64_t w[5] = {0, 0, 0, 0, 0};                                       \
            memcpy(w, (in), (B));                                                  \
            const uint64_t mask = (((uint64_t)1) << (B)) - 1;                      \
            for (int j = 0; j < 8; j++) {                                          \
                const int off = j * (B), at = off >> 6, sh = off & 63;             \
                uint64_t v = w[at] >> sh;                                          \
                if (sh + (B) > 64) v |= w[at + 1] << (64 - sh);                    \
                (c)[j] = (uint32_t)(v & mask);                                     \
            }                                                                      \
        }                                                                          \
    } while (0)

#define DEFINE_PACKERS(B)                                                          \
    HOT static void pack_##B(const uint32_t *c, size_t records, uint8_t *o) {     \
        if ((B) == 8 || (B) == 16 || (B) == 32) { /* byte-aligned: narrowing stores */ \
            for (size_t t = 0; t < 8 * records; t++) {                             \
                if ((B) == 8) o[t] = (uint8_t)c[t];                                \
                else if ((B) == 16) { uint16_t v = (uint16_t)c[t]; memcpy(o + 2 * t, &v, 2); } \
                else memcpy(o + 4 * t, c + t, 4);                                  \
            }                                                                      \
            return;                                                                \
        }                                                                          \
        for (size_t r = 0; r < records; r++) PACK_RECORD(B, c + 8 * r, o + (B) * r); \
    }                                                                              \
    HOT static void unpack_##B(const uint8_t *in, size_t records, uint32_t *c) {  \
        if ((B) == 8 || (B) == 16 || (B) == 32) {                                  \
            for (size_t t = 0; t < 8 * records; t++) {                             \
                if ((B) == 8) c[t] = in[t];                                        \
                else if ((B) == 16) { uint16_t v; memcpy(&v, in + 2 * t, 2); c[t] = v; } \
                else memcpy(c + t, in + 4 * t, 4);                                 \
            }                                                                      \
            return;                                                                \
        }                                                                          \
        size_t r = 0;                                                              \
        if ((B) < 8) /* one 8-byte load per record while the next record covers the overread */ \
            for (; r + 1 < records; r++) {                                         \
                uint64_t w;                                                        \
                memcpy(&w, in + (B) * r, 8);                                       \
                for (int j = 0; j < 8; j++) c[8 * r + j] = (uint32_t)(w >> (j * (B))) & ((1u << ((B) & 31)) - 1u); \
            }                                                                      \
        else /* one unaligned 8-byte load per value, at its first byte */          \
            for (; r + 1 < records; r++) {                                         \
                const uint8_t *rec = in + (B) * r;                                 \
                for (int j = 0; j < 8; j++) {                                      \
                    uint64_t w;                                                    \
                    memcpy(&w, rec + ((j * (B)) >> 3), 8);                         \
                    c[8 * r + j] = (uint32_t)((w >> ((j * (B)) & 7)) & ((((uint64_t)1) << (B)) - 1)); \
                }                                                                  \
            }                                                                      \
        for (; r < records; r++) UNPACK_RECORD(B, in + (B) * r, c + 8 * r);        \
    }

DEFINE_PACKERS(2) DEFINE_PACKERS(3) DEFINE_PACKERS(4) DEFINE_PACKERS(5) DEFINE_PACKERS(6)
DEFINE_PACKERS(7) DEFINE_PACKERS(8) DEFINE_PACKERS(9) DEFINE_PACKERS(10) DEFINE_PACKERS(11)
DEFINE_PACKERS(12) DEFINE_PACKERS(13) DEFINE_PACKERS(14) DEFINE_PACKERS(15) DEFINE_PACKERS(16)
DEFINE_PACKERS(17) DEFINE_PACKERS(18) DEFINE_PACKERS(19) DEFINE_PACKERS(20) DEFINE_PACKERS(21)
DEFINE_PACKERS(22) DEFINE_PACKERS(23) DEFINE_PACKERS(24) DEFINE_PACKERS(25) DEFINE_PACKERS(26)
DEFINE_PACKERS(27) DEFINE_PACKERS(28) DEFINE_PACKERS(29) DEFINE_PACKERS(30) DEFINE_PACKERS(31)
DEFINE_PACKERS(32)

typedef void (*pack_fn)(const uint32_t *, size_t, uint8_t *);
typedef void (*unpack_fn)(const uint8_t *, size_t, uint32_t *);
#define P(B) pack_##B
#define U(B) unpack_##B
static const pack_fn PACKERS[33] = {0, 0, P(2), P(3), P(4), P(5), P(6), P(7), P(8), P(9), P(10), P(11), P(12),
    P(13), P(14), P(15), P(16), P(17), P(18), P(19), P(20), P(21), P(22), P(23), P(24), P(25), P(26), P(27),
    P(28), P(29), P(30), P(31), P(32)};
static const unpack_fn UNPACKERS[33] = {0, 0, U(2), U(3), U(4), U(5), U(6), U(7), U(8), U(9), U(10), U(11), U(12),
    U(13), U(14), U(15), U(16), U(17), U(18), U(19), U(20), U(21), U(22), U(23), U(24), U(25), U(26), U(27),
    U(28), U(29), U(30), U(31), U(32)};

/* ---- quantization of values [start, end) into codes -------------------------------------- */
/* float32 arithmetic for b <= 16, float64 beyond (dense.py's _work_dtype) */
HOT static void quantize_f32(const float *x, size_t start, size_t end, size_t slice_len, const float *s,
                             float qmax, int stochastic, uint32_t key, uint32_t *codes) {
    const float top = 2.0f * qmax;
    size_t i = start;
    while (i < end) {
        const size_t k = i / slice_len;
        const size_t stop = ((k + 1) * slice_len < end) ? (k + 1) * slice_len : end;
        const float sk = s[k];
        uint32_t *c = codes + (i - start);
        const float *xi = x + i;
        const size_t m = stop - i;
        const uint32_t base = (uint32_t)i + key;
        /* codes stay below 2^16 here, so the signed conversion (one vector instruction) is exact;
           the branch on `stochastic` is hoisted out of the loop by the compiler */
        for (size_t t = 0; t < m; t++) {
            float y = xi[t] * sk;
            y = y + qmax;
            if (stochastic) y = y + (float)(int32_t)(mix32(base + (uint32_t)t) >> 8) * 0x1p-24f;
            else y = rint_pos_f(y);
            y = y < 0.0f ? 0.0f : y;
            y = y > top ? top : y;
            c[t] = (uint32_t)(int32_t)y;
        }
        i = stop;
    }
}

HOT static void quantize_f64(const float *x, size_t start, size_t end, size_t slice_len, const double *s,
                             double qmax, int stochastic, uint32_t key, uint32_t *codes) {
    const double top = 2.0 * qmax;
    size_t i = start;
    while (i < end) {
        const size_t k = i / slice_len;
        const size_t stop = ((k + 1) * slice_len < end) ? (k + 1) * slice_len : end;
        const double sk = s[k];
        uint32_t *c = codes + (i - start);
        const float *xi = x + i;
        const size_t m = stop - i;
        const uint32_t base = (uint32_t)i + key;
        for (size_t t = 0; t < m; t++) {
            double y = (double)xi[t] * sk;
            y = y + qmax;
            if (stochastic) y = y + (double)((float)(int32_t)(mix32(base + (uint32_t)t) >> 8) * 0x1p-24f);
            else y = rint_pos_d(y);
            y = y < 0.0 ? 0.0 : y;
            y = y > top ? top : y;
            c[t] = d_to_u32(trunc(y));
        }
        i = stop;
    }
}

HOT static void dequant_f32(const uint32_t *c, size_t m, float q, float sk, float *out) {
    for (size_t t = 0; t < m; t++) out[t] = ((float)(int32_t)c[t] - q) * sk; /* codes < 2^16: exact */
}

HOT static void dequant_f64(const uint32_t *c, size_t m, double q, double sk, float *out) {
    for (size_t t = 0; t < m; t++) out[t] = (float)((u32_to_d(c[t]) - q) * sk);
}

/* max |x| per slice as the bit pattern of a non-negative float, whose integer order is the
   float's: one integer max reduction (it vectorises), exact, and inf or NaN read as >= inf. */
HOT static uint32_t absmax_bits(const uint32_t *bits, size_t m) {
    uint32_t top = 0;
    for (size_t t = 0; t < m; t++) {
        const uint32_t a = bits[t] & 0x7fffffffu;
        top = a > top ? a : top;
    }
    return top;
}

/* absmax(x: f32 buffer, out: f32 buffer with one entry per slice) */
static PyObject *absmax(PyObject *self, PyObject *args) {
    Py_buffer xb, ob;
    if (!PyArg_ParseTuple(args, "y*w*", &xb, &ob)) return NULL;
    PyObject *result = NULL;
    const size_t n = (size_t)xb.len / 4, slices = (size_t)ob.len / 4;
    if (slices == 0 || n % slices != 0) {
        PyErr_SetString(PyExc_ValueError, "absmax: sizes do not agree");
    } else {
        const size_t len = n / slices;
        Py_BEGIN_ALLOW_THREADS
        for (size_t k = 0; k < slices; k++) {
            const uint32_t top = absmax_bits((const uint32_t *)xb.buf + k * len, len);
            memcpy((float *)ob.buf + k, &top, 4);
        }
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&xb);
    PyBuffer_Release(&ob);
    return result;
}

/* bf16_encode(x: f32 buffer, out: u16 buffer): dense.py's Bf16.encode, round half to even,
   a NaN a quiet NaN */
HOT static void bf16_round(const uint32_t *bits, size_t n, uint16_t *out) {
    for (size_t t = 0; t < n; t++) {
        const uint32_t b = bits[t];
        const uint32_t rounded = (b + (0x7FFFu + ((b >> 16) & 1u))) >> 16;
        out[t] = (b & 0x7fffffffu) > 0x7f800000u ? (uint16_t)0x7FC0 : (uint16_t)rounded;
    }
}

static PyObject *bf16_encode(PyObject *self, PyObject *args) {
    Py_buffer xb, ob;
    if (!PyArg_ParseTuple(args, "y*w*", &xb, &ob)) return NULL;
    PyObject *result = NULL;
    if ((size_t)ob.len * 2 != (size_t)xb.len) {
        PyErr_SetString(PyExc_ValueError, "bf16_encode: sizes do not agree");
    } else {
        Py_BEGIN_ALLOW_THREADS
        bf16_round((const uint32_t *)xb.buf, (size_t)xb.len / 4, (uint16_t *)ob.buf);
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&xb);
    PyBuffer_Release(&ob);
    return result;
}

/* quantize_pack(x: f32 buffer, s: f32 (b <= 16) or f64 buffer per slice, bits, stochastic, key, out: u8 buffer) */
static PyObject *quantize_pack(PyObject *self, PyObject *args) {
    Py_buffer xb, sb, ob;
    int bits, stochastic;
    unsigned int key;
    if (!PyArg_ParseTuple(args, "y*y*iiIw*", &xb, &sb, &bits, &stochastic, &key, &ob)) return NULL;
    PyObject *result = NULL;
    const size_t n = (size_t)xb.len / 4;
    const size_t wide = bits > 16 ? 8 : 4;
    const size_t slices = (size_t)sb.len / wide;
    if (bits < 2 || bits > 32 || slices == 0 || n % slices != 0 || (size_t)ob.len != (n * bits + 7) / 8) {
        PyErr_SetString(PyExc_ValueError, "quantize_pack: sizes do not agree");
        goto done;
    }
    {
        const size_t slice_len = n / slices;
        const double qmax = (double)((1u << (bits - 1)) - 1u);
        uint32_t codes[CHUNK + 8];
        uint8_t *out = (uint8_t *)ob.buf;
        Py_BEGIN_ALLOW_THREADS
        for (size_t start = 0; start < n; start += CHUNK) {
            const size_t end = start + CHUNK < n ? start + CHUNK : n;
            if (bits > 16) quantize_f64((const float *)xb.buf, start, end, slice_len, (const double *)sb.buf, qmax, stochastic, key, codes);
            else quantize_f32((const float *)xb.buf, start, end, slice_len, (const float *)sb.buf, (float)qmax, stochastic, key, codes);
            const size_t count = end - start, full = count / 8;
            PACKERS[bits](codes, full, out + (start / 8) * bits);
            if (count % 8) { /* the last, partial record: only its own bytes */
                uint8_t tail[32];
                uint32_t last[8] = {0};
                memcpy(last, codes + 8 * full, (count % 8) * 4);
                PACKERS[bits](last, 1, tail);
                const size_t at = ((start / 8) + full) * bits;
                memcpy(out + at, tail, (n * bits + 7) / 8 - at);
            }
        }
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
done:
    PyBuffer_Release(&xb);
    PyBuffer_Release(&sb);
    PyBuffer_Release(&ob);
    return result;
}

/* unpack_dequantize(data: u8 buffer, bits, scales: f32 buffer per slice, out: f32 buffer) */
static PyObject *unpack_dequantize(PyObject *self, PyObject *args) {
    Py_buffer db, sb, ob;
    int bits;
    if (!PyArg_ParseTuple(args, "y*iy*w*", &db, &bits, &sb, &ob)) return NULL;
    PyObject *result = NULL;
    const size_t n = (size_t)ob.len / 4;
    const size_t slices = (size_t)sb.len / 4;
    if (bits < 2 || bits > 32 || slices == 0 || n % slices != 0 || (size_t)db.len != (n * bits + 7) / 8) {
        PyErr_SetString(PyExc_ValueError, "unpack_dequantize: sizes do not agree");
        goto done;
    }
    {
        const size_t slice_len = n / slices;
        const uint32_t qmax = (1u << (bits - 1)) - 1u;
        const float *scales = (const float *)sb.buf;
        const uint8_t *in = (const uint8_t *)db.buf;
        float *out = (float *)ob.buf;
        uint32_t codes[CHUNK + 8];
        Py_BEGIN_ALLOW_THREADS
        for (size_t start = 0; start < n; start += CHUNK) {
            const size_t end = start + CHUNK < n ? start + CHUNK : n;
            const size_t count = end - start, full = count / 8;
            UNPACKERS[bits](in + (start / 8) * bits, full, codes);
            if (count % 8) {
                uint8_t tail[32] = {0};
                const size_t at = ((start / 8) + full) * bits;
                memcpy(tail, in + at, (n * bits + 7) / 8 - at);
                UNPACKERS[bits](tail, 1, codes + 8 * full);
            }
            size_t i = start;
            while (i < end) {
                const size_t k = i / slice_len;
                const size_t stop = ((k + 1) * slice_len < end) ? (k + 1) * slice_len : end;
                if (bits > 16) dequant_f64(codes + (i - start), stop - i, (double)qmax, (double)scales[k], out + i);
                else dequant_f32(codes + (i - start), stop - i, (float)qmax, scales[k], out + i);
                i = stop;
            }
        }
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
done:
    PyBuffer_Release(&db);
    PyBuffer_Release(&sb);
    PyBuffer_Release(&ob);
    return result;
}

static PyMethodDef METHODS[] = {
    {"bf16_encode", bf16_encode, METH_VARARGS, "float32 to bfloat16, rounded to nearest even."},
    {"absmax", absmax, METH_VARARGS, "max |x| of each equal-length slice of float32 values."},
    {"quantize_pack", quantize_pack, METH_VARARGS, "Quantize float32 values to int-b codes and bit-pack them."},
    {"unpack_dequantize", unpack_dequantize, METH_VARARGS, "Unpack int-b codes and dequantize them to float32."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_kernels", "Fused codec kernels.", -1, METHODS};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&MODULE); }
