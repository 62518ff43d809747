/* The C launcher's stub driver and launch plans (packing, TMA encoding, the driver call). Part of mgjit/_launch.c's one translation unit (it #includes this file where the
 * text stands: the statics stay private to the module and the compiler sees every call); not built alone. */

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
