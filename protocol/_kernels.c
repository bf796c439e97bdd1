/* Fused int-b quantize + bit-pack and unpack + dequantize, one pass over the tensor.
 *
 * The bytes and values are exactly those of protocol/codecs/dense.py's numpy path (the fallback
 * when this module is not built): the same float operations in the same order (built with
 * -ffp-contract=off, never -ffast-math), the same counter-based dither, the same LSB-first bit
 * stream as protocol/bitpack.py. tests/test_kernels.py compares the two byte for byte.
 *
 * Codes are packed in records of 8 values, which are exactly `bits` bytes; with `bits` a
 * compile-time constant in each specialisation the record is straight-line shifts and masks.
 * Needs a compiler with unsigned __int128 (GCC, Clang on 64-bit); elsewhere the build of this
 * optional module fails and the numpy path is used. */
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
/* Codes are held in the narrowest word that fits them (8 bits for b <= 8, 16 for b <= 16, else 32),
   so a record of 8 codes is one, two or four 64-bit words. Packing squeezes each word's fields
   together by halves (SWAR: pairs of fields, then pairs of pairs), a few shifts and masks per
   word instead of one shift and OR per code; unpacking spreads them back the same way. A record
   is B bytes; it is stored (and read) as whole 8-, 16- or 32-byte words reaching into the records
   after it (which are written later), except where fewer bytes than that follow it in the range:
   there exactly, so nothing outside the range is touched. */
typedef unsigned __int128 u128;
#define LOW(n) ((n) >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << (n)) - 1))

/* SQUEEZE: in each pair of lanes (a 2*lane-bit field) whose halves hold f-bit values (2f <= the
   pair), the upper value moves down to sit right above the lower one. SPREAD undoes it. */
#define SQUEEZE(v, lane, f) (((v) & REP_##lane(LOW(lane))) | (((v) & ~REP_##lane(LOW(lane))) >> (((lane) - (f)) & 63)))
#define SPREAD(v, lane, f) (((v) & REP_##lane(LOW(f))) | (((v) << (((lane) - (f)) & 63)) & (REP_##lane(LOW(f)) << (lane))))
#define REP_8(m) ((uint64_t)(m) * 0x0001000100010001ULL)
#define REP_16(m) ((uint64_t)(m) * 0x0000000100000001ULL)
#define REP_32(m) ((uint64_t)(m))

/* two copies of constant length, not one of a chosen length (which is a call to memcpy) */
#define STORE(o, w, n_exact, n_word, exact) do { if (exact) memcpy((o), (w), (n_exact)); else memcpy((o), (w), (n_word)); } while (0)

static inline uint64_t load64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline void store64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* Each packer first squeezes the codes' 64-bit words in place (a loop over words that vectorises),
   then joins each record's words into its B bytes; each unpacker splits the bytes into words,
   then spreads them in place. */
