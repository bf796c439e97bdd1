/* One-pass L1 norms for the Laplace pipeline's training steps, and its noise drawn and added in one pass
 * (node/privacy.py).
 *
 * Every step of the core paper's local training takes the L1 norm of the flat gradient (the
 * clip), and every step of a later epoch updates the Lipschitz estimate, which needs the norm of
 * the window of recent gradients, the difference to the previous epoch's gradient at the same
 * position, and that difference's norm. In torch each is a separate pass over the model-sized
 * vector, and abs().sum() writes a temporary of its own: here the norm is one read, and the
 * estimate's update one pass over its three vectors.
 *
 * Both take the gradient as a list of parts (the parameters' own gradient tensors, so a step
 * needs no flat copy of them), and sum as if the parts were one vector: entry i of the whole goes
 * to accumulator i mod 8, so the result does not depend on how the vector is cut.
 *
 * Sums are taken in double precision in 8 interleaved accumulators, added pairwise at the end:
 * the same order on every machine (no FMA, no fast-math). The float32 values written (the
 * difference and the window) are exactly torch's: one float subtraction and one float addition
 * per entry. The GIL is released while a kernel runs. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Built for AVX2 and the baseline, the loader picks one: each of the 8 accumulators is one vector
   lane either way, so the sums do not depend on the machine. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HOT __attribute__((target_clones("avx2", "default")))
#else
#define HOT
#endif

static int float_buffer(PyObject *obj, Py_buffer *view, int writable, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (view->itemsize != 4 || view->format == NULL || strcmp(view->format, "f") != 0) {
        PyErr_Format(PyExc_TypeError, "%s must be contiguous float32", what);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static inline double combine(const double a[8]) {
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* Adds |x| of one part, whose first entry is entry `offset` of the whole, to the accumulators. */
HOT static void l1_part(const float *x, Py_ssize_t n, Py_ssize_t offset, double acc_io[8]) {
    double acc[8];
    memcpy(acc, acc_io, sizeof acc);
    Py_ssize_t i = 0;
    for (; i < n && (offset + i) % 8; i++) acc[(offset + i) % 8] += fabs((double)x[i]);
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += fabs((double)x[i + k]);
    for (; i < n; i++) acc[(offset + i) % 8] += fabs((double)x[i]);
    memcpy(acc_io, acc, sizeof acc);
}

static inline void update_one(const float *gr, const float *pr, float *wi, Py_ssize_t i, double *wacc, double *dacc) {
    const float before = wi[i];
    const float d = gr[i] - pr[i];
    *wacc += fabs((double)before);
    *dacc += fabs((double)d);
    wi[i] = before + d;
}

HOT static void update_part(const float *gr, const float *pr, float *wi, Py_ssize_t n, Py_ssize_t offset,
                            double wacc_io[8], double dacc_io[8]) {
    double wacc[8], dacc[8];
    memcpy(wacc, wacc_io, sizeof wacc);
    memcpy(dacc, dacc_io, sizeof dacc);
    Py_ssize_t i = 0;
    for (; i < n && (offset + i) % 8; i++) update_one(gr, pr, wi, i, &wacc[(offset + i) % 8], &dacc[(offset + i) % 8]);
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) update_one(gr, pr, wi, i + k, &wacc[k], &dacc[k]);
    for (; i < n; i++) update_one(gr, pr, wi, i, &wacc[(offset + i) % 8], &dacc[(offset + i) % 8]);
    memcpy(wacc_io, wacc, sizeof wacc);
    memcpy(dacc_io, dacc, sizeof dacc);
}

/* The buffers of a list of parts (writable or not), released by release_parts. */
static Py_buffer *get_parts(PyObject *seq, Py_ssize_t *count, int writable, const char *what) {
    PyObject *fast = PySequence_Fast(seq, "the parts must be a list");
    if (fast == NULL) return NULL;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    Py_buffer *views = PyMem_Calloc(n > 0 ? n : 1, sizeof(Py_buffer));
    if (views == NULL) { Py_DECREF(fast); PyErr_NoMemory(); return NULL; }
    for (Py_ssize_t k = 0; k < n; k++)
        if (float_buffer(PySequence_Fast_GET_ITEM(fast, k), &views[k], writable, what) < 0) {
            while (k--) PyBuffer_Release(&views[k]);
            PyMem_Free(views);
            Py_DECREF(fast);
            return NULL;
        }
    Py_DECREF(fast);
    *count = n;
    return views;
}

