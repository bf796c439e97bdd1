/* ReLU followed by a 2x2 max-pool (stride 2, no padding), forward and backward, for float32
 * NCHW tensors on the CPU (node/layers.py).
 *
 * torch's max_pool2d on a contiguous NCHW tensor runs a scalar loop per output and keeps int64
 * indices: in the MNIST CNN the two pools took 3.2 ms of a 17-20 ms training step, forward and
 * backward, more than the first convolution. Here one pass reads the input once and writes the pooled output and a
 * one-byte position in the window; the ReLU is folded in (it commutes with the max), so its
 * full-size output and its own backward pass are gone too.
 *
 * The results are torch's bit for bit: relu(x) is x unless x < 0 (so -0.0 and NaN pass), the
 * window is scanned in raster order and a value replaces the running maximum when it is greater or
 * NaN (torch's rule, so the first of equal values wins), and the backward pass gives the output's
 * gradient to the window's maximum when the ReLU let it through (x > 0 or NaN there), as 0 + g
 * (what torch's scatter-add into zeros yields for g = -0.0), and +0.0 everywhere else.
 * The GIL is released while a kernel runs. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static int typed_buffer(PyObject *obj, Py_buffer *view, int writable, const char *format, Py_ssize_t itemsize,
                        Py_ssize_t count, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (view->itemsize != itemsize || view->format == NULL || strcmp(view->format, format) != 0) {
        PyErr_Format(PyExc_TypeError, "%s must be contiguous %s", what, itemsize == 4 ? "float32" : "uint8");
        PyBuffer_Release(view);
        return -1;
    }
    if (view->len != count * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd values, expected %zd", what, view->len / itemsize, count);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static inline float relu(float x) { return x < 0.0f ? 0.0f : x; }

/* One output of the forward pass: relu(v) >= 0 or NaN, so the window's first value always
   replaces the start of -inf. */
static inline void pool_one(const float *top, const float *bottom, float *out, uint8_t *idx) {
    const float v[4] = {relu(top[0]), relu(top[1]), relu(bottom[0]), relu(bottom[1])};
    float best = v[0];
    uint8_t at = 0;
    for (uint8_t k = 1; k < 4; k++)
        if (v[k] > best || v[k] != v[k]) {
            best = v[k];
            at = k;
        }
    *out = best;
    *idx = at;
}

static inline void unpool_one(float g, float o, uint8_t k, float *top, float *bottom) {
    g = (o > 0.0f || o != o) ? 0.0f + g : 0.0f;
    top[0] = k == 0 ? g : 0.0f;
    top[1] = k == 1 ? g : 0.0f;
    bottom[0] = k == 2 ? g : 0.0f;
    bottom[1] = k == 3 ? g : 0.0f;
}

#ifdef __SSE2__
#include <emmintrin.h>
/* Four outputs at a time, branch-free: with real activations the comparisons go either way at
   random, and a branch per comparison costs more in mispredictions than the loads (torch's loop,
   and a scalar one here, ran at about 20 ns an output). The same comparisons as pool_one. */
static inline __m128 relu4(__m128 x) { return _mm_andnot_ps(_mm_cmplt_ps(x, _mm_setzero_ps()), x); }

static inline void pool_four(const float *top, const float *bottom, float *out, uint8_t *idx) {
    const __m128 t0 = _mm_loadu_ps(top), t1 = _mm_loadu_ps(top + 4);
    const __m128 b0 = _mm_loadu_ps(bottom), b1 = _mm_loadu_ps(bottom + 4);
    const __m128 v[4] = {relu4(_mm_shuffle_ps(t0, t1, _MM_SHUFFLE(2, 0, 2, 0))),
                         relu4(_mm_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 1, 3, 1))),
                         relu4(_mm_shuffle_ps(b0, b1, _MM_SHUFFLE(2, 0, 2, 0))),
                         relu4(_mm_shuffle_ps(b0, b1, _MM_SHUFFLE(3, 1, 3, 1)))};
    __m128 best = v[0];
    __m128i at = _mm_setzero_si128();
    for (int k = 1; k < 4; k++) {
        const __m128 c = _mm_or_ps(_mm_cmpgt_ps(v[k], best), _mm_cmpunord_ps(v[k], v[k]));
        best = _mm_or_ps(_mm_and_ps(c, v[k]), _mm_andnot_ps(c, best));
        const __m128i ci = _mm_castps_si128(c);
        at = _mm_or_si128(_mm_and_si128(ci, _mm_set1_epi32(k)), _mm_andnot_si128(ci, at));
    }
    _mm_storeu_ps(out, best);
    const __m128i bytes = _mm_packus_epi16(_mm_packs_epi32(at, at), _mm_setzero_si128());
    const int four = _mm_cvtsi128_si32(bytes);
    memcpy(idx, &four, 4);
}

