/* Max-min fair water-filling, emulator/links.py's `max_min_fill_py` compiled.
 *
 * The same algorithm with the same double operations in the same order (built with
 * -ffp-contract=off, never -ffast-math) and the same tie-breaking, so the rates and bottlenecks are
 * bit for bit those of the Python version (tests/test_links.py compares them). The network's tcp
 * model fills all flows afresh at every window event, ~170 flows in a flagship round: this is
 * where its time went.
 *
 * Links are any hashable objects, looked up in `override` first (if given) and then in
 * `capacity`; a link that is absent or has an infinite (or NaN) capacity never constrains. Links
 * are numbered in the order they are first seen (flows in order, each path in order): that number
 * breaks ties, as the Python version's does. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    double key;
    Py_ssize_t order;
} Entry;

static inline int entry_less(Entry a, Entry b) { return a.key < b.key || (a.key == b.key && a.order < b.order); }

typedef struct {
    Entry *items;
    Py_ssize_t size, cap;
} Heap;

static int heap_push(Heap *h, Entry e) {
    if (h->size == h->cap) {
        Py_ssize_t cap = h->cap ? 2 * h->cap : 16;
        Entry *items = PyMem_Realloc(h->items, (size_t)cap * sizeof(Entry));
        if (!items) return -1;
        h->items = items;
        h->cap = cap;
    }
    Py_ssize_t i = h->size++;
    while (i > 0) {
        Py_ssize_t parent = (i - 1) / 2;
        if (!entry_less(e, h->items[parent])) break;
        h->items[i] = h->items[parent];
        i = parent;
    }
    h->items[i] = e;
    return 0;
}

static Entry heap_pop(Heap *h) {
    Entry top = h->items[0], last = h->items[--h->size];
    Py_ssize_t i = 0, n = h->size;
    for (;;) {
        Py_ssize_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && entry_less(h->items[child + 1], h->items[child])) child++;
        if (!entry_less(h->items[child], last)) break;
        h->items[i] = h->items[child];
        i = child;
    }
    if (n) h->items[i] = last;
    return top;
}

typedef struct {
    double cap;
    Py_ssize_t order, flow;
} Private;

static int private_cmp(const void *pa, const void *pb) {
    const Private *a = pa, *b = pb;
    if (a->cap < b->cap) return -1;
    if (a->cap > b->cap) return 1;
    return (a->order > b->order) - (a->order < b->order);
}

/* The capacity of `link` (override first), INFINITY when it has none; -1.0 with an exception set
   on error (a capacity is never negative in a valid call: a negative one is still returned as it
   is, the error is told apart by PyErr_Occurred). */
static int lookup_capacity(PyObject *capacity, PyObject *override, PyObject *link, double *out) {
    PyObject *maps[2] = {override, capacity};
    for (int m = 0; m < 2; m++) {
        PyObject *map = maps[m];
        if (map == NULL || map == Py_None) continue;
        PyObject *value;
        if (PyDict_CheckExact(map)) {
            value = PyDict_GetItemWithError(map, link);
            if (value == NULL) {
                if (PyErr_Occurred()) return -1;
                continue;
            }
            Py_INCREF(value);
        } else {
            value = PyObject_GetItem(map, link);
            if (value == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_KeyError)) return -1;
                PyErr_Clear();
                continue;
            }
        }
        double v = PyFloat_AsDouble(value);
        Py_DECREF(value);
        if (v == -1.0 && PyErr_Occurred()) return -1;
        *out = v;
        return 0;
    }
    *out = INFINITY;
    return 0;
}