#define DEFINE_PACKERS(B)                                                          \
    HOT static void pack_##B(uint8_t *c, size_t records, uint8_t *o) {            \
        if ((B) == 8 || (B) == 16 || (B) == 32) { /* the codes' words are the stream */ \
            memcpy(o, c, (size_t)(B) * records);                                   \
            return;                                                                \
        }                                                                          \
        const size_t words = records * ((B) < 8 ? 1 : (B) < 16 ? 2 : 4);           \
        for (size_t t = 0; t < words; t++) {                                       \
            uint64_t v = load64(c + 8 * t);                                        \
            if ((B) < 8) v = SQUEEZE(SQUEEZE(SQUEEZE(v, 8, (B)), 16, 2 * (B)), 32, 4 * (B)); \
            else if ((B) < 16) v = SQUEEZE(SQUEEZE(v, 16, (B)), 32, 2 * (B));      \
            else v = SQUEEZE(v, 32, (B));                                          \
            store64(c + 8 * t, v);                                                 \
        }                                                                          \
        for (size_t r = 0; r < records; r++) {                                     \
            const size_t after = (size_t)(B) * (records - 1 - r); /* bytes of the range after it */ \
            uint8_t *out = o + (size_t)(B) * r;                                    \
            if ((B) < 8) {                                                         \
                const uint64_t v = load64(c + 8 * r);                              \
                STORE(out, &v, (B), 8, after + (B) < 8);                           \
            } else if ((B) < 16) {                                                 \
                const u128 rec = (u128)load64(c + 16 * r) | ((u128)load64(c + 16 * r + 8) << ((4 * (B)) & 127)); \
                STORE(out, &rec, (B), 16, after + (B) < 16);                       \
            } else { /* two halves of two pairs (4B bits each); an odd B's halves share a byte */ \
                const u128 q0 = (u128)load64(c + 32 * r) | ((u128)load64(c + 32 * r + 8) << ((2 * (B)) & 127)); \
                const u128 q1 = (u128)load64(c + 32 * r + 16) | ((u128)load64(c + 32 * r + 24) << ((2 * (B)) & 127)); \
                const u128 second = ((B) & 1) ? (q0 >> ((4 * (B) - 4) & 127)) | (q1 << 4) : q1; \
                STORE(out, &q0, (size_t)(B) / 2, 16, after < 16);                  \
                STORE(out + (B) / 2, &second, (size_t)((B) + 1) / 2, 16, after < 16); \
            }                                                                      \
        }                                                                          \
    }                                                                              \
    HOT static void unpack_##B(const uint8_t *in, size_t records, uint8_t *c) {   \
        if ((B) == 8 || (B) == 16 || (B) == 32) {                                  \
            memcpy(c, in, (size_t)(B) * records);                                  \
            return;                                                                \
        }                                                                          \
        for (size_t r = 0; r < records; r++) {                                     \
            const size_t after = (size_t)(B) * (records - 1 - r);                  \
            const uint8_t *rec = in + (size_t)(B) * r;                             \
            if ((B) < 8) {                                                         \
                uint64_t w = 0;                                                    \
                STORE(&w, rec, (B), 8, after + (B) < 8);                           \
                store64(c + 8 * r, w & LOW(8 * (B)));                              \
            } else if ((B) < 16) {                                                 \
                u128 w = 0;                                                        \
                STORE(&w, rec, (B), 16, after + (B) < 16);                         \
                store64(c + 16 * r, (uint64_t)w & LOW(4 * (B)));                   \
                store64(c + 16 * r + 8, (uint64_t)(w >> ((4 * (B)) & 127)) & LOW(4 * (B))); \
            } else {                                                               \
                u128 q0 = 0, q1 = 0;                                               \
                STORE(&q0, rec, (size_t)(B) / 2 + ((B) & 1), 16, after < 16);      \
                STORE(&q1, rec + (B) / 2, (size_t)((B) + 1) / 2, 16, after < 16);  \
                if ((B) & 1) q1 >>= 4;                                             \
                const uint64_t pair = LOW(2 * (B));                                \
                store64(c + 32 * r, (uint64_t)q0 & pair);                          \
                store64(c + 32 * r + 8, (uint64_t)(q0 >> ((2 * (B)) & 127)) & pair); \
                store64(c + 32 * r + 16, (uint64_t)q1 & pair);                     \
                store64(c + 32 * r + 24, (uint64_t)(q1 >> ((2 * (B)) & 127)) & pair); \
            }                                                                      \
        }                                                                          \
        const size_t words = records * ((B) < 8 ? 1 : (B) < 16 ? 2 : 4);           \
        for (size_t t = 0; t < words; t++) {                                       \
            uint64_t v = load64(c + 8 * t);                                        \
            if ((B) < 8) v = SPREAD(SPREAD(SPREAD(v, 32, 4 * (B)), 16, 2 * (B)), 8, (B)); \
            else if ((B) < 16) v = SPREAD(SPREAD(v, 32, 2 * (B)), 16, (B));        \
            else v = SPREAD(v, 32, (B));                                           \
            store64(c + 8 * t, v);                                                 \
        }                                                                          \
    }

DEFINE_PACKERS(2) DEFINE_PACKERS(3) DEFINE_PACKERS(4) DEFINE_PACKERS(5) DEFINE_PACKERS(6)
DEFINE_PACKERS(7) DEFINE_PACKERS(8) DEFINE_PACKERS(9) DEFINE_PACKERS(10) DEFINE_PACKERS(11)
DEFINE_PACKERS(12) DEFINE_PACKERS(13) DEFINE_PACKERS(14) DEFINE_PACKERS(15) DEFINE_PACKERS(16)
DEFINE_PACKERS(17) DEFINE_PACKERS(18) DEFINE_PACKERS(19) DEFINE_PACKERS(20) DEFINE_PACKERS(21)
DEFINE_PACKERS(22) DEFINE_PACKERS(23) DEFINE_PACKERS(24) DEFINE_PACKERS(25) DEFINE_PACKERS(26)
DEFINE_PACKERS(27) DEFINE_PACKERS(28) DEFINE_PACKERS(29) DEFINE_PACKERS(30) DEFINE_PACKERS(31)
DEFINE_PACKERS(32)

