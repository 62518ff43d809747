/* mgjit's launch fast path: one C call per `kernel[grid](...)` binds the arguments, computes the dispatch key
 * from the torch tensors (through the DLPack C exchange API: no Python attribute access), finds the launch
 * plan, packs the parameter buffer, encodes the TMA descriptors and calls cuLaunchKernel(Ex) on torch's
 * current stream. Anything unusual goes back to Python: a miss (which compiles and returns a plan), or the
 * slow path (which explains, or runs the call in Python).
 *
 * Built on first use by mgjit/fastlaunch.py with the system C compiler. It needs no CUDA or DLPack headers
 * (the few types it reads are declared here, as the driver API and DLPack 1.x define them) and finds the
 * driver with dlopen, or takes a stub driver that reports each launch to a Python hook (tests on machines
 * without a GPU). The field codes and error returns come from mgjit/abi.py as -D definitions.
 *
 * The dispatch key of a call is one 64-bit word per runtime argument (layout below; `decode` turns it back
 * into the parts mgjit.specialize.argument_key() computes, which Python checks on every miss) plus the
 * constexpr values, num_warpgroups and cluster as objects, compared by type and equality. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if !defined(MGJIT_FIELD_PTR) || !defined(MGJIT_FIELD_I32) || !defined(MGJIT_FIELD_I64) || \
    !defined(MGJIT_FIELD_F32) || !defined(MGJIT_FIELD_F64) || !defined(MGJIT_FIELD_I1) || \
    !defined(MGJIT_FIELD_TENSORMAP) || !defined(MGJIT_E_VALUE) || !defined(MGJIT_E_LAYOUT) || \
    !defined(MGJIT_E_CONTEXT)
#error "build with the definitions of mgjit.abi.c_defines()"
#endif

/* ---- DLPack 1.x: the parts of dlpack.h read here */
typedef struct { uint32_t major, minor; } DLPackVersion;
typedef struct { int32_t device_type, device_id; } DLDevice;
typedef struct { uint8_t code, bits; uint16_t lanes; } DLDataType;
typedef struct {
    void *data; DLDevice device; int32_t ndim; DLDataType dtype; int64_t *shape; int64_t *strides;
    uint64_t byte_offset;
} DLTensor;
typedef struct {
    DLPackVersion version; void *prev_api; void *managed_tensor_allocator; void *managed_tensor_from_py_object;
    void *managed_tensor_to_py_object; int (*dltensor_from_py_object)(void *, DLTensor *);
    int (*current_work_stream)(int32_t device_type, int32_t device_id, void **stream);
} DLPackExchangeAPI;
enum { DL_CPU = 1, DL_CUDA = 2 };

/* ---- the driver API: the functions and the launch-config types used here (cuda.h) */
typedef struct { unsigned x, y, z; } ClusterDim;
typedef struct { int id; char pad[4]; union { char bytes[64]; ClusterDim cluster; } value; } LaunchAttribute;
typedef struct {
    unsigned grid[3], block[3], smem; void *stream; LaunchAttribute *attrs; unsigned nattrs;
} LaunchConfig;
enum { ATTRIBUTE_CLUSTER_DIMENSION = 4 };
typedef int (*launch_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned smem, void *stream, void **params, void **extra);
typedef int (*launch_ex_fn)(const LaunchConfig *config, void *f, void **params, void **extra);
typedef int (*context_fn)(void **ctx);
typedef int (*encode_fn)(void *map, int dtype, uint32_t rank, void *address, const uint64_t *dims,
                         const uint64_t *strides, const uint32_t *box, const uint32_t *element_strides,
                         int interleave, int swizzle, int l2_promotion, int oob_fill);

static launch_fn cu_launch;
static launch_ex_fn cu_launch_ex;
static context_fn cu_context;
static encode_fn cu_encode;
static int stub_driver;      /* launches go to stub_hook, or nowhere when it is NULL (timing the rest) */
static PyObject *stub_hook;

/* ---- what mgjit.fastlaunch.configure() sets */
static const DLPackExchangeAPI *dlpack;
static PyObject *tensor_types;  /* tuple of the exact types read through DLPack (torch.Tensor, Parameter) */
static PyObject *launch_failed; /* failed(name, rc): raises the error that a launch's return code means */
#define MAX_DTYPES 32
static DLDataType dtype_table[MAX_DTYPES]; /* a tensor's key names its dtype by its index here */
static int dtype_count;

#define MAX_FIELDS 512
#define MAX_BUFFER 4096 /* the kernel-parameter limit of cuLaunchKernel */
#define MAX_ARGS 64
#define MAX_TMA_RANK 5

/* ---- dispatch-key words */
enum { TAG_TENSOR = 1, TAG_INT = 2, TAG_FLOAT = 3, TAG_BOOL = 4 };

static int log2_small(uint64_t x) { int n = 0; while (x > 1) { x >>= 1; n++; } return n; }

/* The largest power of two <= 16 dividing x (16 for a multiple of 16): mgjit.specialize.DIV_CLASS. */
static uint64_t div_class(uint64_t x) { x &= 15; return x ? (x & (~x + 1)) : 16; }

typedef struct { DLTensor t; long long i; double d; int tag; } ArgValue;

/* A tensor's stride in elements along dimension d (DLPack leaves strides NULL for a compact tensor). */
static int64_t stride_at(const DLTensor *t, int d) {
    if (t->strides) return t->strides[d];
    int64_t s = 1;
    for (int e = d + 1; e < t->ndim; e++) s *= t->shape[e];
    return s;
}

/* The key word of one runtime argument (and its launch value in `out`): 0 when the fast path does not take
 * it (another type, a tensor not on a CUDA device, an int beyond 64 bits), with no Python error set. */
static uint64_t key_word(PyObject *v, ArgValue *out) {
    PyTypeObject *type = Py_TYPE(v);
    if (type == &PyLong_Type) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (x == -1 && PyErr_Occurred())) { PyErr_Clear(); return 0; }
        out->i = x;
        out->tag = TAG_INT;
        return TAG_INT | (uint64_t)(x >= INT32_MIN && x <= INT32_MAX) << 8 | (uint64_t)((x & 15) == 0) << 9;
    }
    if (type == &PyFloat_Type) { out->d = PyFloat_AS_DOUBLE(v); out->tag = TAG_FLOAT; return TAG_FLOAT; }
    if (type == &PyBool_Type) { out->i = v == Py_True; out->tag = TAG_BOOL; return TAG_BOOL; }
    Py_ssize_t n = PyTuple_GET_SIZE(tensor_types), k;
    for (k = 0; k < n && (PyObject *)type != PyTuple_GET_ITEM(tensor_types, k); k++) {}
    if (k == n) return 0;
    DLTensor *t = &out->t;
    if (dlpack->dltensor_from_py_object(v, t) != 0) { PyErr_Clear(); return 0; }
    /* the device as torch's get_device() gives it: a CUDA ordinal, -1 for the host */
    int32_t device = t->device.device_type == DL_CUDA ? t->device.device_id : -1;
    if ((t->device.device_type != DL_CUDA && t->device.device_type != DL_CPU) || t->ndim > 255) return 0;
    int dtype = 0;
    while (dtype < dtype_count && memcmp(&dtype_table[dtype], &t->dtype, sizeof(DLDataType))) dtype++;
    if (dtype == dtype_count) return 0;
    uint64_t bits = (uint64_t)(uintptr_t)t->data + t->byte_offset, itemsize = (t->dtype.bits * t->dtype.lanes + 7) / 8;
    int rank = t->ndim, unit = 1;
    uint64_t last = 1;
    if (rank > 0) {
        last = (uint64_t)t->shape[rank - 1];
        unit = stride_at(t, rank - 1) == 1 || last == 1;
        for (int d = 0; d < rank - 1; d++) bits |= (uint64_t)stride_at(t, d) * itemsize;
    }
    out->tag = TAG_TENSOR;
    return TAG_TENSOR | (uint64_t)dtype << 8 | (uint64_t)rank << 16 | (uint64_t)log2_small(div_class(bits)) << 24 |
           (uint64_t)unit << 27 | (uint64_t)log2_small(div_class(last)) << 28 | (uint64_t)(uint32_t)device << 32;
}

