/* The state numpy's np.random.default_rng(entropy) starts in, for a sequence of integers below 2**64
 * (node/seeding.py).
 *
 * The emulator names its random streams by what they are for (a transfer's loss draws, a device's
 * load in one period, a device's profile), so that no draw depends on the order in which events
 * reached a process: each is a generator seeded with a short list of integers. numpy makes one in
 * about 9.5 us, 8 of them in SeedSequence's hashing (Python objects around a few dozen 32-bit
 * multiplications); at 100,000 devices that was 1.9 s of the network process's round 0 and about
 * 1 s of building the world. Here the same arithmetic runs in C:
 * - each integer becomes its 32-bit words, least significant first (0 is one word 0), as
 *   numpy's _int_to_uint32_array does, and the words of the list are concatenated;
 * - SeedSequence's mix_entropy into a pool of 4 words, then generate_state(4, np.uint64);
 * - PCG64's seeding (pcg_setseq_128_srandom_r with the default 128-bit multiplier).
 * It returns the 128-bit state and increment as four 64-bit halves. tests/test_seeding.py checks it
 * against numpy's own generators on random lists. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define POOL_SIZE 4
#define MAX_WORDS 256
#define INIT_A 0x43b0d7e5u
#define MULT_A 0x931e8875u
#define INIT_B 0x8b51f9ddu
#define MULT_B 0x58f38dedu
#define MIX_MULT_L 0xca01f9ddu
#define MIX_MULT_R 0x4973f715u
#define XSHIFT 16

typedef unsigned __int128 u128;

static inline uint32_t hashmix(uint32_t value, uint32_t *hash_const) {
    value ^= *hash_const;
    *hash_const *= MULT_A;
    value *= *hash_const;
    value ^= value >> XSHIFT;
    return value;
}

static inline uint32_t mix(uint32_t x, uint32_t y) {
    uint32_t result = MIX_MULT_L * x - MIX_MULT_R * y;
    result ^= result >> XSHIFT;
    return result;
}

/* The entropy's 32-bit words; -1 with an exception set for what is not an integer in [0, 2**64). */
static Py_ssize_t entropy_words(PyObject *entropy, uint32_t *words) {
    PyObject *seq = PySequence_Fast(entropy, "entropy must be a sequence of integers");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), count = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *index = PyNumber_Index(PySequence_Fast_GET_ITEM(seq, i));
        if (index == NULL)
            goto fail;
        unsigned long long v = PyLong_AsUnsignedLongLong(index);
        Py_DECREF(index);
        if (v == (unsigned long long)-1 && PyErr_Occurred())
            goto fail;
        do {
            if (count == MAX_WORDS) {
                PyErr_SetString(PyExc_ValueError, "entropy is too long");
                goto fail;
            }
            words[count++] = (uint32_t)v;
            v >>= 32;
        } while (v);
    }
    Py_DECREF(seq);
    return count;
fail:
    Py_DECREF(seq);
    return -1;
}

static PyObject *pcg64_start(PyObject *self, PyObject *entropy) {
    uint32_t words[MAX_WORDS], pool[POOL_SIZE], out[2 * POOL_SIZE];
    Py_ssize_t n = entropy_words(entropy, words);
    if (n < 0)
        return NULL;
    uint32_t hash_const = INIT_A;  /* SeedSequence.mix_entropy */
    for (int i = 0; i < POOL_SIZE; i++)
        pool[i] = hashmix(i < n ? words[i] : 0u, &hash_const);
    for (int src = 0; src < POOL_SIZE; src++)
        for (int dst = 0; dst < POOL_SIZE; dst++)
            if (src != dst)
                pool[dst] = mix(pool[dst], hashmix(pool[src], &hash_const));
    for (Py_ssize_t src = POOL_SIZE; src < n; src++)
        for (int dst = 0; dst < POOL_SIZE; dst++)
            pool[dst] = mix(pool[dst], hashmix(words[src], &hash_const));
    hash_const = INIT_B;  /* SeedSequence.generate_state(4, np.uint64): 8 words */
    for (int i = 0; i < 2 * POOL_SIZE; i++) {
        uint32_t value = pool[i % POOL_SIZE];
        value ^= hash_const;
        hash_const *= MULT_B;
        value *= hash_const;
        value ^= value >> XSHIFT;
        out[i] = value;
    }
    uint64_t v[4];  /* viewed as little-endian 64-bit words */
    for (int k = 0; k < 4; k++)
        v[k] = (uint64_t)out[2 * k] | ((uint64_t)out[2 * k + 1] << 32);
    const u128 mult = ((u128)0x2360ED051FC65DA4ULL << 64) | 0x4385DF649FCCF645ULL;
    u128 initstate = ((u128)v[0] << 64) | v[1], initseq = ((u128)v[2] << 64) | v[3];
    u128 inc = (initseq << 1) | 1u, state = 0;  /* pcg_setseq_128_srandom_r */
    state = state * mult + inc;
    state += initstate;
    state = state * mult + inc;
    return Py_BuildValue("(KKKK)", (unsigned long long)(state >> 64), (unsigned long long)state,
                         (unsigned long long)(inc >> 64), (unsigned long long)inc);
}

static PyMethodDef methods[] = {
    {"pcg64_start", pcg64_start, METH_O,
     "pcg64_start(entropy) -> (state_high, state_low, inc_high, inc_low): the PCG64 state of np.random.default_rng(entropy)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_seeding", NULL, -1, methods};

PyMODINIT_FUNC PyInit__seeding(void) { return PyModule_Create(&module); }