static inline void unpool_four(const float *grad_out, const float *out, const uint8_t *idx, float *top, float *bottom) {
    const __m128 o = _mm_loadu_ps(out);
    const __m128 pass = _mm_or_ps(_mm_cmpgt_ps(o, _mm_setzero_ps()), _mm_cmpunord_ps(o, o));
    const __m128 g = _mm_and_ps(pass, _mm_add_ps(_mm_setzero_ps(), _mm_loadu_ps(grad_out)));
    const __m128i k = _mm_setr_epi32(idx[0], idx[1], idx[2], idx[3]);
    __m128 at[4];
    for (int q = 0; q < 4; q++)
        at[q] = _mm_and_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(k, _mm_set1_epi32(q))), g);
    _mm_storeu_ps(top, _mm_unpacklo_ps(at[0], at[1]));
    _mm_storeu_ps(top + 4, _mm_unpackhi_ps(at[0], at[1]));
    _mm_storeu_ps(bottom, _mm_unpacklo_ps(at[2], at[3]));
    _mm_storeu_ps(bottom + 4, _mm_unpackhi_ps(at[2], at[3]));
}
#define LANES 4
#else
#define LANES 1
#define pool_four pool_one
#define unpool_four(go, o, i, t, b) unpool_one(*(go), *(o), *(i), t, b)
#endif

static void forward_loop(const float *x, float *out, uint8_t *idx, Py_ssize_t planes, Py_ssize_t h, Py_ssize_t w) {
    const Py_ssize_t oh = h / 2, ow = w / 2;
    for (Py_ssize_t p = 0; p < planes; p++) {
        const float *plane = x + p * h * w;
        for (Py_ssize_t i = 0; i < oh; i++) {
            const float *top = plane + 2 * i * w, *bottom = top + w;
            Py_ssize_t j = 0;
            for (; j + LANES <= ow; j += LANES) pool_four(top + 2 * j, bottom + 2 * j, out + j, idx + j);
            if (j < ow && ow >= LANES) {  /* the last LANES outputs again: the same values, no scalar tail */
                j = ow - LANES;
                pool_four(top + 2 * j, bottom + 2 * j, out + j, idx + j);
                j = ow;
            }
            for (; j < ow; j++) pool_one(top + 2 * j, bottom + 2 * j, out + j, idx + j);
            out += ow;
            idx += ow;
        }
    }
}

static void backward_loop(const float *grad_out, const float *out, const uint8_t *idx, float *grad_in,
                          Py_ssize_t planes, Py_ssize_t h, Py_ssize_t w) {
    const Py_ssize_t oh = h / 2, ow = w / 2;
    for (Py_ssize_t p = 0; p < planes; p++) {
        float *plane = grad_in + p * h * w;
        if (h % 2) memset(plane + (h - 1) * w, 0, (size_t)w * sizeof(float));  /* a last row no window covers */
        for (Py_ssize_t i = 0; i < oh; i++) {
            float *top = plane + 2 * i * w, *bottom = top + w;
            Py_ssize_t j = 0;
            for (; j + LANES <= ow; j += LANES) unpool_four(grad_out + j, out + j, idx + j, top + 2 * j, bottom + 2 * j);
            if (j < ow && ow >= LANES) {
                j = ow - LANES;
                unpool_four(grad_out + j, out + j, idx + j, top + 2 * j, bottom + 2 * j);
                j = ow;
            }
            for (; j < ow; j++) unpool_one(grad_out[j], out[j], idx[j], top + 2 * j, bottom + 2 * j);
            if (w % 2) top[w - 1] = bottom[w - 1] = 0.0f;  /* a last column no window covers */
            out += ow;
            grad_out += ow;
            idx += ow;
        }
    }
}