/* ---- a hash table from (key words, key objects) to a value */
typedef struct { Py_hash_t hash; uint64_t *words; PyObject *objects; PyObject *value; } Entry;
typedef struct { Entry *entries; Py_ssize_t capacity, used, nwords, nobjects; } Table;

static Py_hash_t hash_key(const uint64_t *words, Py_ssize_t nwords, PyObject *const *objects, Py_ssize_t nobjects) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)nwords;
    for (Py_ssize_t i = 0; i < nwords; i++) { h ^= words[i]; h *= 0xff51afd7ed558ccdULL; h ^= h >> 33; }
    for (Py_ssize_t i = 0; i < nobjects; i++) {
        Py_hash_t o = PyObject_Hash(objects[i]);
        if (o == -1) return -1;
        h ^= (uint64_t)o; h *= 0xc4ceb9fe1a85ec53ULL; h ^= h >> 29;
    }
    Py_hash_t out = (Py_hash_t)(h >> 1);
    return out == -1 ? 1 : out;
}

/* Equal constexprs: the same object, or of the same type and ==, so that 1, 1.0 and True differ. */
static int same_object(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    if (Py_TYPE(a) != Py_TYPE(b)) return 0;
    return PyObject_RichCompareBool(a, b, Py_EQ);
}

/* The entry for the key, or NULL (-1 in *error when a comparison raised). */
static Entry *table_find(Table *t, Py_hash_t hash, const uint64_t *words, PyObject *const *objects, int *error) {
    *error = 0;
    if (!t->capacity) return NULL;
    for (Py_ssize_t i = (size_t)hash & (t->capacity - 1);; i = (i + 1) & (t->capacity - 1)) {
        Entry *e = &t->entries[i];
        if (!e->value) return NULL;
        if (e->hash != hash || memcmp(e->words, words, t->nwords * sizeof(uint64_t))) continue;
        Py_ssize_t k = 0;
        for (; k < t->nobjects; k++) {
            int same = same_object(PyTuple_GET_ITEM(e->objects, k), objects[k]);
            if (same < 0) { *error = 1; return NULL; }
            if (!same) break;
        }
        if (k == t->nobjects) return e;
    }
}

static void table_clear(Table *t) {
    for (Py_ssize_t i = 0; i < t->capacity; i++) {
        Entry *e = &t->entries[i];
        if (e->value) { PyMem_Free(e->words); Py_DECREF(e->objects); Py_DECREF(e->value); }
    }
    PyMem_Free(t->entries);
    t->entries = NULL; t->capacity = t->used = 0;
}

static void table_place(Table *t, Entry entry) {
    Py_ssize_t i = (size_t)entry.hash & (t->capacity - 1);
    while (t->entries[i].value) i = (i + 1) & (t->capacity - 1);
    t->entries[i] = entry;
}

/* Insert a key that table_find did not find; steals nothing. */
static int table_insert(Table *t, Py_hash_t hash, const uint64_t *words, PyObject *const *objects, PyObject *value) {
    if (2 * (t->used + 1) > t->capacity) {
        Py_ssize_t capacity = t->capacity ? 2 * t->capacity : 8;
        Entry *old = t->entries, *fresh = PyMem_Calloc(capacity, sizeof(Entry));
        if (!fresh) { PyErr_NoMemory(); return -1; }
        Py_ssize_t old_capacity = t->capacity;
        t->entries = fresh; t->capacity = capacity;
        for (Py_ssize_t i = 0; i < old_capacity; i++)
            if (old[i].value) table_place(t, old[i]);
        PyMem_Free(old);
    }
    Entry e = {hash, PyMem_Malloc((t->nwords ? t->nwords : 1) * sizeof(uint64_t)), PyTuple_New(t->nobjects), value};
    if (!e.words || !e.objects) { PyMem_Free(e.words); Py_XDECREF(e.objects); PyErr_NoMemory(); return -1; }
    memcpy(e.words, words, t->nwords * sizeof(uint64_t));
    for (Py_ssize_t k = 0; k < t->nobjects; k++) PyTuple_SET_ITEM(e.objects, k, Py_NewRef(objects[k]));
    Py_INCREF(value);
    table_place(t, e);
    t->used++;
    return 0;
}

/* ---- the stub driver: each launch goes to a Python hook; a TMA "descriptor" records the encode's arguments */
static int stub_launch(void *f, unsigned g[3], unsigned threads, unsigned smem, void *stream, const unsigned cluster[3],
                       const unsigned char *buffer, size_t size) {
    PyObject *r = PyObject_CallFunction(stub_hook, "K(III)II K (III)y#", (unsigned long long)(uintptr_t)f, g[0], g[1],
                                        g[2], threads, smem, (unsigned long long)(uintptr_t)stream, cluster[0],
                                        cluster[1], cluster[2], (const char *)buffer, (Py_ssize_t)size);
    if (!r) return -1;
    long rc = PyLong_AsLong(r);
    Py_DECREF(r);
    return rc == -1 && PyErr_Occurred() ? -1 : (int)rc;
}

static int stub_encode(void *map, int dtype, uint32_t rank, void *address, const uint64_t *dims, const uint64_t *strides,
                       const uint32_t *box, const uint32_t *element_strides, int interleave, int swizzle, int l2,
                       int oob) {
    uint64_t w[16] = {0};
    w[0] = (uint64_t)dtype | (uint64_t)rank << 8 | (uint64_t)interleave << 16 | (uint64_t)swizzle << 24 |
           (uint64_t)l2 << 32 | (uint64_t)oob << 40;
    w[1] = (uint64_t)(uintptr_t)address;
    for (uint32_t i = 0; i < rank; i++) {
        w[2 + i] = dims[i];
        w[12 + i / 2] |= (uint64_t)box[i] << (32 * (i % 2));
        w[15] |= (uint64_t)element_strides[i] << (8 * i);
    }
    for (uint32_t i = 0; i + 1 < rank; i++) w[7 + i] = strides[i];
    memcpy(map, w, 128);
    return 0;
}

static int stub_context(void **ctx) { *ctx = NULL; return 0; }

/* ---- Plan: one compiled kernel's launch on one device */
#define TMA_CACHE 8 /* descriptors kept per plan and operand: layers of one shape alternate their weights */
typedef struct {
    int valid;
    uint64_t address, dims[MAX_TMA_RANK], strides[MAX_TMA_RANK];
    unsigned char map[128];
} Encoded;

typedef struct {
    int param, dtype, swizzle, interleave, l2, oob;
    uint32_t rank, box[MAX_TMA_RANK], ones[MAX_TMA_RANK];
    uint64_t itemsize;
    int next;  /* the cache slot the next new descriptor goes to */
    Encoded cache[TMA_CACHE];
} Tensormap;

typedef struct {
    PyObject_HEAD
    PyObject *name;
    void *function, *context;
    int device;
    unsigned threads, smem, cluster[3];
    Py_ssize_t nparams, nfields, size;
    int *ranks;              /* per runtime parameter: its rank, -1 for a scalar */
    unsigned char *codes;    /* per field */
    uint32_t *offsets;       /* per field */
    Py_ssize_t ntensormaps;
    Tensormap *tensormaps;
} Plan;