typedef void (*pack_fn)(uint8_t *, size_t, uint8_t *);
typedef void (*unpack_fn)(const uint8_t *, size_t, uint8_t *);
#define P(B) pack_##B
#define U(B) unpack_##B
static const pack_fn PACKERS[33] = {0, 0, P(2), P(3), P(4), P(5), P(6), P(7), P(8), P(9), P(10), P(11), P(12),
    P(13), P(14), P(15), P(16), P(17), P(18), P(19), P(20), P(21), P(22), P(23), P(24), P(25), P(26), P(27),
    P(28), P(29), P(30), P(31), P(32)};
static const unpack_fn UNPACKERS[33] = {0, 0, U(2), U(3), U(4), U(5), U(6), U(7), U(8), U(9), U(10), U(11), U(12),
    U(13), U(14), U(15), U(16), U(17), U(18), U(19), U(20), U(21), U(22), U(23), U(24), U(25), U(26), U(27),
    U(28), U(29), U(30), U(31), U(32)};

static inline size_t code_width(int bits) { return bits <= 8 ? 1 : bits <= 16 ? 2 : 4; }

/* The chunk's codes live in a local buffer. Where its address is (nearly) that of the data it is
   read from or written beside modulo 4 KiB, the CPU takes each load for one of the stores in
   flight (4K aliasing), which made the same kernel up to 1.4x slower on some arrays than on
   others. So the codes start half a page away from `ref` (the input or the output array). */
#define CODE_BUFFER (CHUNK * 4 + 4096 + 64)
typedef union { uint8_t u8[CODE_BUFFER]; uint16_t u16[CODE_BUFFER / 2]; uint32_t u32[CODE_BUFFER / 4]; } code_buffer;

static inline size_t away_from(const code_buffer *buf, const void *ref) {
    return (((uintptr_t)ref + 2048 - (uintptr_t)buf->u8) & 4095) & ~(size_t)63; /* bytes; 64-aligned */
}

/* ---- quantization of values [start, end) into codes -------------------------------------- */
/* float32 arithmetic for b <= 16, float64 beyond (dense.py's _work_dtype). The dither's counter
   is a 32-bit vector of its own (a 64-bit index narrowed in the loop costs a shuffle per vector). */
#define DEFINE_QUANTIZE_F32(T)                                                     \
    HOT static void quantize_f32_##T(const float *x, size_t start, size_t end, size_t slice_len, const float *s, \
                                     float qmax, int stochastic, uint32_t key, T *codes) { \
        const float top = 2.0f * qmax;                                             \
        size_t i = start;                                                          \
        while (i < end) {                                                          \
            const size_t k = i / slice_len;                                        \
            const size_t stop = ((k + 1) * slice_len < end) ? (k + 1) * slice_len : end; \
            const float sk = s[k];                                                 \
            T *c = codes + (i - start);                                            \
            const float *xi = x + i;                                               \
            const uint32_t m = (uint32_t)(stop - i); /* at most CHUNK */           \
            const uint32_t base = (uint32_t)i + key;                               \
            /* codes stay below 2^16 here, so the signed conversion (one vector instruction) \
               is exact; the branch on `stochastic` is hoisted out of the loop by the compiler */ \
            for (uint32_t t = 0; t < m; t++) {                                     \
                float y = xi[t] * sk;                                              \
                y = y + qmax;                                                      \
                if (stochastic) y = y + (float)(int32_t)(mix32(base + t) >> 8) * 0x1p-24f; \
                else y = rint_pos_f(y);                                            \
                y = y > 0.0f ? y : 0.0f; /* maxps; finite inputs, so the same as a clip */ \
                y = y < top ? y : top;                                             \
                c[t] = (T)(int32_t)y;                                              \
            }                                                                      \
            i = stop;                                                              \
        }                                                                          \
    }
DEFINE_QUANTIZE_F32(uint8_t)
DEFINE_QUANTIZE_F32(uint16_t)

HOT static void quantize_f64(const float *x, size_t start, size_t end, size_t slice_len, const double *s,
                             double qmax, int stochastic, uint32_t key, uint32_t *codes) {
    const double top = 2.0 * qmax;
    const int wide = top >= 0x1p31;
    size_t i = start;
    while (i < end) {
        const size_t k = i / slice_len;
        const size_t stop = ((k + 1) * slice_len < end) ? (k + 1) * slice_len : end;
        const double sk = s[k];
        uint32_t *c = codes + (i - start);
        const float *xi = x + i;
        const uint32_t m = (uint32_t)(stop - i);
        const uint32_t base = (uint32_t)i + key;
        for (uint32_t t = 0; t < m; t++) {
            double y = (double)xi[t] * sk;
            y = y + qmax;
            if (stochastic) y = y + (double)((float)(int32_t)(mix32(base + t) >> 8) * 0x1p-24f);
            else y = rint_pos_d(y);
            y = y > 0.0 ? y : 0.0;
            y = y < top ? y : top;
            /* below 2^31 (b < 32) the signed truncation is one instruction */
            c[t] = wide ? d_to_u32(trunc(y)) : (uint32_t)(int32_t)y;
        }
        i = stop;
    }
}

