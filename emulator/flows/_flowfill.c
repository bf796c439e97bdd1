/* Max-min fair water-filling, emulator/flows/links.py's `max_min_fill_py` compiled (and below it the flow
 * model's rebalance around it).
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
#include <structmember.h>
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

/* ---- FlowModel._rebalance ------------------------------------------------------------------
 *
 * emulator/flows/links.py's `FlowModel._rebalance_py` compiled: the sync of every active flow, the window
 * caps, the filling above, then each flow's bottleneck, TcpTransport.after_rates, the next event
 * (FlowModel._schedule, TcpTransport.next_event), the links' load and the standing queues
 * (_excess_of, _add_excess, _link_queue). The same double operations in the same order, on the
 * same records (read and written in place, above), so a run gives the same times to the last
 * bit with either. It knows windows and pacing rates, not a congestion control: when a window starts
 * to limit its flow it calls the connection's congestion control back (transport.on_window_limited,
 * emulator/flows/congestion.py), and so FlowModel._instant_bits (a flow on a path without any finite
 * link). links.py uses this only while none of the methods it writes
 * out is overridden (links._hooks_are_ours): a subclass that overrides one gets the Python version. */

#define NAMES(X) X(flows) X(active) X(tcp) X(synced_t) X(rate) X(remaining_bits) X(budget) X(loss_in) \
    X(phase) X(path) X(conn) X(cwnd) X(seg_bits) X(rtt_base) X(window_key) X(window_path) X(t)          \
    X(transport) X(qdelay) X(excess) X(fill) X(capacity) X(unsettled) X(bottleneck) X(link_bottleneck)  \
    X(share) X(limited) X(done_at) X(version) X(round_end) X(load) X(pinned) X(held) X(queue_s)         \
    X(_instant_bits) X(open) X(ss) X(ca) X(on_window_limited) X(pacing) X(wakeup)
#define DECLARE(name) static PyObject *S_##name;
NAMES(DECLARE)
#undef DECLARE

static const double EPS_BITS = 1e-6; /* emulator/flows/transport.py's EPS_BITS */
static PyObject *ONE;

static int is_phase(PyObject *phase, PyObject *name) {
    return phase == name || (PyUnicode_Check(phase) && PyUnicode_Compare(phase, name) == 0);
}

/* The records the flow model and the congestion control share (emulator/flows/records.py): this
   module owns their layout. FlowRecord, WindowRecord and ConnectionRecord are C structs whose fields
   Python reads and writes as attributes (members) and the rebalance reads and writes in place. Their
   Python classes (links.Flow, transport.TcpState, transport.Connection) subclass them and add
   nothing to the layout; for an instance of exactly the classes `bind_types` was given the fields
   are read in place, and any other object (a subclass, which may override a field with a property)
   goes through getattr and setattr. Every field is an object (D marks the ones that hold a float):
   the interpreter specializes attribute access to object members as it does to slots, while a
   double member costs a float's boxing at every read and write (3x slower in Python). */
#define FLOW_RECORD(D, O) O(path) D(remaining_bits) D(rate) O(version) D(done_at) O(tcp) O(active) D(share) \
    O(bottleneck) O(link_bottleneck) D(synced_t)
#define WINDOW_RECORD(D, O) O(conn) D(rtt_base) D(seg_bits) O(mss) D(loss) O(rng) O(phase) D(round_end) D(budget) \
    D(loss_in) D(recovery_until) D(floor) O(limited) D(resent_bits) D(pacing) O(queues) O(fid) O(path)            \
    O(window_key) O(window_path) D(wakeup)
#define CONNECTION_RECORD(D, O) D(cwnd) D(ssthresh) D(srtt) D(rtts) D(last_send) D(sending_since) O(active) O(waiting) O(cc) \
    O(control)

#define AS_OBJECT(n) PyObject *n;
typedef struct { PyObject_HEAD FLOW_RECORD(AS_OBJECT, AS_OBJECT) } FlowRecord;
typedef struct { PyObject_HEAD WINDOW_RECORD(AS_OBJECT, AS_OBJECT) } WindowRecord;
typedef struct { PyObject_HEAD CONNECTION_RECORD(AS_OBJECT, AS_OBJECT) } ConnectionRecord;