static void plan_dealloc(Plan *p) {
    Py_XDECREF(p->name);
    PyMem_Free(p->ranks); PyMem_Free(p->codes); PyMem_Free(p->offsets); PyMem_Free(p->tensormaps);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

/* Plan(name, function, context, device, threads, smem, cluster, ranks, layout, tensormaps): `layout` is
 * abi.BufferLayout.c_layout, `ranks` a tuple with each runtime parameter's rank (-1 for a scalar), each of
 * `tensormaps` (param, dtype, swizzle, interleave, l2, oob, box, itemsize) with the driver's enum values. */
static PyObject *plan_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *name, *ranks, *tensormaps;
    unsigned long long function, context;
    int device;
    unsigned threads, smem, cluster[3];
    const char *layout;
    Py_ssize_t layout_size;
    if (!PyArg_ParseTuple(args, "UKKiII(III)O!y#O!", &name, &function, &context, &device, &threads, &smem, &cluster[0],
                          &cluster[1], &cluster[2], &PyTuple_Type, &ranks, &layout, &layout_size, &PyTuple_Type,
                          &tensormaps))
        return NULL;
    Plan *p = (Plan *)type->tp_alloc(type, 0);
    if (!p) return NULL;
    p->name = Py_NewRef(name);
    p->function = (void *)(uintptr_t)function; p->context = (void *)(uintptr_t)context;
    p->device = device; p->threads = threads; p->smem = smem;
    memcpy(p->cluster, cluster, sizeof cluster);
    p->nparams = PyTuple_GET_SIZE(ranks);
    p->nfields = layout_size / 5;
    p->ntensormaps = PyTuple_GET_SIZE(tensormaps);
    p->ranks = PyMem_Calloc(p->nparams + 1, sizeof(int));
    p->codes = PyMem_Calloc(p->nfields + 1, 1);
    p->offsets = PyMem_Calloc(p->nfields + 1, sizeof(uint32_t));
    p->tensormaps = PyMem_Calloc(p->ntensormaps + 1, sizeof(Tensormap));
    if (!p->ranks || !p->codes || !p->offsets || !p->tensormaps) { Py_DECREF(p); return PyErr_NoMemory(); }
    if (layout_size % 5 || p->nfields > MAX_FIELDS || p->nparams > MAX_ARGS) goto bad_layout;
    for (Py_ssize_t i = 0; i < p->nfields; i++) {
        p->codes[i] = (unsigned char)layout[5 * i];
        memcpy(&p->offsets[i], layout + 5 * i + 1, 4);
    }
    /* The layout must be what abi.kernel_fields gives for these parameters, each field inside the buffer. */
    Py_ssize_t f = 0;
    for (Py_ssize_t i = 0; i < p->nparams; i++) {
        long rank = PyLong_AsLong(PyTuple_GET_ITEM(ranks, i));
        if (rank == -1 && PyErr_Occurred()) { Py_DECREF(p); return NULL; }
        p->ranks[i] = (int)rank;
        if (rank >= 0) {
            if (f + 1 + 2 * rank > p->nfields || p->codes[f] != MGJIT_FIELD_PTR) goto bad_layout;
            for (long d = 0; d < rank; d++)
                if (p->codes[f + 1 + d] != MGJIT_FIELD_I32 || p->codes[f + 1 + rank + d] != MGJIT_FIELD_I64) goto bad_layout;
            f += 1 + 2 * rank;
        } else {
            if (f >= p->nfields || p->codes[f] == MGJIT_FIELD_PTR || p->codes[f] == MGJIT_FIELD_TENSORMAP) goto bad_layout;
            f++;
        }
    }
    if (f + p->ntensormaps != p->nfields) goto bad_layout;
    for (Py_ssize_t i = 0; i < p->ntensormaps; i++, f++) {
        Tensormap *m = &p->tensormaps[i];
        PyObject *box;
        unsigned long long itemsize;
        if (p->codes[f] != MGJIT_FIELD_TENSORMAP || p->offsets[f] % 64) goto bad_layout;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(tensormaps, i), "iiiiiiO!K", &m->param, &m->dtype, &m->swizzle,
                              &m->interleave, &m->l2, &m->oob, &PyTuple_Type, &box, &itemsize)) {
            Py_DECREF(p); return NULL;
        }
        m->rank = (uint32_t)PyTuple_GET_SIZE(box);
        m->itemsize = itemsize;
        if (m->param < 0 || m->param >= p->nparams || p->ranks[m->param] != (int)m->rank || m->rank < 1 ||
            m->rank > MAX_TMA_RANK)
            goto bad_layout;
        for (uint32_t d = 0; d < m->rank; d++) {  /* the driver takes dimensions innermost first */
            m->box[d] = (uint32_t)PyLong_AsUnsignedLong(PyTuple_GET_ITEM(box, m->rank - 1 - d));
            m->ones[d] = 1;
        }
        if (PyErr_Occurred()) { Py_DECREF(p); return NULL; }
    }
    for (Py_ssize_t i = 0; i < p->nfields; i++) {
        static const unsigned sizes[] = {[MGJIT_FIELD_PTR] = 8, [MGJIT_FIELD_I32] = 4, [MGJIT_FIELD_I64] = 8,
                                         [MGJIT_FIELD_F32] = 4, [MGJIT_FIELD_F64] = 8, [MGJIT_FIELD_I1] = 1,
                                         [MGJIT_FIELD_TENSORMAP] = 128};
        if (p->codes[i] >= sizeof sizes / sizeof *sizes || !sizes[p->codes[i]]) goto bad_layout;
        if ((Py_ssize_t)(p->offsets[i] + sizes[p->codes[i]]) > p->size) p->size = p->offsets[i] + sizes[p->codes[i]];
    }
    if (p->size > MAX_BUFFER) goto bad_layout;
    return (PyObject *)p;
bad_layout:
    Py_DECREF(p);
    PyErr_SetString(PyExc_ValueError, "the parameter layout does not match the parameters (or exceeds 4 KB)");
    return NULL;
}