static PyObject *max_min_fill(PyObject *self, PyObject *args) {
    PyObject *paths_in, *capacity, *override = Py_None;
    if (!PyArg_ParseTuple(args, "OO|O", &paths_in, &capacity, &override)) return NULL;
    PyObject *paths = PySequence_Fast(paths_in, "paths must be a sequence of paths");
    if (!paths) return NULL;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(paths);

    PyObject *index = PyDict_New(); /* link -> its number, or -1 for a link that never constrains */
    PyObject *result = NULL;
    PyObject **link_obj = NULL; /* number -> link (borrowed from `index`'s keys) */
    double *remaining = NULL, *rates = NULL;
    Py_ssize_t *last_user = NULL, *count = NULL, *users_start = NULL, *users = NULL, *fill = NULL;
    Py_ssize_t *flow_start = NULL, *flow_links = NULL, *shared_start = NULL, *shared = NULL, *bottleneck = NULL;
    char *fixed = NULL;
    Private *private = NULL;
    Heap heap = {NULL, 0, 0};
    Py_ssize_t links = 0, occurrences = 0, link_cap = 64, occ_cap = 256;
    if (!index) goto done;

    link_obj = PyMem_Malloc((size_t)link_cap * sizeof(PyObject *));
    remaining = PyMem_Malloc((size_t)link_cap * sizeof(double));
    last_user = PyMem_Malloc((size_t)link_cap * sizeof(Py_ssize_t));
    flow_links = PyMem_Malloc((size_t)occ_cap * sizeof(Py_ssize_t));
    flow_start = PyMem_Malloc((size_t)(n + 1) * sizeof(Py_ssize_t));
    if (!link_obj || !remaining || !last_user || !flow_links || !flow_start) { PyErr_NoMemory(); goto done; }

    /* each flow's finite links, once each, numbered in first-seen order */
    for (Py_ssize_t i = 0; i < n; i++) {
        flow_start[i] = occurrences;
        PyObject *path = PySequence_Fast(PySequence_Fast_GET_ITEM(paths, i), "a path must be a sequence of links");
        if (!path) goto done;
        const Py_ssize_t len = PySequence_Fast_GET_SIZE(path);
        for (Py_ssize_t j = 0; j < len; j++) {
            PyObject *link = PySequence_Fast_GET_ITEM(path, j);
            PyObject *known = PyDict_GetItemWithError(index, link);
            Py_ssize_t k;
            if (known != NULL) {
                k = PyLong_AsSsize_t(known);
                if (k < 0 || last_user[k] == i) continue; /* never constrains, or twice on this path */
            } else {
                if (PyErr_Occurred()) { Py_DECREF(path); goto done; }
                double cap;
                if (lookup_capacity(capacity, override, link, &cap) < 0) { Py_DECREF(path); goto done; }
                k = cap < INFINITY ? links : -1;
                PyObject *number = PyLong_FromSsize_t(k);
                if (!number || PyDict_SetItem(index, link, number) < 0) { Py_XDECREF(number); Py_DECREF(path); goto done; }
                Py_DECREF(number);
                if (k < 0) continue;
                if (links == link_cap) {
                    link_cap *= 2;
                    PyObject **lo = PyMem_Realloc(link_obj, (size_t)link_cap * sizeof(PyObject *));
                    if (lo) link_obj = lo;
                    double *re = PyMem_Realloc(remaining, (size_t)link_cap * sizeof(double));
                    if (re) remaining = re;
                    Py_ssize_t *lu = PyMem_Realloc(last_user, (size_t)link_cap * sizeof(Py_ssize_t));
                    if (lu) last_user = lu;
                    if (!lo || !re || !lu) { PyErr_NoMemory(); Py_DECREF(path); goto done; }
                }
                link_obj[k] = link; /* a key of `index` now: alive as long as it is */
                remaining[k] = cap;
                links++;
            }
            last_user[k] = i;
            if (occurrences == occ_cap) {
                occ_cap *= 2;
                Py_ssize_t *fl = PyMem_Realloc(flow_links, (size_t)occ_cap * sizeof(Py_ssize_t));
                if (!fl) { PyErr_NoMemory(); Py_DECREF(path); goto done; }
                flow_links = fl;
            }
            flow_links[occurrences++] = k;
        }
        Py_DECREF(path);
    }
    flow_start[n] = occurrences;

    /* each link's flows, in flow order */
    count = PyMem_Calloc((size_t)links + 1, sizeof(Py_ssize_t));
    users_start = PyMem_Malloc(((size_t)links + 1) * sizeof(Py_ssize_t));
    fill = PyMem_Malloc(((size_t)links + 1) * sizeof(Py_ssize_t));
    users = PyMem_Malloc(((size_t)occurrences + 1) * sizeof(Py_ssize_t));
    if (!count || !users_start || !fill || !users) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t o = 0; o < occurrences; o++) count[flow_links[o]]++;
    for (Py_ssize_t k = 0, at = 0; k < links; k++) { users_start[k] = fill[k] = at; at += count[k]; }
    users_start[links] = occurrences;
    for (Py_ssize_t i = 0; i < n; i++)
        for (Py_ssize_t o = flow_start[i]; o < flow_start[i + 1]; o++) users[fill[flow_links[o]]++] = i;

    /* a link only one flow crosses is a fixed cap on it: those wait in one sorted list, and only
       the links that flows share go in the heap */
    private = PyMem_Malloc(((size_t)links + 1) * sizeof(Private));
    Py_ssize_t m = 0;
    if (!private) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t k = 0; k < links; k++) {
        if (count[k] == 1) {
            private[m].cap = remaining[k];
            private[m].order = k;
            private[m].flow = users[users_start[k]];
            m++;
        } else {
            Entry e = {remaining[k] / (double)count[k], k};
            if (heap_push(&heap, e) < 0) { PyErr_NoMemory(); goto done; }
        }
    }
    qsort(private, (size_t)m, sizeof(Private), private_cmp);
    shared_start = PyMem_Malloc(((size_t)n + 1) * sizeof(Py_ssize_t));
    shared = PyMem_Malloc(((size_t)occurrences + 1) * sizeof(Py_ssize_t));
    rates = PyMem_Malloc(((size_t)n + 1) * sizeof(double));
    bottleneck = PyMem_Malloc(((size_t)n + 1) * sizeof(Py_ssize_t));
    fixed = PyMem_Calloc((size_t)n + 1, 1);
    if (!shared_start || !shared || !rates || !bottleneck || !fixed) { PyErr_NoMemory(); goto done; }
    Py_ssize_t s = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        shared_start[i] = s;
        for (Py_ssize_t o = flow_start[i]; o < flow_start[i + 1]; o++)
            if (count[flow_links[o]] > 1) shared[s++] = flow_links[o];
        rates[i] = INFINITY;
        bottleneck[i] = -1;
    }
    shared_start[n] = s;