#define MEMBER_O(n) {#n, T_OBJECT_EX, offsetof(RECORD, n), 0, NULL},
#define VISIT(n) Py_VISIT(((RECORD *)self)->n);
#define CLEAR(n) Py_CLEAR(((RECORD *)self)->n);
#define RECORD_TYPE(name, FIELDS, doc)                                                                    \
    static PyMemberDef name##_members[] = {FIELDS(MEMBER_O, MEMBER_O){NULL, 0, 0, 0, NULL}};              \
    static int name##_traverse(PyObject *self, visitproc visit, void *arg) {                              \
        FIELDS(VISIT, VISIT)                                                                            \
        return 0;                                                                                         \
    }                                                                                                     \
    static int name##_clear(PyObject *self) {                                                             \
        FIELDS(CLEAR, CLEAR)                                                                            \
        return 0;                                                                                         \
    }                                                                                                     \
    static void name##_dealloc(PyObject *self) {                                                          \
        PyObject_GC_UnTrack(self);                                                                        \
        name##_clear(self);                                                                               \
        Py_TYPE(self)->tp_free(self);                                                                     \
    }                                                                                                     \
    static PyTypeObject name##Type = {                                                                    \
        PyVarObject_HEAD_INIT(NULL, 0).tp_name = "emulator.flows._flowfill." #name,                       \
        .tp_basicsize = sizeof(RECORD),                                                                   \
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,                        \
        .tp_doc = doc,                                                                                    \
        .tp_traverse = name##_traverse,                                                                   \
        .tp_clear = name##_clear,                                                                         \
        .tp_dealloc = name##_dealloc,                                                                     \
        .tp_members = name##_members,                                                                     \
        .tp_new = PyType_GenericNew,                                                                      \
    };
#define RECORD FlowRecord
RECORD_TYPE(FlowRecord, FLOW_RECORD, "A flow's fields (emulator/flows/links.py's Flow).")
#undef RECORD
#define RECORD WindowRecord
RECORD_TYPE(WindowRecord, WINDOW_RECORD, "A tcp flow's window state (emulator/flows/transport.py's TcpState).")
#undef RECORD
#define RECORD ConnectionRecord
RECORD_TYPE(ConnectionRecord, CONNECTION_RECORD, "A connection's window (emulator/flows/transport.py's Connection).")
#undef RECORD

enum { K_FLOW, K_STATE, K_CONN, K_KINDS };
static PyTypeObject *const RECORDS[K_KINDS] = {&FlowRecordType, &WindowRecordType, &ConnectionRecordType};
typedef struct {
    PyObject **name;
    int kind;
    Py_ssize_t offset; /* in the record's struct */
} Field;
static PyTypeObject *BOUND[K_KINDS];
#define FIELD(S, kind, n) static Field F_##n = {&S_##n, kind, offsetof(S, n)};
#define FLOW_D(n) FIELD(FlowRecord, K_FLOW, n)
#define FLOW_O(n) FIELD(FlowRecord, K_FLOW, n)
#define STATE_D(n) FIELD(WindowRecord, K_STATE, n)
#define STATE_O(n) FIELD(WindowRecord, K_STATE, n)
/* the fields the rebalance uses */
FLOW_O(active) FLOW_O(tcp) FLOW_D(synced_t) FLOW_D(rate) FLOW_D(remaining_bits) FLOW_O(path) FLOW_O(bottleneck)
FLOW_O(link_bottleneck) FLOW_D(share) FLOW_D(done_at) FLOW_O(version)
STATE_D(budget) STATE_D(loss_in) STATE_O(phase) STATE_O(conn) STATE_D(seg_bits) STATE_D(rtt_base) STATE_O(window_key)
STATE_O(window_path) STATE_O(limited) STATE_D(round_end) STATE_D(pacing) STATE_D(wakeup)
FIELD(ConnectionRecord, K_CONN, cwnd)

static inline char *record_of(PyObject *obj, const Field *f) {
    return Py_TYPE(obj) == BOUND[f->kind] ? (char *)obj + f->offset : NULL;
}

static PyObject *get(PyObject *obj, const Field *f) { /* a new reference */
    char *at = record_of(obj, f);
    if (!at) return PyObject_GetAttr(obj, *f->name);
    PyObject *value = *(PyObject **)at;
    if (!value) {
        PyErr_SetObject(PyExc_AttributeError, *f->name);
        return NULL;
    }
    Py_INCREF(value);
    return value;
}