/* Pack the call's values and launch: 0, a CUresult > 0, MGJIT_E_* < 0, or -1000 with a Python error set. */
#define E_PYTHON (-1000)
static int plan_launch(Plan *p, const unsigned g[3], const ArgValue *values) {
    if (cu_context != stub_context) {
        void *ctx = NULL;
        if (cu_context(&ctx) != 0 || ctx != p->context) return MGJIT_E_CONTEXT;
    }
    void *stream = NULL;
    if (!stub_driver && dlpack->current_work_stream(DL_CUDA, p->device, &stream) != 0) return E_PYTHON;
    _Alignas(64) unsigned char buffer[MAX_BUFFER];
    void *pointers[MAX_FIELDS];
    Py_ssize_t f = 0;
    for (Py_ssize_t i = 0; i < p->nparams; i++) {
        const ArgValue *v = &values[i];
        int rank = p->ranks[i];
        if (rank >= 0) {
            const DLTensor *t = &v->t;
            if (v->tag != TAG_TENSOR || t->ndim != rank) return MGJIT_E_LAYOUT;
            uint64_t address = (uint64_t)(uintptr_t)t->data + t->byte_offset;
            memcpy(buffer + p->offsets[f++], &address, 8);
            for (int d = 0; d < rank; d++) {
                if (t->shape[d] > INT32_MAX) return MGJIT_E_VALUE;
                int32_t size = (int32_t)t->shape[d];
                memcpy(buffer + p->offsets[f++], &size, 4);
            }
            for (int d = 0; d < rank; d++) {
                int64_t stride = stride_at(t, d);
                memcpy(buffer + p->offsets[f++], &stride, 8);
            }
            continue;
        }
        unsigned char *dst = buffer + p->offsets[f], code = p->codes[f++];
        int expected = code == MGJIT_FIELD_I1 ? TAG_BOOL : code == MGJIT_FIELD_F32 || code == MGJIT_FIELD_F64 ? TAG_FLOAT
                                                                                                            : TAG_INT;
        if (v->tag != expected) return MGJIT_E_LAYOUT;
        switch (code) {
        case MGJIT_FIELD_I32: {
            if (v->i > INT32_MAX || v->i < INT32_MIN) return MGJIT_E_VALUE;
            int32_t x = (int32_t)v->i; memcpy(dst, &x, 4); break;
        }
        case MGJIT_FIELD_I64: { int64_t x = v->i; memcpy(dst, &x, 8); break; }
        case MGJIT_FIELD_F32: { float x = (float)v->d; memcpy(dst, &x, 4); break; }
        case MGJIT_FIELD_F64: { double x = v->d; memcpy(dst, &x, 8); break; }
        case MGJIT_FIELD_I1: *dst = (unsigned char)(v->i != 0); break;
        default: return MGJIT_E_LAYOUT;
        }
    }
    for (Py_ssize_t i = 0; i < p->ntensormaps; i++) {
        Tensormap *m = &p->tensormaps[i];
        const DLTensor *t = &values[m->param].t;
        uint64_t address = (uint64_t)(uintptr_t)t->data + t->byte_offset, dims[MAX_TMA_RANK] = {0},
                 strides[MAX_TMA_RANK] = {0};
        for (uint32_t d = 0; d < m->rank; d++) dims[d] = (uint64_t)t->shape[m->rank - 1 - d];
        for (uint32_t d = 0; d + 1 < m->rank; d++) strides[d] = (uint64_t)stride_at(t, m->rank - 2 - d) * m->itemsize;
        Encoded *e = NULL;
        for (int k = 0; k < TMA_CACHE && !e; k++) {
            Encoded *c = &m->cache[k];
            if (c->valid && c->address == address && !memcmp(c->dims, dims, m->rank * 8) &&
                !memcmp(c->strides, strides, (m->rank - 1) * 8))
                e = c;
        }
        if (!e) {
            _Alignas(64) unsigned char map[128];  /* the driver writes a 64-byte aligned CUtensorMap */
            int rc = cu_encode(map, m->dtype, m->rank, (void *)(uintptr_t)address, dims, strides, m->box, m->ones,
                               m->interleave, m->swizzle, m->l2, m->oob);
            if (rc) return rc;
            e = &m->cache[m->next];
            m->next = (m->next + 1) % TMA_CACHE;
            e->address = address;
            memcpy(e->dims, dims, sizeof dims); memcpy(e->strides, strides, sizeof strides); memcpy(e->map, map, 128);
            e->valid = 1;
        }
        memcpy(buffer + p->offsets[f++], e->map, 128);
    }
    for (Py_ssize_t i = 0; i < p->nfields; i++) pointers[i] = buffer + p->offsets[i];
    if (stub_driver)
        return stub_hook ? stub_launch(p->function, (unsigned *)g, p->threads, p->smem, stream, p->cluster, buffer, p->size)
                         : 0;
    if (p->cluster[0] * p->cluster[1] * p->cluster[2] == 1)
        return cu_launch(p->function, g[0], g[1], g[2], p->threads, 1, 1, p->smem, stream, pointers, NULL);
    LaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.cluster.x = p->cluster[0]; attr.value.cluster.y = p->cluster[1]; attr.value.cluster.z = p->cluster[2];
    LaunchConfig config = {{g[0], g[1], g[2]}, {p->threads, 1, 1}, p->smem, stream, &attr, 1};
    return cu_launch_ex(&config, p->function, pointers, NULL);
}

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mgjit_launch.Plan",
    .tp_basicsize = sizeof(Plan),
    .tp_dealloc = (destructor)plan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = plan_new,
    .tp_doc = "One compiled kernel's launch on one device.",
};

/* ---- Dispatcher: a kernel's parameters, its table of plans, and the Python paths */
typedef struct {
    PyObject_HEAD
    Py_ssize_t nparams, nruntime, nconst;
    PyObject *names;      /* tuple of interned parameter names */
    PyObject *defaults;   /* tuple: each parameter's default, or `missing` */
    PyObject *missing;
    char *is_const;
    PyObject *guard;      /* guard() -> true when what the kernel reads changed; None when nothing can */
    PyObject *miss;       /* miss(key, runtime values, constexprs, num_warpgroups, cluster) -> Plan or None */
    PyObject *slow;       /* slow(grid, *args, **kwargs): the Python path */
    Table plans;
} Dispatcher;

static PyObject *s_num_warpgroups, *s_cluster;

static int dispatcher_traverse(Dispatcher *d, visitproc visit, void *arg) {
    Py_VISIT(d->guard); Py_VISIT(d->miss); Py_VISIT(d->slow); Py_VISIT(d->defaults);
    for (Py_ssize_t i = 0; i < d->plans.capacity; i++)
        if (d->plans.entries[i].value) { Py_VISIT(d->plans.entries[i].objects); Py_VISIT(d->plans.entries[i].value); }
    return 0;
}

static int dispatcher_clear_refs(Dispatcher *d) {
    Py_CLEAR(d->guard); Py_CLEAR(d->miss); Py_CLEAR(d->slow); Py_CLEAR(d->defaults);
    table_clear(&d->plans);
    return 0;
}

static void dispatcher_dealloc(Dispatcher *d) {
    PyObject_GC_UnTrack(d);
    dispatcher_clear_refs(d);
    Py_XDECREF(d->names); Py_XDECREF(d->missing);
    PyMem_Free(d->is_const);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

/* Dispatcher(names, is_constexpr, defaults, missing, miss, slow) */
static PyObject *dispatcher_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *names, *flags, *defaults, *missing, *miss, *slow;
    if (!PyArg_ParseTuple(args, "O!O!O!OOO", &PyTuple_Type, &names, &PyTuple_Type, &flags, &PyTuple_Type, &defaults,
                          &missing, &miss, &slow))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (PyTuple_GET_SIZE(flags) != n || PyTuple_GET_SIZE(defaults) != n || n > MAX_ARGS) {
        PyErr_SetString(PyExc_ValueError, "names, flags and defaults differ in length (or over 64 parameters)");
        return NULL;
    }
    Dispatcher *d = (Dispatcher *)type->tp_alloc(type, 0);
    if (!d) return NULL;
    d->nparams = n;
    d->names = PyTuple_New(n);
    d->is_const = PyMem_Calloc(n + 1, 1);
    if (!d->names || !d->is_const) { Py_DECREF(d); return PyErr_NoMemory(); }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = Py_NewRef(PyTuple_GET_ITEM(names, i));
        PyUnicode_InternInPlace(&name);
        PyTuple_SET_ITEM(d->names, i, name);
        d->is_const[i] = (char)PyObject_IsTrue(PyTuple_GET_ITEM(flags, i));
        if (d->is_const[i]) d->nconst++; else d->nruntime++;
    }
    d->defaults = Py_NewRef(defaults); d->missing = Py_NewRef(missing);
    d->miss = Py_NewRef(miss); d->slow = Py_NewRef(slow);
    d->plans.nwords = d->nruntime; d->plans.nobjects = d->nconst + 2;
    return (PyObject *)d;
}

/* The slow path with the call as it was made: slow(grid, *args, **kwargs). */
static PyObject *call_slow(Dispatcher *d, PyObject *grid, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf), total = n + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *small[16], **stack = total < 16 ? small : PyMem_Malloc((total + 1) * sizeof(PyObject *));
    if (!stack) return PyErr_NoMemory();
    stack[0] = grid;
    memcpy(stack + 1, args, total * sizeof(PyObject *));
    PyObject *r = PyObject_Vectorcall(d->slow, stack, n + 1, kwnames);
    if (stack != small) PyMem_Free(stack);
    return r;
}

static int interpret_requested(void) {
    const char *v = getenv("MGJIT_INTERPRET");
    return v && v[0] == '1' && v[1] == '\0';
}

