/* Fused int-b quantize + bit-pack and unpack + dequantize, one pass over the tensor.
 *
 * The bytes and values are exactly those of protocol/codecs/dense.py's numpy path (the fallback
 * when this module is not built): the same float operations in the same order (built with
 * -ffp-contract=off, never -ffast-math; fmaf only where dense.py computes the same exact value
 * in float64), the same counter-based dither, and protocol/bitpack.py's pack_lanes layout.
 * tests/test_kernels.py compares the two byte for byte.
 *
 * Every step is written so that it vectorises 8 float32 or int32 lanes to an AVX2 register:
 * b < 14 quantizes in float32, b >= 14 (PAIR_FROM_BITS, as dense.py's) in float32 pairs (the exact product; no float64, whose
 * vectors are half as wide), and codes are packed in blocks of 8 interleaved lanes. Needs GCC's or
 * Clang's vector extension; elsewhere the build of this optional module fails and the numpy path
 * is used. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the bit stream is assembled in little-endian words"
#endif

#define PAIR_FROM_BITS 14 /* dense.py's: s in float64 and stochastic rounding in exact float32 pairs from here */
#define CHUNK 4096 /* values quantized into a local buffer before packing: stays in L1; whole blocks */


/* The hot loops are built for x86-64-v4 (AVX-512), AVX2 and the baseline, and the loader picks one:
   the same operations, only wider, so the bytes do not depend on the machine. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define HOT __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HOT __attribute__((target_clones("avx2", "default")))
#else
#define HOT
#endif
/* The same with FMA (x86-64-v3 is AVX2 + FMA): where fmaf is an instruction, not libm's call */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define HOT_FMA __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define HOT_FMA HOT
#endif

/* Round half to even for 0 <= y < 2^23 (float) or 2^52 (double), as rint in the default mode:
   adding the magic constant leaves no fraction bits. Negative y (a rounding below 0) gives at
   most -0.5, which the clip that follows turns into 0, as it does rint's -0. */
static inline float rint_pos_f(float y) { return (y + 0x1p23f) - 0x1p23f; }
static inline double rint_pos_d(double y) { return (y + 0x1p52) - 0x1p52; }

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

/* The stochastic-rounding dither of value `counter` (index + key): dense.py's dither, the top 24
   bits of the hash over 2^24, exact in float32. */
static inline float dither_at(uint32_t counter) { return (float)(int32_t)(mix32(counter) >> 8) * 0x1p-24f; }

/* ---- packing: one function per bit-length ------------------------------------------------ */
/* Whole blocks of 256 values are 8 interleaved 32-bit lanes (protocol/bitpack.py's pack_lanes):
   value 8k + l is the k-th of lane l's 32 values, which form an LSB-first stream of b 32-bit words,
   and the lane's word w is the block's word 8w + l. So every step is one operation on 8 lanes, an
   AVX2 instruction, with its shift a constant in each specialisation: a vector of 8 codes costs a
   shift and an OR to pack (a shift, an OR and a mask to unpack). A block is 32*b bytes, so the
   size stays ceil(n*b/8). The values after the last whole block are one plain LSB-first stream. */
#define LANES 8
#define BLOCK (LANES * 32)
_Static_assert(CHUNK % BLOCK == 0, "a chunk is whole blocks: only the last one has a tail");

/* 8 lanes of 32 bits (GCC's and Clang's vector extension: one AVX2 register, two SSE2 ones) */
typedef uint32_t lanes_u32 __attribute__((vector_size(32)));
#define LOAD_LANES(v, p) memcpy(&(v), (p), sizeof(lanes_u32)) /* macros: a function returning a vector has an ABI per ISA */
#define STORE_LANES(p, v) memcpy((p), &(v), sizeof(lanes_u32))