static void release_parts(Py_buffer *views, Py_ssize_t count) {
    for (Py_ssize_t k = 0; k < count; k++) PyBuffer_Release(&views[k]);
    PyMem_Free(views);
}

static PyObject *l1_norm(PyObject *self, PyObject *args) {
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "O", &seq)) return NULL;
    Py_ssize_t count;
    Py_buffer *parts = get_parts(seq, &count, 0, "every part");
    if (parts == NULL) return NULL;
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t offset = 0;
    for (Py_ssize_t k = 0; k < count; k++) {
        l1_part(parts[k].buf, parts[k].len / 4, offset, acc);
        offset += parts[k].len / 4;
    }
    Py_END_ALLOW_THREADS
    release_parts(parts, count);
    return PyFloat_FromDouble(combine(acc));
}

/* (||window||_1 before the update, ||grad - prev||_1), with window <- window + (grad - prev), all in
   one pass; each argument a list of parts, cut alike. The difference itself is not kept: the
   estimate drops the previous gradient right after. */
static PyObject *lipschitz_update(PyObject *self, PyObject *args) {
    PyObject *g_obj, *p_obj, *w_obj;
    if (!PyArg_ParseTuple(args, "OOO", &g_obj, &p_obj, &w_obj)) return NULL;
    Py_ssize_t ng, np_, nw;
    Py_buffer *g = get_parts(g_obj, &ng, 0, "grad");
    if (g == NULL) return NULL;
    Py_buffer *p = get_parts(p_obj, &np_, 0, "prev");
    if (p == NULL) { release_parts(g, ng); return NULL; }
    Py_buffer *w = get_parts(w_obj, &nw, 1, "window");
    if (w == NULL) { release_parts(g, ng); release_parts(p, np_); return NULL; }
    int agree = ng == np_ && ng == nw;
    for (Py_ssize_t k = 0; agree && k < ng; k++) agree = g[k].len == p[k].len && g[k].len == w[k].len;
    if (!agree) {
        release_parts(g, ng); release_parts(p, np_); release_parts(w, nw);
        PyErr_SetString(PyExc_ValueError, "grad, prev and window must be cut into parts of the same lengths");
        return NULL;
    }
    double wacc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, dacc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t offset = 0;
    for (Py_ssize_t k = 0; k < ng; k++) {
        update_part(g[k].buf, p[k].buf, w[k].buf, g[k].len / 4, offset, wacc, dacc);
        offset += g[k].len / 4;
    }
    Py_END_ALLOW_THREADS
    release_parts(g, ng); release_parts(p, np_); release_parts(w, nw);
    return Py_BuildValue("dd", combine(wacc), combine(dacc));
}

/* Laplace noise from raw generator words, in one pass: entry i takes the i-th 32-bit half of the
   words (little-endian order, as numpy's uint32 view of them): its top bit is the sign, the other
   31 bits k a uniform u = ((float)k + 0.5) 2^-31 in (0, 1], and the magnitude is E = -log(u), a
   standard exponential (its largest value 22.2). The log is float32 arithmetic of its own
   (mantissa in [sqrt(1/2), sqrt(2)), log m = 2 atanh((m - 1)/(m + 1)) by five terms of its series,
   the exponent times ln 2 in two parts), not libm's, so the bits are the same on every machine
   and in node/privacy.py's numpy path, which takes the same operations in the same order.
   out = sign(E) * scale + value. numpy's float32 exponential draws (a ziggurat, one call per
   draw) took 10-13 ms for the CNN's 1.66 M weights; this takes the generator's 2.3-3.1 ms of words
   and 1.5 ms more. */