/* The grid as three dimensions; 0 when it is not 1 to 3 ints in range (Python explains), 1 when it has a
 * zero dimension (nothing to launch), 2 otherwise. */
static int parse_grid(PyObject *grid, unsigned g[3]) {
    static const long long limits[3] = {2147483647LL, 65535, 65535};
    PyObject *const *items = &grid;
    Py_ssize_t n = 1;
    if (PyTuple_Check(grid)) { items = &PyTuple_GET_ITEM(grid, 0); n = PyTuple_GET_SIZE(grid); }
    else if (PyList_Check(grid)) { items = &PyList_GET_ITEM(grid, 0); n = PyList_GET_SIZE(grid); }
    if (n < 1 || n > 3) return 0;
    g[0] = g[1] = g[2] = 1;
    int empty = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyLong_Check(items[i])) return 0;
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(items[i], &overflow);
        if (overflow || x < 0 || x > limits[i]) { PyErr_Clear(); return 0; }
        if (x == 0) empty = 1;
        g[i] = (unsigned)x;
    }
    return empty ? 1 : 2;
}

static PyObject *launch_error(Plan *p, int rc) {
    return PyObject_CallFunction(launch_failed, "Oi", p->name, rc);  /* raises, or returns None to go slow */
}

/* The slow path of a call: as it was made (args), or, for a call the autotuner bound (args NULL), with every
 * parameter positional and the launch options by name. */
static PyObject *slow_path(Dispatcher *d, PyObject *grid, PyObject **slots, PyObject *nwg, PyObject *cluster,
                           PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (args) return call_slow(d, grid, args, nargsf, kwnames);
    PyObject *stack[MAX_ARGS + 2], *names[2];
    Py_ssize_t nkw = 0;
    memcpy(stack, slots, d->nparams * sizeof(PyObject *));
    if (nwg) { stack[d->nparams + nkw] = nwg; names[nkw++] = s_num_warpgroups; }
    if (cluster) { stack[d->nparams + nkw] = cluster; names[nkw++] = s_cluster; }
    PyObject *kw = NULL;
    if (nkw) {
        kw = PyTuple_New(nkw);
        if (!kw) return NULL;
        for (Py_ssize_t i = 0; i < nkw; i++) PyTuple_SET_ITEM(kw, i, Py_NewRef(names[i]));
    }
    PyObject *r = call_slow(d, grid, stack, d->nparams, kw);
    Py_XDECREF(kw);
    return r;
}

/* The fast path over bound arguments: slots[i] holds parameter i (borrowed); args, nargsf and kwnames are the
 * call as it was made (args NULL for a call the autotuner bound). */
static PyObject *dispatch(Dispatcher *d, PyObject *grid, PyObject **slots, PyObject *nwg, PyObject *cluster,
                          PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (interpret_requested()) return slow_path(d, grid, slots, nwg, cluster, args, nargsf, kwnames);
    if (d->guard) {
        PyObject *r = PyObject_CallNoArgs(d->guard);
        if (!r) return NULL;
        int changed = PyObject_IsTrue(r);
        Py_DECREF(r);
        if (changed) return changed < 0 ? NULL : slow_path(d, grid, slots, nwg, cluster, args, nargsf, kwnames);
    }
    unsigned g[3];
    int grid_kind = parse_grid(grid, g);
    if (!grid_kind) return slow_path(d, grid, slots, nwg, cluster, args, nargsf, kwnames);
    uint64_t words[MAX_ARGS];
    ArgValue values[MAX_ARGS];
    PyObject *objects[MAX_ARGS + 2];
    Py_ssize_t w = 0, o = 0;
    for (Py_ssize_t i = 0; i < d->nparams; i++) {
        if (d->is_const[i]) { objects[o++] = slots[i]; continue; }
        uint64_t word = key_word(slots[i], &values[w]);
        if (!word) return slow_path(d, grid, slots, nwg, cluster, args, nargsf, kwnames);
        words[w++] = word;
    }
    objects[o++] = nwg ? nwg : Py_None;
    objects[o++] = cluster ? cluster : Py_None;
    Py_hash_t hash = hash_key(words, w, objects, o);
    if (hash == -1) { PyErr_Clear(); return slow_path(d, grid, slots, nwg, cluster, args, nargsf, kwnames); }  /* unhashable */
    int error;
    Entry *e = table_find(&d->plans, hash, words, objects, &error);
    if (error) { PyErr_Clear(); return slow_path(d, grid, slots, nwg, cluster, args, nargsf, kwnames); }
    PyObject *plan;
    if (e) {
        plan = e->value;
    } else {
        PyObject *key = PyBytes_FromStringAndSize((const char *)words, w * sizeof(uint64_t));
        PyObject *runtime = PyTuple_New(d->nruntime), *consts = PyDict_New();
        if (!key || !runtime || !consts) { Py_XDECREF(key); Py_XDECREF(runtime); Py_XDECREF(consts); return NULL; }
        for (Py_ssize_t i = 0, r = 0; i < d->nparams; i++) {
            if (!d->is_const[i]) PyTuple_SET_ITEM(runtime, r++, Py_NewRef(slots[i]));
            else if (PyDict_SetItem(consts, PyTuple_GET_ITEM(d->names, i), slots[i]) < 0) {
                Py_DECREF(key); Py_DECREF(runtime); Py_DECREF(consts); return NULL;
            }
        }
        plan = PyObject_CallFunctionObjArgs(d->miss, key, runtime, consts, objects[o - 2], objects[o - 1], NULL);
        Py_DECREF(key); Py_DECREF(runtime); Py_DECREF(consts);
        if (!plan) return NULL;
        if (plan != Py_None && !PyObject_TypeCheck(plan, &PlanType)) {
            Py_DECREF(plan);
            PyErr_SetString(PyExc_TypeError, "a miss must return a Plan or None");
            return NULL;
        }
        int rc = table_insert(&d->plans, hash, words, objects, plan);
        Py_DECREF(plan);  /* the table holds it */
        if (rc < 0) return NULL;
    }
    if (plan == Py_None) return slow_path(d, grid, slots, nwg, cluster, args, nargsf, kwnames);  /* no C plan for this kernel */
    if (grid_kind == 1) Py_RETURN_NONE;  /* an empty grid: nothing to launch, as in Triton */
    Plan *p = (Plan *)plan;
    if ((g[0] % p->cluster[0]) || (g[1] % p->cluster[1]) || (g[2] % p->cluster[2]))
        return slow_path(d, grid, slots, nwg, cluster, args, nargsf, kwnames);
    Py_INCREF(p);  /* the table's reference could go while Python runs (a stub hook, an error callback) */
    int rc = plan_launch(p, g, values);
    PyObject *r = rc == 0 ? Py_NewRef(Py_None) : rc == E_PYTHON ? NULL
                : rc == MGJIT_E_CONTEXT ? Py_NewRef(Py_False) : launch_error(p, rc);
    Py_DECREF(p);
    if (r == Py_None || !r) return r;
    Py_DECREF(r);  /* another context current (or an error callback that did not raise): Python launches it */
    return slow_path(d, grid, slots, nwg, cluster, args, nargsf, kwnames);
}

/* Bind a call's arguments to the parameters by position and name, defaults filled in: 0 when the call is
 * not a plain one (Python explains). */