#define DEFINE_DEQUANT_F32(T)                                                      \
    HOT static void dequant_f32_##T(const T *c, size_t m, float q, float sk, float *out) { \
        for (size_t t = 0; t < m; t++) out[t] = ((float)(int32_t)c[t] - q) * sk; /* codes < 2^24: exact */ \
    }
DEFINE_DEQUANT_F32(uint8_t)
DEFINE_DEQUANT_F32(uint16_t)
/* For b <= 24 too: codes below 2^24 and c - q are exact in float32, and the float32 product of
   c - q and the scale is their exact product (48 bits in double) rounded once, as in dense.py's
   float64 path, so the values are the same bit for bit at half the vector width's cost. */
DEFINE_DEQUANT_F32(uint32_t)

HOT static void dequant_f64(const uint32_t *c, size_t m, double q, double sk, float *out) {
    if (q < 0x1p30) /* b < 32: codes below 2^31 convert as signed, one instruction */
        for (size_t t = 0; t < m; t++) out[t] = (float)(((double)(int32_t)c[t] - q) * sk);
    else
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
        const size_t width = code_width(bits);
        code_buffer buf;
        const size_t at0 = away_from(&buf, xb.buf);
        uint8_t *c8 = buf.u8 + at0;
        uint16_t *c16 = buf.u16 + at0 / 2;
        uint32_t *c32 = buf.u32 + at0 / 4;
        uint8_t *out = (uint8_t *)ob.buf;
        Py_BEGIN_ALLOW_THREADS
        for (size_t start = 0; start < n; start += CHUNK) {
            const size_t end = start + CHUNK < n ? start + CHUNK : n;
            if (bits > 16) quantize_f64((const float *)xb.buf, start, end, slice_len, (const double *)sb.buf, qmax, stochastic, key, c32);
            else if (bits > 8) quantize_f32_uint16_t((const float *)xb.buf, start, end, slice_len, (const float *)sb.buf, (float)qmax, stochastic, key, c16);
            else quantize_f32_uint8_t((const float *)xb.buf, start, end, slice_len, (const float *)sb.buf, (float)qmax, stochastic, key, c8);
            const size_t count = end - start, full = count / 8;
            PACKERS[bits](c8, full, out + (start / 8) * bits);
            if (count % 8) { /* the last, partial record: only its own bytes */
                uint8_t tail[32];
                uint8_t last[32] = {0};
                memcpy(last, c8 + 8 * full * width, (count % 8) * width);
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
        const size_t width = code_width(bits);
        code_buffer buf;
        const size_t at0 = away_from(&buf, out);
        uint8_t *c8 = buf.u8 + at0;
        const uint16_t *c16 = buf.u16 + at0 / 2;
        const uint32_t *c32 = buf.u32 + at0 / 4;
        Py_BEGIN_ALLOW_THREADS
        for (size_t start = 0; start < n; start += CHUNK) {
            const size_t end = start + CHUNK < n ? start + CHUNK : n;
            const size_t count = end - start, full = count / 8;
            UNPACKERS[bits](in + (start / 8) * bits, full, c8);
            if (count % 8) {
                uint8_t tail[32] = {0};
                const size_t at = ((start / 8) + full) * bits;
                memcpy(tail, in + at, (n * bits + 7) / 8 - at);
                UNPACKERS[bits](tail, 1, c8 + 8 * full * width);
            }
            size_t i = start;
            while (i < end) {
                const size_t k = i / slice_len;
                const size_t stop = ((k + 1) * slice_len < end) ? (k + 1) * slice_len : end;
                if (bits > 24) dequant_f64(c32 + (i - start), stop - i, (double)qmax, (double)scales[k], out + i);
                else if (bits > 16) dequant_f32_uint32_t(c32 + (i - start), stop - i, (float)qmax, scales[k], out + i);
                else if (bits > 8) dequant_f32_uint16_t(c16 + (i - start), stop - i, (float)qmax, scales[k], out + i);
                else dequant_f32_uint8_t(c8 + (i - start), stop - i, (float)qmax, scales[k], out + i);
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