#define DEFINE_PACKERS(B)                                                          \
    HOT static void pack_##B(const uint32_t *c, size_t blocks, uint8_t *o) {      \
        for (size_t g = 0; g < blocks; g++, c += BLOCK, o += 32 * (B)) {           \
            lanes_u32 acc = {0};                                                   \
            _Pragma("GCC unroll 32")                                               \
            for (int k = 0; k < 32; k++) {                                         \
                const int sh = (k * (B)) & 31, w = (k * (B)) >> 5;                 \
                lanes_u32 v;                                                       \
                LOAD_LANES(v, c + LANES * k);                                      \
                acc |= v << sh;                                                    \
                if (sh + (B) >= 32) { /* the word is full: store it, keep the overflow */ \
                    STORE_LANES(o + 32 * w, acc);                                  \
                    acc = sh + (B) > 32 ? v >> ((32 - sh) & 31) : (lanes_u32){0};  \
                }                                                                  \
            }                                                                      \
        }                                                                          \
    }                                                                              \
    HOT static void unpack_##B(const uint8_t *in, size_t blocks, uint32_t *c) {   \
        const uint32_t mask = (B) == 32 ? 0xffffffffu : (1u << ((B) & 31)) - 1u;   \
        for (size_t g = 0; g < blocks; g++, c += BLOCK, in += 32 * (B)) {          \
            _Pragma("GCC unroll 32")                                               \
            for (int k = 0; k < 32; k++) {                                         \
                const int sh = (k * (B)) & 31, w = (k * (B)) >> 5;                 \
                lanes_u32 v, next;                                                 \
                LOAD_LANES(v, in + 32 * w);                                        \
                v >>= sh;                                                          \
                if (sh + (B) > 32) {                                               \
                    LOAD_LANES(next, in + 32 * (w + 1));                           \
                    v |= next << ((32 - sh) & 31);                                 \
                }                                                                  \
                v &= mask;                                                         \
                STORE_LANES(c + LANES * k, v);                                     \
            }                                                                      \
        }                                                                          \
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

/* The last, partial block (fewer than 256 values) as a plain LSB-first stream, exactly its bytes. */
static void pack_tail(const uint32_t *c, size_t count, int bits, uint8_t *o) {
    uint64_t acc = 0;
    int held = 0;
    for (size_t i = 0; i < count; i++) {
        acc |= (uint64_t)c[i] << held;
        held += bits;
        for (; held >= 8; held -= 8, acc >>= 8) *o++ = (uint8_t)acc;
    }
    if (held > 0) *o = (uint8_t)acc;
}

static void unpack_tail(const uint8_t *in, size_t count, int bits, uint32_t *c) {
    const uint64_t mask = ((uint64_t)1 << bits) - 1;
    uint64_t acc = 0;
    int held = 0;
    for (size_t i = 0; i < count; i++) {
        for (; held < bits; held += 8) acc |= (uint64_t)*in++ << held; /* only the bytes the values use */
        c[i] = (uint32_t)(acc & mask);
        acc >>= bits;
        held -= bits;
    }
}

/* The chunk's codes live in a local buffer. Where its address is (nearly) that of the data it is
   read from or written beside modulo 4 KiB, the CPU takes each load for one of the stores in
   flight (4K aliasing), which made the same kernel up to 1.4x slower on some arrays than on
   others. So the codes start half a page away from `ref` (the input or the output array). */
#define CODE_BUFFER (CHUNK * 4 + 4096 + 64)
typedef union { uint8_t u8[CODE_BUFFER]; uint32_t u32[CODE_BUFFER / 4]; } code_buffer;

static inline uint32_t *away_from(code_buffer *buf, const void *ref) {
    return buf->u32 + ((((uintptr_t)ref + 2048 - (uintptr_t)buf->u8) & 4095) & ~(size_t)63) / 4; /* 64-aligned */
}

/* Every per-slice pass walks a chunk [start, end) in runs that stay within one slice: the run from
   i ends at the next slice boundary or at end. */
static inline size_t run_end(size_t i, size_t end, size_t slice_len) {
    const size_t boundary = (i / slice_len + 1) * slice_len;
    return boundary < end ? boundary : end;
}

/* ---- quantization of values [start, end) into codes -------------------------------------- */
/* float32 arithmetic for b < PAIR_FROM_BITS (dense.py's _work_dtype). The dither's counter is a 32-bit vector
   of its own (a 64-bit index narrowed in the loop costs a shuffle per vector). */
HOT static void quantize_f32(const float *x, size_t start, size_t end, size_t slice_len, const float *s,
                             float qmax, int stochastic, uint32_t key, uint32_t *codes) {
    const float top = 2.0f * qmax;
    size_t i = start;
    while (i < end) {
        const size_t stop = run_end(i, end, slice_len);
        const float sk = s[i / slice_len];
        uint32_t *c = codes + (i - start);
        const float *xi = x + i;
        const uint32_t m = (uint32_t)(stop - i); /* at most CHUNK */
        const uint32_t base = (uint32_t)i + key;
        /* codes stay below 2^16 here, so the signed conversion (one vector instruction) is exact;
           the branch on `stochastic` is hoisted out of the loop by the compiler */
        for (uint32_t t = 0; t < m; t++) {
            float y = xi[t] * sk;
            y = y + qmax;
            if (stochastic) y = y + dither_at(base + t);
            else y = rint_pos_f(y);
            y = y > 0.0f ? y : 0.0f; /* maxps; finite inputs, so the same as a clip */
            y = y < top ? y : top;
            c[t] = (uint32_t)(int32_t)y;
        }
        i = stop;
    }
}