static int as_double(PyObject *value, double *out) {
    double v = PyFloat_CheckExact(value) ? PyFloat_AS_DOUBLE(value) : PyFloat_AsDouble(value);
    if (v == -1.0 && PyErr_Occurred()) return -1;
    *out = v;
    return 0;
}

static int set(PyObject *obj, const Field *f, PyObject *value) {
    char *at = record_of(obj, f);
    if (!at) return PyObject_SetAttr(obj, *f->name, value);
    PyObject *old = *(PyObject **)at;
    Py_INCREF(value);
    *(PyObject **)at = value;
    Py_XDECREF(old);
    return 0;
}

static int get_double(PyObject *obj, const Field *f, double *out) {
    char *at = record_of(obj, f);
    if (at && *(PyObject **)at && PyFloat_CheckExact(*(PyObject **)at)) {
        *out = PyFloat_AS_DOUBLE(*(PyObject **)at);
        return 0;
    }
    PyObject *value = get(obj, f);
    if (!value) return -1;
    int r = as_double(value, out);
    Py_DECREF(value);
    return r;
}

static int set_double(PyObject *obj, const Field *f, double v) {
    PyObject *value = PyFloat_FromDouble(v);
    if (!value) return -1;
    int r = set(obj, f, value);
    Py_DECREF(value);
    return r;
}

/* bind_types(Flow, TcpState, Connection): the classes whose records are read in place. Each must
   derive from its record type and leave every field as the record's member (no property in its
   place); else it is refused. */
static PyObject *bind_types(PyObject *module, PyObject *args) {
    PyObject *types[K_KINDS];
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyType_Type, &types[0], &PyType_Type, &types[1], &PyType_Type, &types[2])) return NULL;
    for (int k = 0; k < K_KINDS; k++) {
        if (!PyType_IsSubtype((PyTypeObject *)types[k], RECORDS[k])) {
            PyErr_Format(PyExc_TypeError, "bind_types: %R is not a %s", types[k], RECORDS[k]->tp_name);
            return NULL;
        }
        for (PyMemberDef *m = RECORDS[k]->tp_members; m->name; m++) {
            PyObject *mine = PyDict_GetItemString(RECORDS[k]->tp_dict, m->name); /* borrowed */
            PyObject *theirs = PyObject_GetAttrString(types[k], m->name);
            if (!theirs) return NULL;
            Py_DECREF(theirs);
            if (theirs != mine) {
                PyErr_Format(PyExc_TypeError, "bind_types: %R overrides the field %s", types[k], m->name);
                return NULL;
            }
        }
    }
    for (int k = 0; k < K_KINDS; k++) {
        Py_INCREF(types[k]);
        Py_XSETREF(BOUND[k], (PyTypeObject *)types[k]);
    }
    Py_RETURN_NONE;
}

/* map.get(key, default) as a double: 1 found, 0 absent, -1 error */
static int dict_double(PyObject *map, PyObject *key, double *out) {
    PyObject *value;
    if (PyDict_CheckExact(map)) {
        value = PyDict_GetItemWithError(map, key);
        if (!value) return PyErr_Occurred() ? -1 : 0;
        return as_double(value, out) < 0 ? -1 : 1;
    }
    value = PyObject_GetItem(map, key);
    if (!value) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError)) return -1;
        PyErr_Clear();
        return 0;
    }
    int r = as_double(value, out) < 0 ? -1 : 1;
    Py_DECREF(value);
    return r;
}

static int truthy_attr(PyObject *obj, const Field *f) {
    PyObject *value = get(obj, f);
    if (!value) return -1;
    int r = PyObject_IsTrue(value);
    Py_DECREF(value);
    return r;
}

/* a flow's path as a fast sequence (a new reference) */
static PyObject *path_of(PyObject *obj, const Field *f) {
    PyObject *path = get(obj, f);
    if (!path) return NULL;
    PyObject *seq = PySequence_Fast(path, "a flow's path must be a sequence");
    Py_DECREF(path);
    return seq;
}