static int bind(Dispatcher *d, PyObject *const *args, size_t nargsf, PyObject *kwnames, PyObject **slots,
                PyObject **nwg, PyObject **cluster) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n > d->nparams) return 0;
    for (Py_ssize_t i = 0; i < d->nparams; i++) slots[i] = i < n ? args[i] : NULL;
    *nwg = *cluster = NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k), *value = args[n + k];
        Py_ssize_t i = 0;
        for (; i < d->nparams && PyTuple_GET_ITEM(d->names, i) != name; i++) {}
        if (i == d->nparams)
            for (i = 0; i < d->nparams && PyUnicode_Compare(PyTuple_GET_ITEM(d->names, i), name); i++) {}
        if (i < d->nparams) {
            if (slots[i]) return 0;
            slots[i] = value;
        } else if (name == s_num_warpgroups || !PyUnicode_Compare(name, s_num_warpgroups)) {
            *nwg = value;
        } else if (name == s_cluster || !PyUnicode_Compare(name, s_cluster)) {
            *cluster = value;
        } else {
            PyErr_Clear();
            return 0;
        }
    }
    for (Py_ssize_t i = 0; i < d->nparams; i++) {
        if (slots[i]) continue;
        PyObject *dflt = PyTuple_GET_ITEM(d->defaults, i);
        if (dflt == d->missing) return 0;
        slots[i] = dflt;
    }
    if (*nwg == Py_None) *nwg = NULL;
    if (*cluster == Py_None) *cluster = NULL;
    return 1;
}

/* ---- Launch: `dispatcher[grid]` (or `tuned[grid]`), called with the kernel's arguments */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *owner;  /* the Dispatcher or Tuned */
    PyObject *grid;
} Launch;

static void launch_dealloc(Launch *l) {
    Py_XDECREF(l->owner); Py_XDECREF(l->grid);
    PyObject_Free(l);
}

static PyObject *launch_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Launch *l = (Launch *)self;
    Dispatcher *d = (Dispatcher *)l->owner;
    PyObject *slots[MAX_ARGS], *nwg, *cluster;
    if (!bind(d, args, nargsf, kwnames, slots, &nwg, &cluster)) return call_slow(d, l->grid, args, nargsf, kwnames);
    return dispatch(d, l->grid, slots, nwg, cluster, args, nargsf, kwnames);
}

static PyTypeObject LaunchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mgjit_launch.Launch",
    .tp_basicsize = sizeof(Launch),
    .tp_dealloc = (destructor)launch_dealloc,
    .tp_vectorcall_offset = offsetof(Launch, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A kernel launch on one grid: call it with the kernel's arguments.",
};

static PyObject *new_launch(PyObject *owner, PyObject *grid, vectorcallfunc call) {
    Launch *l = PyObject_New(Launch, &LaunchType);
    if (!l) return NULL;
    l->vectorcall = call;
    l->owner = Py_NewRef(owner);
    l->grid = Py_NewRef(grid);
    return (PyObject *)l;
}

static PyObject *dispatcher_getitem(PyObject *self, PyObject *grid) { return new_launch(self, grid, launch_call); }

static PyObject *dispatcher_set_guard(Dispatcher *d, PyObject *guard) {
    Py_XSETREF(d->guard, guard == Py_None ? NULL : Py_NewRef(guard));
    Py_RETURN_NONE;
}

static PyObject *dispatcher_clear(Dispatcher *d, PyObject *unused) {
    table_clear(&d->plans);
    Py_RETURN_NONE;
}

static PyObject *dispatcher_len(Dispatcher *d, PyObject *unused) { return PyLong_FromSsize_t(d->plans.used); }

static PyMethodDef dispatcher_methods[] = {
    {"set_guard", (PyCFunction)dispatcher_set_guard, METH_O, "Set guard() (None: nothing the kernel reads can change)."},
    {"clear", (PyCFunction)dispatcher_clear, METH_NOARGS, "Forget every plan."},
    {"plan_count", (PyCFunction)dispatcher_len, METH_NOARGS, "How many keys have a plan."},
    {NULL, NULL, 0, NULL}};

static PyMappingMethods dispatcher_mapping = {.mp_subscript = dispatcher_getitem};

static PyTypeObject DispatcherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mgjit_launch.Dispatcher",
    .tp_basicsize = sizeof(Dispatcher),
    .tp_dealloc = (destructor)dispatcher_dealloc,
    .tp_traverse = (traverseproc)dispatcher_traverse,
    .tp_clear = (inquiry)dispatcher_clear_refs,
    .tp_as_mapping = &dispatcher_mapping,
    .tp_methods = dispatcher_methods,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = dispatcher_new,
    .tp_doc = "A kernel's launch fast path: `dispatcher[grid](*args, **kwargs)`.",
};

/* ---- Tuned: an autotuned kernel's launch: the config chosen for the call's tuning key, then the kernel's
 * dispatch. Its memo key is finer than autotune.Autotuned._memo_key (each call argument's kind and dtype, each
 * key argument's shape or value by type and equality), and its value is what Python chose for that key. */
#define MAX_KEY_RANK 8
typedef struct {
    PyObject_HEAD
    Dispatcher *kernel;
    Py_ssize_t ncall, nkey, nconfig;
    PyObject *call_names;  /* tuple: the arguments a launch passes, in order */
    int *to_param;         /* call argument -> kernel parameter */
    int *key_of;           /* call argument -> its index among the key arguments, or -1 */
    int *config_param;     /* config value -> kernel parameter */
    PyObject *miss;        /* miss(grid, *args, **kwargs) -> (config values, nwg, cluster, options dict); launches */
    Table memo;
} Tuned;

static int tuned_traverse(Tuned *t, visitproc visit, void *arg) {
    Py_VISIT(t->kernel); Py_VISIT(t->miss);
    for (Py_ssize_t i = 0; i < t->memo.capacity; i++)
        if (t->memo.entries[i].value) { Py_VISIT(t->memo.entries[i].objects); Py_VISIT(t->memo.entries[i].value); }
    return 0;
}

static int tuned_clear_refs(Tuned *t) {
    Py_CLEAR(t->kernel); Py_CLEAR(t->miss);
    table_clear(&t->memo);
    return 0;
}

static void tuned_dealloc(Tuned *t) {
    PyObject_GC_UnTrack(t);
    tuned_clear_refs(t);
    Py_XDECREF(t->call_names);
    PyMem_Free(t->to_param); PyMem_Free(t->key_of); PyMem_Free(t->config_param);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static Py_ssize_t param_index(Dispatcher *d, PyObject *name) {
    for (Py_ssize_t i = 0; i < d->nparams; i++)
        if (!PyUnicode_Compare(PyTuple_GET_ITEM(d->names, i), name)) return i;
    if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "%R is not a parameter of the kernel", name);
    return -1;
}

/* Tuned(kernel dispatcher, call names, key names, config names, miss) */
static PyObject *tuned_new(PyTypeObject *type, PyObject *args, PyObject *kwargs);

static PyObject *tuned_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames);

static PyObject *tuned_getitem(PyObject *self, PyObject *grid) { return new_launch(self, grid, tuned_call); }

static PyMappingMethods tuned_mapping = {.mp_subscript = tuned_getitem};

static PyTypeObject TunedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mgjit_launch.Tuned",
    .tp_basicsize = sizeof(Tuned),
    .tp_dealloc = (destructor)tuned_dealloc,
    .tp_traverse = (traverseproc)tuned_traverse,
    .tp_clear = (inquiry)tuned_clear_refs,
    .tp_as_mapping = &tuned_mapping,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = tuned_new,
    .tp_doc = "An autotuned kernel's launch fast path: `tuned[grid](*args, **kwargs)`.",
};