static PyObject *relu_maxpool2_forward(PyObject *self, PyObject *args) {
    PyObject *xo, *oo, *io;
    Py_ssize_t planes, h, w;
    if (!PyArg_ParseTuple(args, "OOOnnn", &xo, &oo, &io, &planes, &h, &w)) return NULL;
    if (planes < 0 || h < 2 || w < 2) return PyErr_Format(PyExc_ValueError, "a 2x2 pool needs planes of at least 2x2");
    Py_buffer x, out, idx;
    const Py_ssize_t pooled = planes * (h / 2) * (w / 2);
    if (typed_buffer(xo, &x, 0, "f", 4, planes * h * w, "x") < 0) return NULL;
    if (typed_buffer(oo, &out, 1, "f", 4, pooled, "out") < 0) { PyBuffer_Release(&x); return NULL; }
    if (typed_buffer(io, &idx, 1, "B", 1, pooled, "idx") < 0) { PyBuffer_Release(&x); PyBuffer_Release(&out); return NULL; }
    Py_BEGIN_ALLOW_THREADS
    forward_loop((const float *)x.buf, (float *)out.buf, (uint8_t *)idx.buf, planes, h, w);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    PyBuffer_Release(&idx);
    Py_RETURN_NONE;
}

static PyObject *relu_maxpool2_backward(PyObject *self, PyObject *args) {
    PyObject *go, *oo, *io, *gi;
    Py_ssize_t planes, h, w;
    if (!PyArg_ParseTuple(args, "OOOOnnn", &go, &oo, &io, &gi, &planes, &h, &w)) return NULL;
    if (planes < 0 || h < 2 || w < 2) return PyErr_Format(PyExc_ValueError, "a 2x2 pool needs planes of at least 2x2");
    Py_buffer grad_out, out, idx, grad_in;
    const Py_ssize_t pooled = planes * (h / 2) * (w / 2);
    if (typed_buffer(go, &grad_out, 0, "f", 4, pooled, "grad_out") < 0) return NULL;
    if (typed_buffer(oo, &out, 0, "f", 4, pooled, "out") < 0) { PyBuffer_Release(&grad_out); return NULL; }
    if (typed_buffer(io, &idx, 0, "B", 1, pooled, "idx") < 0) {
        PyBuffer_Release(&grad_out); PyBuffer_Release(&out); return NULL;
    }
    if (typed_buffer(gi, &grad_in, 1, "f", 4, planes * h * w, "grad_in") < 0) {
        PyBuffer_Release(&grad_out); PyBuffer_Release(&out); PyBuffer_Release(&idx); return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    backward_loop((const float *)grad_out.buf, (const float *)out.buf, (const uint8_t *)idx.buf, (float *)grad_in.buf,
                  planes, h, w);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&grad_out);
    PyBuffer_Release(&out);
    PyBuffer_Release(&idx);
    PyBuffer_Release(&grad_in);
    Py_RETURN_NONE;
}

static PyMethodDef METHODS[] = {
    {"relu_maxpool2_forward", relu_maxpool2_forward, METH_VARARGS,
     "relu_maxpool2_forward(x, out, idx, planes, h, w): out <- 2x2 max-pool of relu(x), idx <- each maximum's place (0-3)."},
    {"relu_maxpool2_backward", relu_maxpool2_backward, METH_VARARGS,
     "relu_maxpool2_backward(grad_out, out, idx, grad_in, planes, h, w): grad_in <- the gradient of relu then pool."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_layerkernels", "ReLU and 2x2 max-pool in one pass.", -1, METHODS};

PyMODINIT_FUNC PyInit__layerkernels(void) { return PyModule_Create(&MODULE); }