/* FlowModel.path_qdelay: the queues' delays along the path, summed in its order */
static int path_qdelay(PyObject *qdelay, PyObject *obj, const Field *f, double *out) {
    PyObject *seq = path_of(obj, f);
    if (!seq) return -1;
    double total = 0.0;
    for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(seq); j++) {
        double q;
        int found = dict_double(qdelay, PySequence_Fast_GET_ITEM(seq, j), &q);
        if (found < 0) { Py_DECREF(seq); return -1; }
        total += found ? q : 0.0;
    }
    Py_DECREF(seq);
    *out = total;
    return 0;
}

/* entry[index] += by (the held list [bits, count] of _add_excess) */
static int list_add(PyObject *entry, Py_ssize_t index, PyObject *by) {
    PyObject *sum = PyNumber_Add(PyList_GET_ITEM(entry, index), by);
    if (!sum) return -1;
    return PyList_SetItem(entry, index, sum);
}

static PyObject *rebalance(PyObject *module, PyObject *args) {
    PyObject *model, *force = Py_None;
    if (!PyArg_ParseTuple(args, "O|O", &model, &force)) return NULL;
    PyObject *t_obj = NULL, *transport = NULL, *qdelay = NULL, *standing = NULL, *fill = NULL, *capacity = NULL;
    PyObject *flows = NULL, *fids = NULL, *objs = NULL, *paths = NULL, *caps = NULL, *filled = NULL;
    PyObject *changed = NULL, *load = NULL, *pinned = NULL, *excess = NULL, *held = NULL, *queue_s = NULL;
    PyObject *new_qdelay = NULL, *new_fill = NULL, *result = NULL;
    PyObject *flow = NULL, *st = NULL, *conn = NULL, *phase = NULL, *value = NULL;
    double t;

    if (PyObject_SetAttr(model, S_unsettled, Py_False) < 0) return NULL;
    if (!(t_obj = PyObject_GetAttr(model, S_t)) || as_double(t_obj, &t) < 0) goto done;
    if (!(transport = PyObject_GetAttr(model, S_transport))) goto done;
    if (!(qdelay = PyObject_GetAttr(model, S_qdelay))) goto done;
    if (!(standing = PyObject_GetAttr(model, S_excess))) goto done;
    if (!(fill = PyObject_GetAttr(model, S_fill))) goto done;
    if (!(capacity = PyObject_GetAttr(model, S_capacity))) goto done;
    if (!(flows = PyObject_GetAttr(model, S_flows))) goto done;
    if (!PyDict_Check(flows)) { PyErr_SetString(PyExc_TypeError, "FlowModel.flows must be a dict"); goto done; }
    if (!(fids = PyList_New(0)) || !(objs = PyList_New(0)) || !(paths = PyList_New(0)) || !(caps = PyDict_New())) goto done;
    const int queued_any = PyObject_IsTrue(qdelay);
    if (queued_any < 0) goto done;

    /* the sync, and each flow's path with its window cap (if any) */
    {
        Py_ssize_t pos = 0;
        PyObject *fid, *item;
        while (PyDict_Next(flows, &pos, &fid, &item)) {
            flow = item;
            Py_INCREF(flow);
            int on = truthy_attr(flow, &F_active);
            if (on < 0) goto done;
            if (!on) { Py_CLEAR(flow); continue; }
            if (PyList_Append(fids, fid) < 0 || PyList_Append(objs, flow) < 0) goto done;
            if (!(st = get(flow, &F_tcp))) goto done;
            double synced, rate;
            if (get_double(flow, &F_synced_t, &synced) < 0 || get_double(flow, &F_rate, &rate) < 0) goto done;
            double dt = t - synced;
            if (dt > 0 && rate > 0) {
                double bits, remaining;
                if (rate < INFINITY) {
                    bits = rate * dt;
                } else {
                    if (!(value = PyObject_CallMethodOneArg(model, S__instant_bits, flow)) || as_double(value, &bits) < 0) goto done;
                    Py_CLEAR(value);
                }
                if (get_double(flow, &F_remaining_bits, &remaining) < 0) goto done;
                if (bits > remaining) bits = remaining;
                if (set_double(flow, &F_remaining_bits, remaining - bits) < 0) goto done;
                if (st != Py_None) {
                    double budget, loss_in;
                    if (get_double(st, &F_budget, &budget) < 0) goto done;
                    if (budget < INFINITY) {
                        double left = budget - bits;
                        if (set_double(st, &F_budget, left > 0.0 ? left : 0.0) < 0) goto done; /* max(0.0, left) */
                    }
                    if (get_double(st, &F_loss_in, &loss_in) < 0) goto done;
                    if (loss_in < INFINITY && set_double(st, &F_loss_in, loss_in - bits) < 0) goto done;
                }
            }
            if (set(flow, &F_synced_t, t_obj) < 0) goto done;
            int windowed = 0; /* whether the flow's window goes to the filling as a link of its path */
            if (st != Py_None) {
                if (!(phase = get(st, &F_phase))) goto done;
                double cap = INFINITY;
                int capped = 0;
                if (is_phase(phase, S_ss)) {
                    /* TcpTransport.cap: nothing while the round's budget is spent, else the pacing rate */
                    double budget;
                    if (get_double(st, &F_budget, &budget) < 0) goto done;
                    if (!(budget > EPS_BITS)) {
                        cap = 0.0;
                    } else if (get_double(st, &F_pacing, &cap) < 0) goto done;
                    capped = 1;
                } else if (!is_phase(phase, S_open)) {
                    /* TcpTransport.cap: W over the RTT (path_qdelay's sum, in its order) less the
                       flow's own standing queue (own_qdelay) */
                    double queued = 0.0, own = 0.0, cwnd, seg_bits, rtt_base;
                    if (queued_any && path_qdelay(qdelay, flow, &F_path, &queued) < 0) goto done;
                    PyObject *part = PyDict_Check(standing) ? PyDict_GetItemWithError(standing, fid) : NULL;
                    if (!part && PyErr_Occurred()) goto done;
                    if (part && (!PyTuple_Check(part) || PyTuple_GET_SIZE(part) != 2)) {
                        PyErr_SetString(PyExc_TypeError, "FlowModel.excess holds (link, bits) pairs");
                        goto done;
                    }
                    if (part) {
                        PyObject *link = PyTuple_GET_ITEM(part, 0);
                        double share;
                        int found = dict_double(fill, link, &share);
                        if (found < 0) goto done;
                        if (found) {
                            double bits, link_cap;
                            if (as_double(PyTuple_GET_ITEM(part, 1), &bits) < 0) goto done;
                            if (!(value = PyObject_GetItem(capacity, link)) || as_double(value, &link_cap) < 0) goto done;
                            Py_CLEAR(value);
                            own = bits * share / link_cap;
                        }
                    }
                    if (!(conn = get(st, &F_conn))) goto done;
                    if (get_double(conn, &F_cwnd, &cwnd) < 0 || get_double(st, &F_seg_bits, &seg_bits) < 0 ||
                        get_double(st, &F_rtt_base, &rtt_base) < 0) goto done;
                    Py_CLEAR(conn);
                    double rtt = (rtt_base + queued) - own;
                    if (rtt == 0.0) { PyErr_SetString(PyExc_ZeroDivisionError, "float division by zero"); goto done; }
                    double pacing;
                    if (get_double(st, &F_pacing, &pacing) < 0) goto done;
                    cap = cwnd * seg_bits / rtt;
                    if (pacing < cap) cap = pacing; /* min(window, pacing) */
                    capped = 1;
                }
                Py_CLEAR(phase);
                if (capped && cap < INFINITY) {
                    PyObject *key = get(st, &F_window_key);
                    if (!key) goto done;
                    PyObject *c = PyFloat_FromDouble(cap);
                    int r = c ? PyDict_SetItem(caps, key, c) : -1;
                    Py_DECREF(key);
                    Py_XDECREF(c);
                    if (r < 0) goto done;
                    windowed = 1;
                }
            }
            PyObject *path = windowed ? get(st, &F_window_path) : get(flow, &F_path);
            if (!path) goto done;
            int r = PyList_Append(paths, path);
            Py_DECREF(path);
            if (r < 0) goto done;
            Py_CLEAR(st);
            Py_CLEAR(flow);
        }
    }
    {
        PyObject *fill_args = PyTuple_Pack(3, paths, capacity, caps);
        if (!fill_args) goto done;
        filled = max_min_fill(module, fill_args);
        Py_DECREF(fill_args);
        if (!filled) goto done;
    }
    PyObject *rates = PyTuple_GET_ITEM(filled, 0), *bottlenecks = PyTuple_GET_ITEM(filled, 1);
    if (!(changed = PyList_New(0))) goto done;
    const int tcp = transport != Py_None;
    if (tcp) {
        if (!(load = PyDict_New()) || !(pinned = PySet_New(NULL)) || !(excess = PyDict_New()) || !(held = PyDict_New())) goto done;
        if (PyObject_SetAttr(model, S_load, load) < 0 || PyObject_SetAttr(model, S_pinned, pinned) < 0) goto done;
    }

    /* each flow's bottleneck, window state, next event, and its part of the links' load and queues */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(objs); i++) {
        PyObject *fid = PyList_GET_ITEM(fids, i), *rate_obj = PyList_GET_ITEM(rates, i), *link = PyList_GET_ITEM(bottlenecks, i);
        flow = PyList_GET_ITEM(objs, i);
        Py_INCREF(flow);
        double rate = PyFloat_AS_DOUBLE(rate_obj);
        if (!(st = get(flow, &F_tcp))) goto done;
        int limited = 0;
        if (link != Py_None && st != Py_None) {
            PyObject *key = get(st, &F_window_key);
            if (!key) goto done;
            limited = PyObject_RichCompareBool(link, key, Py_EQ);
            Py_DECREF(key);
            if (limited < 0) goto done;
        }
        if (set(flow, &F_bottleneck, link) < 0) goto done;
        if (!limited) {
            if (set(flow, &F_link_bottleneck, link) < 0) goto done;
            if (rate > 0 && set(flow, &F_share, rate_obj) < 0) goto done;
        }
        int ca = 0;
        if (st != Py_None) {
            if (!(phase = get(st, &F_phase))) goto done;
            ca = is_phase(phase, S_ca);
            Py_CLEAR(phase);
        }
        if (ca) { /* TcpTransport.after_rates */
            int was = truthy_attr(st, &F_limited);
            if (was < 0 || set(st, &F_limited, limited ? Py_True : Py_False) < 0) goto done;
            if (limited && !was) { /* the congestion control's window now limits the flow */
                if (!(value = PyObject_CallMethodObjArgs(transport, S_on_window_limited, st, t_obj, NULL))) goto done;
                Py_CLEAR(value);
            }
        }
        double flow_rate, done_at;
        if (get_double(flow, &F_rate, &flow_rate) < 0 || get_double(flow, &F_done_at, &done_at) < 0) goto done;
        int forced = 0;
        if (force != Py_None && (forced = PyObject_RichCompareBool(fid, force, Py_EQ)) < 0) goto done;
        if (rate != flow_rate || done_at >= INFINITY || forced) { /* FlowModel._schedule */
            if (set(flow, &F_rate, rate_obj) < 0) goto done;
            flow_rate = rate;
            PyObject *version = get(flow, &F_version), *next;
            if (!version) goto done;
            next = PyNumber_Add(version, ONE);
            Py_DECREF(version);
            if (!next) goto done;
            if (set(flow, &F_version, next) < 0) { Py_DECREF(next); goto done; }
            PyObject *due_obj = NULL;
            double remaining;
            if (get_double(flow, &F_remaining_bits, &remaining) < 0) { Py_DECREF(next); goto done; }
            if (st != Py_None) { /* TcpTransport.next_event */
                double due = INFINITY, loss_in, budget, round_end, wakeup;
                if (!(phase = get(st, &F_phase)) || get_double(st, &F_loss_in, &loss_in) < 0 ||
                    get_double(st, &F_budget, &budget) < 0 || get_double(st, &F_round_end, &round_end) < 0 ||
                    get_double(st, &F_wakeup, &wakeup) < 0) { Py_DECREF(next); goto done; }
                const int ss = is_phase(phase, S_ss);
                const int ca_now = !ss && is_phase(phase, S_ca);
                Py_CLEAR(phase);
                if (rate > 0) {
                    if (rate < INFINITY) {
                        due = t + remaining / rate;
                        if (loss_in < INFINITY) {
                            double at = t + loss_in / rate;
                            if (at < due) due = at;
                        }
                        if (ss && budget > EPS_BITS) {
                            double at = t + budget / rate;
                            if (at < due) due = at;
                        }
                    } else {
                        due = t;
                    }
                }
                int rounds = ss;
                if (ca_now && (rounds = truthy_attr(st, &F_limited)) < 0) { Py_DECREF(next); goto done; }
                if (rounds && round_end < due) due = round_end;
                if (wakeup < due) due = wakeup;
                due_obj = PyFloat_FromDouble(due);
            } else if (remaining <= 0 || rate == INFINITY) {
                due_obj = t_obj;
                Py_INCREF(due_obj);
            } else {
                due_obj = PyFloat_FromDouble(rate > 0 ? t + remaining / rate : INFINITY);
            }
            if (!due_obj || set(flow, &F_done_at, due_obj) < 0) { Py_XDECREF(due_obj); Py_DECREF(next); goto done; }
            double due = PyFloat_AsDouble(due_obj);
            if (due < INFINITY) {
                PyObject *event = PyTuple_Pack(3, fid, due_obj, next);
                int r = event ? PyList_Append(changed, event) : -1;
                Py_XDECREF(event);
                if (r < 0) { Py_DECREF(due_obj); Py_DECREF(next); goto done; }
            }
            Py_DECREF(due_obj);
            Py_DECREF(next);
        }
        if (tcp) {
            if (link != Py_None && !limited && PySet_Add(pinned, link) < 0) goto done;
            if (rate < INFINITY) {
                PyObject *seq = path_of(flow, &F_path);
                if (!seq) goto done;
                for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(seq); j++) {
                    PyObject *on = PySequence_Fast_GET_ITEM(seq, j);
                    double before = 0.0;
                    int found = dict_double(load, on, &before), r = -1;
                    if (found >= 0) {
                        PyObject *sum = PyFloat_FromDouble(before + rate);
                        r = sum ? PyDict_SetItem(load, on, sum) : -1;
                        Py_XDECREF(sum);
                    }
                    if (r < 0) { Py_DECREF(seq); goto done; }
                }
                Py_DECREF(seq);
            }
            if (ca) {
                /* FlowModel._excess_of: the window beyond the flow's BDP waits at its bottleneck */
                if (!(phase = get(st, &F_phase))) goto done;
                int still_ca = is_phase(phase, S_ca);
                Py_CLEAR(phase);
                int lim = truthy_attr(st, &F_limited);
                if (lim < 0) goto done;
                PyObject *at = get(flow, &F_link_bottleneck);
                if (!at) goto done;
                if (still_ca && !lim && at != Py_None && flow_rate < INFINITY) {
                    double cwnd, seg_bits, rtt_base, pacing;
                    if (!(conn = get(st, &F_conn)) || get_double(conn, &F_cwnd, &cwnd) < 0 ||
                        get_double(st, &F_seg_bits, &seg_bits) < 0 || get_double(st, &F_rtt_base, &rtt_base) < 0 ||
                        get_double(st, &F_pacing, &pacing) < 0) { Py_DECREF(at); goto done; }
                    Py_CLEAR(conn);
                    double inflight = cwnd * seg_bits, paced = pacing * rtt_base;
                    if (paced < inflight) inflight = paced; /* min(window, pacing over the RTT) */
                    double bits = inflight - flow_rate * rtt_base;
                    if (bits > 0) { /* _add_excess */
                        PyObject *bits_obj = PyFloat_FromDouble(bits);
                        PyObject *part = bits_obj ? PyTuple_Pack(2, at, bits_obj) : NULL;
                        int r = part ? PyDict_SetItem(excess, fid, part) : -1;
                        Py_XDECREF(part);
                        PyObject *entry = r < 0 ? NULL : PyDict_GetItemWithError(held, at);
                        if (r == 0 && !entry && !PyErr_Occurred()) {
                            entry = Py_BuildValue("[di]", 0.0, 0);
                            r = entry ? PyDict_SetItem(held, at, entry) : -1;
                            Py_XDECREF(entry); /* held keeps it */
                        }
                        if (r == 0 && !entry) r = -1;
                        if (r == 0) r = list_add(entry, 0, bits_obj);
                        if (r == 0) r = list_add(entry, 1, ONE);
                        Py_XDECREF(bits_obj);
                        if (r < 0) { Py_DECREF(at); goto done; }
                    }
                }
                Py_DECREF(at);
            }
        }
        Py_CLEAR(st);
        Py_CLEAR(flow);
    }

    if (tcp) {
        /* the standing queues in place: FlowModel._link_queue for every link that holds some */
        if (!(new_qdelay = PyDict_New()) || !(new_fill = PyDict_New())) goto done;
        if (!(queue_s = PyObject_GetAttr(model, S_queue_s))) goto done;
        Py_ssize_t pos = 0;
        PyObject *link, *entry;
        while (PyDict_Next(held, &pos, &link, &entry)) {
            double bits, cap, buffer_s = 0.0;
            int found = dict_double(capacity, link, &cap);
            if (found < 0 || as_double(PyList_GET_ITEM(entry, 0), &bits) < 0) goto done;
            if (!found) cap = INFINITY;
            if (cap >= INFINITY || bits <= 0) continue;
            if (dict_double(queue_s, link, &buffer_s) < 0) goto done;
            double room = buffer_s * cap, queued = room < bits ? room : bits; /* min(bits, room) */
            PyObject *q = PyFloat_FromDouble(queued / cap), *f = PyFloat_FromDouble(queued / bits);
            int r = (q && f) ? PyDict_SetItem(new_qdelay, link, q) : -1;
            if (r == 0) r = PyDict_SetItem(new_fill, link, f);
            Py_XDECREF(q);
            Py_XDECREF(f);
            if (r < 0) goto done;
        }
        if (PyObject_SetAttr(model, S_excess, excess) < 0 || PyObject_SetAttr(model, S_held, held) < 0 ||
            PyObject_SetAttr(model, S_qdelay, new_qdelay) < 0 || PyObject_SetAttr(model, S_fill, new_fill) < 0) goto done;
    }
    result = changed;
    changed = NULL;