/* nearest rounding for b >= PAIR_FROM_BITS, in float64 as dense.py's _codes (stochastic rounding there: quantize_pair) */
HOT static void quantize_f64(const float *x, size_t start, size_t end, size_t slice_len, const double *s,
                             double qmax, uint32_t *codes) {
    const double top = 2.0 * qmax;
    const int wide = top >= 0x1p31;
    size_t i = start;
    while (i < end) {
        const size_t stop = run_end(i, end, slice_len);
        const double sk = s[i / slice_len];
        uint32_t *c = codes + (i - start);
        const float *xi = x + i;
        const uint32_t m = (uint32_t)(stop - i);
        for (uint32_t t = 0; t < m; t++) {
            double y = (double)xi[t] * sk;
            y = rint_pos_d(y + qmax);
            y = y > 0.0 ? y : 0.0;
            y = y < top ? y : top;
            /* below 2^31 (b < 32) the signed truncation is one instruction */
            c[t] = wide ? d_to_u32(trunc(y)) : (uint32_t)(int32_t)y;
        }
        i = stop;
    }
}

/* Stochastic rounding for b >= PAIR_FROM_BITS in float32 lanes (8 to an AVX2 vector, against float64's 4), with
   the product taken exactly. Values are first clamped to +-1.5 qmax/s, past which every code is
   saturated anyway, so that nothing below converts out of range. The float64 s is split into
   s_hi + s_lo (float32 each); x*s_hi = p + e exactly (fmaf: the error-free product); r = rint(p)
   and f = p - r are exact; t = (f + e) + x*s_lo is rounded once, at |t| <= 2^(b-24) + 1. The code
   is r + floor(t + u) + qmax, added in integers, so nothing as large as the code is ever rounded:
   t + u is, to 2^-23 of a step for b <= 25 (2^(b-48) beyond), where float64's x*s + qmax + u was
   rounded to 2^(b-52) of a step. For b <= 31, |r| <= 1.5 qmax (1 + 2^-23) < 2^31 and
   |floor(t + u)| <= 2^(b-24) + 2, so both convert and add in int32. At b = 32 r passes 2^31: where
   |r| >= 2^24 it is even and converts as 2 * (r/2), the sum wraps modulo 2^32, and the clamp is
   decided in float, where r -+ 2^31 is exact wherever the sum can reach -+qmax.
   dense.py's _codes_pair is the same in numpy (in int64). */
#define DEFINE_QUANTIZE_PAIR(NAME, WIDE)                                          \
    HOT_FMA static void NAME(const float *x, size_t start, size_t end, size_t slice_len, const double *s, \
                             int32_t qmax, uint32_t key, uint32_t *codes) {       \
        size_t i = start;                                                          \
        while (i < end) {                                                          \
            const size_t stop = run_end(i, end, slice_len);                        \
            const double sk = s[i / slice_len];                                    \
            const float hi = (float)sk;                                            \
            const float lo = (float)(sk - (double)hi);                             \
            const float lim = (float)(1.5 * (double)qmax / sk);                    \
            uint32_t *c = codes + (i - start);                                     \
            const float *xi = x + i;                                               \
            const uint32_t m = (uint32_t)(stop - i);                               \
            const uint32_t base = (uint32_t)i + key;                               \
            for (uint32_t t = 0; t < m; t++) {                                     \
                float v = xi[t] < lim ? xi[t] : lim; /* minps, maxps: a NaN becomes lim */ \
                v = v > -lim ? v : -lim;                                           \
                const float p = v * hi;                                            \
                const float e = fmaf(v, hi, -p);                                   \
                const float r = rintf(p);                                          \
                const float f = ((p - r) + e) + v * lo;                            \
                const float u = dither_at(base + t);                               \
                const float step = floorf(f + u);                                  \
                if (!(WIDE)) {                                                     \
                    int32_t q = (int32_t)r + (int32_t)step;                        \
                    q = q > -qmax ? q : -qmax;                                     \
                    q = q < qmax ? q : qmax;                                       \
                    c[t] = (uint32_t)(q + qmax);                                   \
                } else {                                                           \
                    /* |r| < 2^24 converts as it is; beyond, r is even and r/2 converts */ \
                    const uint32_t ri = fabsf(r) < 0x1p24f ? (uint32_t)(int32_t)r : 2u * (uint32_t)(int32_t)(r * 0.5f); \
                    uint32_t code = ri + (uint32_t)(int32_t)step + (uint32_t)qmax; /* modulo 2^32 */ \
                    /* the clamp, in float: r -+ 2^31 is exact wherever the sum can reach -+qmax */ \
                    code = (r - 0x1p31f) + step >= -1.0f ? 0xfffffffeu : code; /* r + step >= qmax */ \
                    code = (r + 0x1p31f) + step <= 1.0f ? 0u : code;           /* r + step <= -qmax */ \
                    c[t] = code;                                                   \
                }                                                                  \
            }                                                                      \
            i = stop;                                                              \
        }                                                                          \
    }