static PyObject *tuned_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *kernel, *call, *keys, *configs, *miss;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O", &DispatcherType, &kernel, &PyTuple_Type, &call, &PyTuple_Type, &keys,
                          &PyTuple_Type, &configs, &miss))
        return NULL;
    Dispatcher *d = (Dispatcher *)kernel;
    Tuned *t = (Tuned *)type->tp_alloc(type, 0);
    if (!t) return NULL;
    t->kernel = (Dispatcher *)Py_NewRef(kernel);
    t->call_names = Py_NewRef(call);
    t->miss = Py_NewRef(miss);
    t->ncall = PyTuple_GET_SIZE(call); t->nkey = PyTuple_GET_SIZE(keys); t->nconfig = PyTuple_GET_SIZE(configs);
    t->to_param = PyMem_Calloc(t->ncall + 1, sizeof(int));
    t->key_of = PyMem_Calloc(t->ncall + 1, sizeof(int));
    t->config_param = PyMem_Calloc(t->nconfig + 1, sizeof(int));
    if (!t->to_param || !t->key_of || !t->config_param) { Py_DECREF(t); return PyErr_NoMemory(); }
    if (t->ncall + t->nconfig != d->nparams) {
        Py_DECREF(t);
        PyErr_SetString(PyExc_ValueError, "the call's and the config's names must be the kernel's parameters");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < t->ncall; i++) {
        Py_ssize_t p = param_index(d, PyTuple_GET_ITEM(call, i));
        if (p < 0) { Py_DECREF(t); return NULL; }
        t->to_param[i] = (int)p;
        t->key_of[i] = -1;
        for (Py_ssize_t k = 0; k < t->nkey; k++)
            if (!PyUnicode_Compare(PyTuple_GET_ITEM(keys, k), PyTuple_GET_ITEM(call, i))) t->key_of[i] = (int)k;
    }
    for (Py_ssize_t j = 0; j < t->nconfig; j++) {
        Py_ssize_t p = param_index(d, PyTuple_GET_ITEM(configs, j));
        if (p < 0) { Py_DECREF(t); return NULL; }
        t->config_param[j] = (int)p;
    }
    t->memo.nwords = t->ncall + t->nkey * MAX_KEY_RANK;
    t->memo.nobjects = t->nkey;
    return (PyObject *)t;
}

/* The grid of a call: a callable grid's answer for the named arguments and the config's options. */
static PyObject *resolve_grid(Tuned *t, PyObject *grid, PyObject **given, PyObject *options) {
    if (!PyCallable_Check(grid)) return Py_NewRef(grid);
    PyObject *named = PyDict_New();
    if (!named) return NULL;
    for (Py_ssize_t i = 0; i < t->ncall; i++)
        if (given[i] && PyDict_SetItem(named, PyTuple_GET_ITEM(t->call_names, i), given[i]) < 0) {
            Py_DECREF(named); return NULL;
        }
    if (PyDict_Update(named, options) < 0) { Py_DECREF(named); return NULL; }
    PyObject *r = PyObject_CallOneArg(grid, named);
    Py_DECREF(named);
    return r;
}

static PyObject *tuned_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Launch *l = (Launch *)self;
    Tuned *t = (Tuned *)l->owner;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf), nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *given[MAX_ARGS];
    int plain = n <= t->ncall;
    for (Py_ssize_t i = 0; i < t->ncall; i++) given[i] = i < n ? args[i] : NULL;
    for (Py_ssize_t k = 0; plain && k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        Py_ssize_t i = 0;
        for (; i < t->ncall && PyTuple_GET_ITEM(t->call_names, i) != name; i++) {}
        if (i == t->ncall)
            for (i = 0; i < t->ncall && PyUnicode_Compare(PyTuple_GET_ITEM(t->call_names, i), name); i++) {}
        if (i == t->ncall || given[i]) plain = 0; else given[i] = args[n + k];
    }
    for (Py_ssize_t i = 0; plain && i < t->ncall; i++) plain = given[i] != NULL;
    PyErr_Clear();
    uint64_t words[MAX_ARGS + MAX_ARGS * MAX_KEY_RANK];
    PyObject *objects[MAX_ARGS];
    memset(words, 0, t->memo.nwords * sizeof(uint64_t));
    for (Py_ssize_t i = 0; plain && i < t->ncall; i++) {
        ArgValue value;
        uint64_t word = key_word(given[i], &value);
        int k = t->key_of[i];
        if (!word) { plain = 0; break; }
        words[i] = word & 15;
        if (value.tag == TAG_TENSOR) {
            words[i] = word & 0xFFFFFF;  /* tag, dtype, rank */
            if (k >= 0) {
                if (value.t.ndim > MAX_KEY_RANK) { plain = 0; break; }
                memcpy(&words[t->ncall + k * MAX_KEY_RANK], value.t.shape, value.t.ndim * sizeof(uint64_t));
                objects[k] = Py_None;
            }
        } else if (k >= 0) {
            objects[k] = given[i];
        }
    }
    Py_hash_t hash = plain ? hash_key(words, t->memo.nwords, objects, t->nkey) : 0;
    Entry *e = NULL;
    if (plain && hash != -1) {
        int error;
        e = table_find(&t->memo, hash, words, objects, &error);
        if (error) plain = 0;
    }
    PyErr_Clear();
    if (!e) {  /* Python tunes (or finds the stored choice) and launches; a plain call remembers the choice */
        PyObject *stack[MAX_ARGS + 8], **full = n + nkw + 1 <= MAX_ARGS + 8 ? stack : NULL;
        if (!full) return PyErr_Format(PyExc_TypeError, "too many arguments");
        full[0] = l->grid;
        memcpy(full + 1, args, (n + nkw) * sizeof(PyObject *));
        PyObject *chosen = PyObject_Vectorcall(t->miss, full, n + 1, kwnames);
        if (!chosen) return NULL;
        if (plain && hash != -1 && chosen != Py_None && table_insert(&t->memo, hash, words, objects, chosen) < 0) {
            Py_DECREF(chosen); return NULL;
        }
        Py_DECREF(chosen);
        Py_RETURN_NONE;
    }
    PyObject *chosen = Py_NewRef(e->value), *values, *nwg, *cluster, *options;  /* held: the grid runs Python */
    if (!PyArg_ParseTuple(chosen, "O!OOO!", &PyTuple_Type, &values, &nwg, &cluster, &PyDict_Type, &options)) {
        Py_DECREF(chosen);
        return NULL;
    }
    Dispatcher *d = t->kernel;
    PyObject *slots[MAX_ARGS];
    for (Py_ssize_t i = 0; i < t->ncall; i++) slots[t->to_param[i]] = given[i];
    for (Py_ssize_t j = 0; j < t->nconfig; j++) slots[t->config_param[j]] = PyTuple_GET_ITEM(values, j);
    PyObject *grid = resolve_grid(t, l->grid, given, options), *r = NULL;
    if (grid)
        r = dispatch(d, grid, slots, nwg == Py_None ? NULL : nwg, cluster == Py_None ? NULL : cluster, NULL, 0, NULL);
    Py_XDECREF(grid);
    Py_DECREF(chosen);
    return r;
}

/* ---- module functions */

/* configure(dlpack_api, tensor_types, dtypes, failed): the DLPack exchange API (a capsule, or its address as
 * an int), the tensor types it reads, the (code, bits, lanes) of each dtype in key order, and failed(name, rc). */
static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *api, *types, *dtypes, *failed;
    if (!PyArg_ParseTuple(args, "OO!O!O", &api, &PyTuple_Type, &types, &PyTuple_Type, &dtypes, &failed)) return NULL;
    const DLPackExchangeAPI *table = PyCapsule_CheckExact(api)
        ? PyCapsule_GetPointer(api, "dlpack_exchange_api") : (const DLPackExchangeAPI *)PyLong_AsVoidPtr(api);
    if (!table) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "no DLPack exchange API");
        return NULL;
    }
    if (table->version.major != 1 || !table->dltensor_from_py_object || !table->current_work_stream) {
        PyErr_Format(PyExc_ValueError, "unsupported DLPack exchange API (version %u.%u)", table->version.major,
                     table->version.minor);
        return NULL;
    }
    if (PyTuple_GET_SIZE(dtypes) > MAX_DTYPES) { PyErr_SetString(PyExc_ValueError, "too many dtypes"); return NULL; }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(dtypes); i++) {
        unsigned code, bits, lanes;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(dtypes, i), "III", &code, &bits, &lanes)) return NULL;
        dtype_table[i] = (DLDataType){(uint8_t)code, (uint8_t)bits, (uint16_t)lanes};
    }
    dtype_count = (int)PyTuple_GET_SIZE(dtypes);
    dlpack = table;
    Py_XSETREF(tensor_types, Py_NewRef(types));
    Py_XSETREF(launch_failed, Py_NewRef(failed));
    Py_RETURN_NONE;
}