#define FIX(flow, share_, link_)                                                              \
    do {                                                                                      \
        Py_ssize_t f_ = (flow), l_ = (link_);                                                 \
        double sh_ = (share_);                                                                \
        fixed[f_] = 1;                                                                        \
        rates[f_] = sh_;                                                                      \
        bottleneck[f_] = l_;                                                                  \
        for (Py_ssize_t q_ = shared_start[f_]; q_ < shared_start[f_ + 1]; q_++) {             \
            Py_ssize_t other_ = shared[q_];                                                   \
            remaining[other_] -= sh_;                                                         \
            Py_ssize_t left_ = --count[other_];                                               \
            if (left_ > 0 && other_ != l_) {                                                  \
                Entry e_ = {remaining[other_] / (double)left_, other_};                       \
                if (heap_push(&heap, e_) < 0) { PyErr_NoMemory(); goto done; }                \
            }                                                                                 \
        }                                                                                     \
    } while (0)

    Py_ssize_t k = 0;
    while (heap.size || k < m) {
        if (k < m && (!heap.size || private[k].cap < heap.items[0].key ||
                      (private[k].cap == heap.items[0].key && private[k].order < heap.items[0].order))) {
            Private p = private[k++];
            if (!fixed[p.flow]) FIX(p.flow, 0.0 > p.cap ? 0.0 : p.cap, p.order); /* Python's max(cap, 0.0) */
            continue;
        }
        Entry top = heap_pop(&heap);
        Py_ssize_t link = top.order, left = count[link];
        if (left == 0 || top.key != remaining[link] / (double)left) continue; /* a stale entry */
        double share = 0.0 > top.key ? 0.0 : top.key;
        for (Py_ssize_t u = users_start[link]; u < users_start[link + 1]; u++)
            if (!fixed[users[u]]) FIX(users[u], share, link);
    }
#undef FIX

    {
        PyObject *rate_list = PyList_New(n), *link_list = PyList_New(n);
        if (!rate_list || !link_list) { Py_XDECREF(rate_list); Py_XDECREF(link_list); goto done; }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *r = PyFloat_FromDouble(rates[i]);
            if (!r) { Py_DECREF(rate_list); Py_DECREF(link_list); goto done; }
            PyList_SET_ITEM(rate_list, i, r);
            PyObject *b = bottleneck[i] < 0 ? Py_None : link_obj[bottleneck[i]];
            Py_INCREF(b);
            PyList_SET_ITEM(link_list, i, b);
        }
        result = PyTuple_Pack(2, rate_list, link_list);
        Py_DECREF(rate_list);
        Py_DECREF(link_list);
    }

done:
    PyMem_Free(heap.items);
    PyMem_Free(link_obj);
    PyMem_Free(remaining);
    PyMem_Free(last_user);
    PyMem_Free(count);
    PyMem_Free(users_start);
    PyMem_Free(fill);
    PyMem_Free(users);
    PyMem_Free(flow_start);
    PyMem_Free(flow_links);
    PyMem_Free(shared_start);
    PyMem_Free(shared);
    PyMem_Free(rates);
    PyMem_Free(bottleneck);
    PyMem_Free(fixed);
    PyMem_Free(private);
    Py_XDECREF(index);
    Py_DECREF(paths);
    return result;
}

static PyMethodDef METHODS[] = {
    {"max_min_fill", max_min_fill, METH_VARARGS,
     "max_min_fill(paths, capacity, override=None) -> (rates, bottlenecks): max-min fair rates."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_flowfill", "Max-min fair water-filling.", -1, METHODS};

PyMODINIT_FUNC PyInit__flowfill(void) { return PyModule_Create(&MODULE); }