DEFINE_QUANTIZE_PAIR(quantize_pair, 0)
DEFINE_QUANTIZE_PAIR(quantize_pair_32, 1)

/* c - qmax is taken in integers: it fits int32 for every b (at b = 32 the uint32 difference wraps
   to the right signed value), so one integer subtraction replaces a float one per vector. */
/* b <= 24: c - qmax is below 2^24, exact in float32, and the float32 product of it and the scale is
   their exact product (48 bits in double) rounded once, as in dense.py's float64 path: the same
   values bit for bit at half the vector width's cost. */
HOT static void dequant_f32(const uint32_t *c, size_t m, uint32_t q, float sk, float *out) {
    for (size_t t = 0; t < m; t++) out[t] = (float)(int32_t)(c[t] - q) * sk;
}

/* b > 24: c - qmax passes 2^24, beyond float32, so it splits exactly into d_hi (its bits above the
   low 8: at most 24 significant, a float32 as it is) and d_lo (the low 8 bits). Then
   d*s = p + e + d_lo*s, with p = d_hi*s rounded and e its exact error (fmaf); d_lo*s + e is rounded
   once (fmaf) and added to p. Where float64 took (d*s) in 4 lanes and two conversions a vector, this
   is float32's 8 lanes; the value is the exact product's float32 rounding but where that product
   lies within a hair of a halfway point (tests/test_kernels.py counts and bounds the difference
   from the float64 product's rounding). dense.py's dequantize is the same in numpy. */