done:
    Py_XDECREF(flow);
    Py_XDECREF(st);
    Py_XDECREF(conn);
    Py_XDECREF(phase);
    Py_XDECREF(value);
    Py_XDECREF(t_obj);
    Py_XDECREF(transport);
    Py_XDECREF(qdelay);
    Py_XDECREF(standing);
    Py_XDECREF(fill);
    Py_XDECREF(capacity);
    Py_XDECREF(flows);
    Py_XDECREF(fids);
    Py_XDECREF(objs);
    Py_XDECREF(paths);
    Py_XDECREF(caps);
    Py_XDECREF(filled);
    Py_XDECREF(changed);
    Py_XDECREF(load);
    Py_XDECREF(pinned);
    Py_XDECREF(excess);
    Py_XDECREF(held);
    Py_XDECREF(queue_s);
    Py_XDECREF(new_qdelay);
    Py_XDECREF(new_fill);
    return result;
}

static PyMethodDef METHODS[] = {
    {"max_min_fill", max_min_fill, METH_VARARGS,
     "max_min_fill(paths, capacity, override=None) -> (rates, bottlenecks): max-min fair rates."},
    {"bind_types", bind_types, METH_VARARGS,
     "bind_types(Flow, TcpState, Connection): the classes whose records rebalance reads in place."},
    {"rebalance", rebalance, METH_VARARGS,
     "rebalance(model, force=None) -> changed: FlowModel._rebalance_py's work on `model`, compiled."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_flowfill", "Max-min fair water-filling and the flow model's rebalance.", -1, METHODS};

PyMODINIT_FUNC PyInit__flowfill(void) {
#define INTERN(name) if (!(S_##name = PyUnicode_InternFromString(#name))) return NULL;
    NAMES(INTERN)
#undef INTERN
    if (!ONE && !(ONE = PyLong_FromLong(1))) return NULL;
    PyObject *module = PyModule_Create(&MODULE);
    if (!module) return NULL;
    static const char *const names[K_KINDS] = {"FlowRecord", "WindowRecord", "ConnectionRecord"};
    for (int k = 0; k < K_KINDS; k++) {
        if (PyType_Ready(RECORDS[k]) < 0) { Py_DECREF(module); return NULL; }
        Py_INCREF(RECORDS[k]);
        if (PyModule_AddObject(module, names[k], (PyObject *)RECORDS[k]) < 0) {
            Py_DECREF(RECORDS[k]);
            Py_DECREF(module);
            return NULL;
        }
    }
    return module;
}
