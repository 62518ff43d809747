/* The C launcher's dispatch keys and their hash table. Part of mgjit/_launch.c's one translation unit (it #includes this file where the
 * text stands: the statics stay private to the module and the compiler sees every call); not built alone. */

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

static uint64_t float_bits(PyObject *f) {
    double d = PyFloat_AS_DOUBLE(f);
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    return bits;
}

/* A constexpr's hash: a float's by its bits (Python hashes each NaN object apart, and -0.0 with 0.0). */
static Py_hash_t hash_object(PyObject *o) {
    return PyFloat_CheckExact(o) ? (Py_hash_t)(float_bits(o) >> 1) : PyObject_Hash(o);
}

static Py_hash_t hash_key(const uint64_t *words, Py_ssize_t nwords, PyObject *const *objects, Py_ssize_t nobjects) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)nwords;
    for (Py_ssize_t i = 0; i < nwords; i++) { h ^= words[i]; h *= 0xff51afd7ed558ccdULL; h ^= h >> 33; }
    for (Py_ssize_t i = 0; i < nobjects; i++) {
        Py_hash_t o = hash_object(objects[i]);
        if (o == -1) return -1;
        h ^= (uint64_t)o; h *= 0xc4ceb9fe1a85ec53ULL; h ^= h >> 29;
    }
    Py_hash_t out = (Py_hash_t)(h >> 1);
    return out == -1 ? 1 : out;
}

/* Equal constexprs (mgjit.launch.strict_constexpr in C): the same object, or of the same type and equal, so
 * that 1, 1.0 and True differ; floats by their bits, so that -0.0 and 0.0 differ and a NaN finds itself; tuples
 * element by element by the same rule. */
static int same_object(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    if (Py_TYPE(a) != Py_TYPE(b)) return 0;
    if (PyFloat_CheckExact(a)) return float_bits(a) == float_bits(b);
    if (PyTuple_CheckExact(a)) {
        Py_ssize_t n = PyTuple_GET_SIZE(a);
        if (n != PyTuple_GET_SIZE(b)) return 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            int same = same_object(PyTuple_GET_ITEM(a, i), PyTuple_GET_ITEM(b, i));
            if (same != 1) return same;
        }
        return 1;
    }
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