HOT_FMA static void dequant_split(const uint32_t *c, size_t m, uint32_t q, float sk, float *out) {
    for (size_t t = 0; t < m; t++) {
        const int32_t d = (int32_t)(c[t] - q);
        const float hi = (float)(d & ~(int32_t)0xff), lo = (float)(d & 0xff);
        const float p = hi * sk;
        out[t] = p + fmaf(lo, sk, fmaf(hi, sk, -p));
    }
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

/* scaling(x: f32 buffer, bits, s: f32 (b < PAIR_FROM_BITS) or f64 buffer per slice, scales: f32 buffer per
   slice) -> bool: dense.py's _scaling in one call, where a tensor's handful of numpy calls cost more
   than its pass over the values: alpha = max|x| + 2^-52 in float64 per slice, s = qmax/alpha (in
   float32 for b < PAIR_FROM_BITS) and the float32 scale alpha/qmax sent. False where an alpha is not finite. */
static PyObject *scaling(PyObject *self, PyObject *args) {
    Py_buffer xb, sb, cb;
    int bits;
    if (!PyArg_ParseTuple(args, "y*iw*w*", &xb, &bits, &sb, &cb)) return NULL;
    PyObject *result = NULL;
    const size_t n = (size_t)xb.len / 4, slices = (size_t)cb.len / 4, wide = bits >= PAIR_FROM_BITS ? 8 : 4;
    if (bits < 2 || bits > 32 || slices == 0 || n % slices != 0 || (size_t)sb.len != slices * wide) {
        PyErr_SetString(PyExc_ValueError, "scaling: sizes do not agree");
    } else {
        const size_t len = n / slices;
        const double qmax = (double)((1u << (bits - 1)) - 1u);
        int finite = 1;
        Py_BEGIN_ALLOW_THREADS
        for (size_t k = 0; k < slices; k++) {
            const uint32_t top = absmax_bits((const uint32_t *)xb.buf + k * len, len);
            float topf;
            memcpy(&topf, &top, 4);
            const double alpha = (double)topf + 0x1p-52; /* dense.ALPHA_EPSILON */
            finite &= isfinite(alpha) != 0;
            if (wide == 8) ((double *)sb.buf)[k] = qmax / alpha;
            else ((float *)sb.buf)[k] = (float)(qmax / alpha);
            ((float *)cb.buf)[k] = (float)(alpha / qmax);
        }
        Py_END_ALLOW_THREADS
        result = PyBool_FromLong(finite);
    }
    PyBuffer_Release(&xb);
    PyBuffer_Release(&sb);
    PyBuffer_Release(&cb);
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

/* quantize_pack(x: f32 buffer, s: f32 (b < PAIR_FROM_BITS) or f64 buffer per slice, bits, stochastic, key, out: u8 buffer) */
static PyObject *quantize_pack(PyObject *self, PyObject *args) {
    Py_buffer xb, sb, ob;
    int bits, stochastic;
    unsigned int key;
    if (!PyArg_ParseTuple(args, "y*y*iiIw*", &xb, &sb, &bits, &stochastic, &key, &ob)) return NULL;
    PyObject *result = NULL;
    const size_t n = (size_t)xb.len / 4;
    const size_t wide = bits >= PAIR_FROM_BITS ? 8 : 4;
    const size_t slices = (size_t)sb.len / wide;
    if (bits < 2 || bits > 32 || slices == 0 || n % slices != 0 || (size_t)ob.len != (n * bits + 7) / 8) {
        PyErr_SetString(PyExc_ValueError, "quantize_pack: sizes do not agree");
        goto done;
    }
    {
        const size_t slice_len = n / slices;
        const double qmax = (double)((1u << (bits - 1)) - 1u);
        code_buffer buf;
        uint32_t *codes = away_from(&buf, xb.buf);
        uint8_t *out = (uint8_t *)ob.buf;
        const float *x = (const float *)xb.buf;
        /* at 32 bits the layout is the codes themselves, little-endian: they go straight out */
        const int straight = bits == 32 && (uintptr_t)out % 4 == 0;
        Py_BEGIN_ALLOW_THREADS
        for (size_t start = 0; start < n; start += CHUNK) { /* CHUNK is whole blocks */
            const size_t end = start + CHUNK < n ? start + CHUNK : n;
            uint32_t *c = straight ? (uint32_t *)(out + 4 * start) : codes;
            if (bits == 32 && stochastic) quantize_pair_32(x, start, end, slice_len, (const double *)sb.buf, (int32_t)qmax, key, c);
            else if (bits >= PAIR_FROM_BITS && stochastic) quantize_pair(x, start, end, slice_len, (const double *)sb.buf, (int32_t)qmax, key, c);
            else if (bits >= PAIR_FROM_BITS) quantize_f64(x, start, end, slice_len, (const double *)sb.buf, qmax, c);
            else quantize_f32(x, start, end, slice_len, (const float *)sb.buf, (float)qmax, stochastic, key, c);
            if (straight) continue;
            const size_t blocks = (end - start) / BLOCK;
            PACKERS[bits](codes, blocks, out + start / 8 * bits);
            pack_tail(codes + BLOCK * blocks, end - start - BLOCK * blocks, bits, out + (start + BLOCK * blocks) / 8 * bits);
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
        code_buffer buf;
        uint32_t *buffered = away_from(&buf, out);
        const int straight = bits == 32 && (uintptr_t)in % 4 == 0; /* as in quantize_pack */
        Py_BEGIN_ALLOW_THREADS
        for (size_t start = 0; start < n; start += CHUNK) {
            const size_t end = start + CHUNK < n ? start + CHUNK : n;
            const uint32_t *codes = straight ? (const uint32_t *)(in + 4 * start) : buffered;
            if (!straight) {
                const size_t blocks = (end - start) / BLOCK;
                UNPACKERS[bits](in + start / 8 * bits, blocks, buffered);
                unpack_tail(in + (start + BLOCK * blocks) / 8 * bits, end - start - BLOCK * blocks, bits, buffered + BLOCK * blocks);
            }
            size_t i = start;
            while (i < end) {
                const size_t stop = run_end(i, end, slice_len);
                if (bits > 24) dequant_split(codes + (i - start), stop - i, qmax, scales[i / slice_len], out + i);
                else dequant_f32(codes + (i - start), stop - i, qmax, scales[i / slice_len], out + i);
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
    {"scaling", scaling, METH_VARARGS, "alpha = max|x| + 2^-52 per slice; s = qmax/alpha and the scale alpha/qmax."},
    {"quantize_pack", quantize_pack, METH_VARARGS, "Quantize float32 values to int-b codes and bit-pack them."},
    {"unpack_dequantize", unpack_dequantize, METH_VARARGS, "Unpack int-b codes and dequantize them to float32."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_kernels", "Fused codec kernels.", -1, METHODS};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&MODULE); }