#define LN2_HI 0x1.62e4p-1f /* ln 2 = LN2_HI + LN2_LO, the first exact in 16 bits; float32 constants in hex, */
#define LN2_LO 0x1.7f7d1cp-20f /* as node/privacy.py writes them */
HOT static void laplace_bits_loop(const uint32_t *words, float scale, const float *value, float *out, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint32_t w = words[i];
        float u = (float)(int32_t)(w & 0x7fffffffu);
        u = u + 0.5f;
        u = u * 0x1p-31f;
        uint32_t b;
        memcpy(&b, &u, 4);
        int32_t e = (int32_t)(b >> 23) - 127;
        uint32_t mb = (b & 0x007fffffu) | 0x3f800000u;
        const int32_t high = mb > 0x3fb504f3u; /* m > sqrt(2) (rounded down): take m / 2 */
        mb = high ? mb - 0x00800000u : mb;
        e = e + high;
        float m;
        memcpy(&m, &mb, 4);
        const float s = (m - 1.0f) / (m + 1.0f);
        const float z = s * s;
        float p = 0x1.c71c72p-4f; /* 1/9, 1/7, 1/5, 1/3 */
        p = p * z + 0x1.24924ap-3f;
        p = p * z + 0x1.99999ap-3f;
        p = p * z + 0x1.555556p-2f;
        p = p * z + 1.0f;
        const float logm = (s + s) * p;
        const float fe = (float)e;
        float mag = fe * LN2_LO + logm;
        mag = fe * LN2_HI + mag;
        uint32_t mbits; /* E = -log u, with the word's top bit as its sign */
        memcpy(&mbits, &mag, 4);
        mbits = mbits ^ 0x80000000u ^ (w & 0x80000000u);
        float noise;
        memcpy(&noise, &mbits, 4);
        noise = noise * scale;
        out[i] = noise + value[i];
    }
}

/* laplace_from_bits(words, scale, value, out): out <- Laplace(0, 1) from the words * scale + value */
static PyObject *laplace_from_bits(PyObject *self, PyObject *args) {
    Py_buffer words;
    PyObject *v_obj, *o_obj;
    float scale;
    if (!PyArg_ParseTuple(args, "y*fOO", &words, &scale, &v_obj, &o_obj)) return NULL;
    Py_buffer v, o;
    if (float_buffer(v_obj, &v, 0, "value") < 0) { PyBuffer_Release(&words); return NULL; }
    if (float_buffer(o_obj, &o, 1, "out") < 0) { PyBuffer_Release(&words); PyBuffer_Release(&v); return NULL; }
    const Py_ssize_t n = v.len / 4;
    PyObject *result = NULL;
    if (o.len != v.len || words.len < 4 * n) {
        PyErr_SetString(PyExc_ValueError, "laplace_from_bits: sizes do not agree");
    } else {
        Py_BEGIN_ALLOW_THREADS
        laplace_bits_loop((const uint32_t *)words.buf, scale, (const float *)v.buf, (float *)o.buf, n);
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&words);
    PyBuffer_Release(&v);
    PyBuffer_Release(&o);
    return result;
}

static PyMethodDef METHODS[] = {
    {"laplace_from_bits", laplace_from_bits, METH_VARARGS,
     "laplace_from_bits(words, scale, value, out): out <- Laplace(0, 1) drawn from the 32-bit words * scale + value."},
    {"l1_norm", l1_norm, METH_VARARGS,
     "l1_norm(parts) -> sum |x| over a list of contiguous float32 arrays, summed in double as one vector."},
    {"lipschitz_update", lipschitz_update, METH_VARARGS,
     "lipschitz_update(grad, prev, window) -> (|window|_1, |grad - prev|_1); window += grad - prev. "
     "Each a list of parts, cut alike."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_dpkernels", "One-pass L1 norms and Laplace noise for DP training.", -1, METHODS};

PyMODINIT_FUNC PyInit__dpkernels(void) { return PyModule_Create(&MODULE); }