/* use_driver(): resolve the driver's functions from libcuda (ImportError where there is none). */
static PyObject *use_driver(PyObject *self, PyObject *unused) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) { PyErr_SetString(PyExc_ImportError, "libcuda.so.1 not found"); return NULL; }
    launch_fn launch = (launch_fn)dlsym(lib, "cuLaunchKernel");
    launch_ex_fn launch_ex = (launch_ex_fn)dlsym(lib, "cuLaunchKernelEx");
    context_fn context = (context_fn)dlsym(lib, "cuCtxGetCurrent");
    encode_fn encode = (encode_fn)dlsym(lib, "cuTensorMapEncodeTiled");
    if (!launch || !launch_ex || !context || !encode) {
        PyErr_SetString(PyExc_ImportError, "libcuda lacks cuLaunchKernelEx or cuTensorMapEncodeTiled (CUDA < 12)");
        return NULL;
    }
    cu_launch = launch; cu_launch_ex = launch_ex; cu_context = context; cu_encode = encode;
    stub_driver = 0;
    Py_CLEAR(stub_hook);
    Py_RETURN_NONE;
}

/* use_stub_driver(hook): launches call hook(function, grid, threads, smem, stream, cluster, buffer) -> rc (or
 * do nothing, for hook None: what is left is the cost of everything but the driver), TMA descriptors record
 * their encode's arguments, and the current context is always the plan's. */
static PyObject *use_stub_driver(PyObject *self, PyObject *hook) {
    stub_driver = 1;
    Py_XSETREF(stub_hook, hook == Py_None ? NULL : Py_NewRef(hook));
    cu_context = stub_context; cu_encode = stub_encode;
    Py_RETURN_NONE;
}

/* describe(tensor) -> ((code, bits, lanes), device_type, device_id, address, shape, strides) through DLPack */
static PyObject *describe(PyObject *self, PyObject *tensor) {
    DLTensor t;
    if (!dlpack) { PyErr_SetString(PyExc_RuntimeError, "configure() first"); return NULL; }
    if (dlpack->dltensor_from_py_object(tensor, &t) != 0) return NULL;
    PyObject *shape = PyTuple_New(t.ndim), *strides = PyTuple_New(t.ndim);
    if (!shape || !strides) { Py_XDECREF(shape); Py_XDECREF(strides); return NULL; }
    for (int i = 0; i < t.ndim; i++) {
        PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong(t.shape[i]));
        PyTuple_SET_ITEM(strides, i, t.strides ? PyLong_FromLongLong(t.strides[i]) : Py_NewRef(Py_None));
    }
    return Py_BuildValue("(III)iiKNN", t.dtype.code, t.dtype.bits, t.dtype.lanes, t.device.device_type,
                         t.device.device_id, (unsigned long long)((uintptr_t)t.data + t.byte_offset), shape, strides);
}

/* current_stream(device) -> the CUDA stream torch's exchange API says launches on `device` go to now */
static PyObject *current_stream(PyObject *self, PyObject *device) {
    long d = PyLong_AsLong(device);
    if (d == -1 && PyErr_Occurred()) return NULL;
    if (!dlpack) { PyErr_SetString(PyExc_RuntimeError, "configure() first"); return NULL; }
    void *stream = NULL;
    if (dlpack->current_work_stream(DL_CUDA, (int32_t)d, &stream) != 0) return NULL;
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)stream);
}

/* driver_floor(function, threads, stream, n) -> nanoseconds per cuLaunchKernel of a kernel without parameters,
 * n launches in a C loop: what the driver alone costs on this host, the floor under any launcher's time. */
static PyObject *driver_floor(PyObject *self, PyObject *args) {
    unsigned long long function, stream;
    unsigned threads;
    long n;
    if (!PyArg_ParseTuple(args, "KIKl", &function, &threads, &stream, &n)) return NULL;
    if (stub_driver || n < 1) { PyErr_SetString(PyExc_RuntimeError, "needs use_driver() and n >= 1"); return NULL; }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < n; i++) {
        int rc = cu_launch((void *)(uintptr_t)function, 1, 1, 1, threads, 1, 1, 0, (void *)(uintptr_t)stream, NULL,
                           NULL);
        if (rc) return PyErr_Format(PyExc_RuntimeError, "cuLaunchKernel failed with CUDA error %d", rc);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return PyFloat_FromDouble(((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / n);
}

/* decode(key) -> [part, ...]: each word as mgjit.specialize.argument_key() spells its part, a tensor's dtype as
 * its index in the configured dtypes: (dtype index, rank, align, unit stride, size divisor, device). */
static PyObject *decode(PyObject *self, PyObject *key) {
    if (!PyBytes_Check(key) || PyBytes_GET_SIZE(key) % 8) { PyErr_SetString(PyExc_TypeError, "a key"); return NULL; }
    Py_ssize_t n = PyBytes_GET_SIZE(key) / 8;
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t w;
        memcpy(&w, PyBytes_AS_STRING(key) + 8 * i, 8);
        PyObject *part;
        switch (w & 15) {
        case TAG_TENSOR:
            part = Py_BuildValue("(iiiOii)", (int)(w >> 8 & 255), (int)(w >> 16 & 255), 1 << (w >> 24 & 7),
                                 w >> 27 & 1 ? Py_True : Py_False, 1 << (w >> 28 & 7), (int)(int32_t)(w >> 32));
            break;
        case TAG_INT:
            part = Py_BuildValue("(sOO)", "int", w >> 8 & 1 ? Py_True : Py_False, w >> 9 & 1 ? Py_True : Py_False);
            break;
        case TAG_FLOAT: part = PyUnicode_FromString("float"); break;
        case TAG_BOOL: part = PyUnicode_FromString("bool"); break;
        default: part = NULL; PyErr_SetString(PyExc_ValueError, "not a key word");
        }
        if (!part) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, i, part);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS, "Set the DLPack API, tensor types, dtypes and error callback."},
    {"use_driver", use_driver, METH_NOARGS, "Launch through libcuda."},
    {"use_stub_driver", use_stub_driver, METH_O, "Report launches to a Python hook instead (tests)."},
    {"describe", describe, METH_O, "A tensor as DLPack describes it."},
    {"current_stream", current_stream, METH_O, "The current CUDA stream of a device, as DLPack gives it."},
    {"decode", decode, METH_O, "A dispatch key's parts."},
    {"driver_floor", driver_floor, METH_VARARGS, "Nanoseconds per bare cuLaunchKernel of a parameterless kernel."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "mgjit_launch", NULL, -1, methods};

PyMODINIT_FUNC PyInit_mgjit_launch(void) {
    if (PyType_Ready(&PlanType) < 0 || PyType_Ready(&DispatcherType) < 0 || PyType_Ready(&LaunchType) < 0 ||
        PyType_Ready(&TunedType) < 0)
        return NULL;
    s_num_warpgroups = PyUnicode_InternFromString("num_warpgroups");
    s_cluster = PyUnicode_InternFromString("cluster");
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddObject(m, "Plan", Py_NewRef((PyObject *)&PlanType)) < 0 ||
        PyModule_AddObject(m, "Dispatcher", Py_NewRef((PyObject *)&DispatcherType)) < 0 ||
        PyModule_AddObject(m, "Tuned", Py_NewRef((PyObject *)&TunedType)) < 0 ||
        PyModule_AddIntConstant(m, "MAX_BUFFER", MAX_BUFFER) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
