/* mgjit's launch fast path: one C call per `kernel[grid](...)` binds the arguments, computes the dispatch key
 * from the torch tensors (through the DLPack C exchange API: no Python attribute access), finds the launch
 * plan, packs the parameter buffer, encodes the TMA descriptors and calls cuLaunchKernel(Ex) on torch's
 * current stream. Anything unusual goes back to Python: a miss (which compiles and returns a plan), or the
 * slow path (which explains, or runs the call in Python).
 *
 * One translation unit in four files (this one #includes _launch_keys.c, _launch_plan.c and _launch_tuned.c
 * where their text belongs). Built on first use by mgjit/fastlaunch.py with the system C compiler. It needs no CUDA or DLPack headers
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

#include "_launch_keys.c"
#include "_launch_plan.c"

/* ---- Dispatcher: a kernel's parameters, its table of plans, and the Python paths */
typedef struct {
    PyObject_HEAD
    Py_ssize_t nparams, nruntime, nconst;
    PyObject *names;      /* tuple of interned parameter names */
    PyObject *defaults;   /* tuple: each parameter's default, or `missing` */
    PyObject *missing;
    char *is_const;
    PyObject *watched;    /* reads that must still give their objects (mgjit.deps.Dependencies.watched); NULL: none */
    PyObject *guard;      /* guard() -> true when another read changed; NULL when nothing else can */
    PyObject *miss;       /* miss(key, runtime values, constexprs, num_warpgroups, cluster) -> Plan or None */
    PyObject *slow;       /* slow(grid, *args, **kwargs): the Python path */
    Table plans;
} Dispatcher;

static PyObject *s_num_warpgroups, *s_cluster;

static int dispatcher_traverse(Dispatcher *d, visitproc visit, void *arg) {
    Py_VISIT(d->watched); Py_VISIT(d->guard); Py_VISIT(d->miss); Py_VISIT(d->slow); Py_VISIT(d->defaults);
    for (Py_ssize_t i = 0; i < d->plans.capacity; i++)
        if (d->plans.entries[i].value) { Py_VISIT(d->plans.entries[i].objects); Py_VISIT(d->plans.entries[i].value); }
    return 0;
}

static int dispatcher_clear_refs(Dispatcher *d) {
    Py_CLEAR(d->watched); Py_CLEAR(d->guard); Py_CLEAR(d->miss); Py_CLEAR(d->slow); Py_CLEAR(d->defaults);
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

/* 1 when a watched read (set_guard) no longer gives its object, 0 when each still does, -1 on an error. A dict
 * lookup and a pointer comparison per name: a row example's kernel reads some 40 globals of three modules, whose
 * check as Python calls took 3 of the 5 us its launch cost (CPU). */
static int watched_changed(PyObject *watched) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(watched); i++) {
        PyObject *e = PyTuple_GET_ITEM(watched, i), *holder = PyTuple_GET_ITEM(e, 0), *names = PyTuple_GET_ITEM(e, 1),
                 *expected = PyTuple_GET_ITEM(e, 2);
        if (PyUnicode_Check(names)) {
            PyObject *v = PyObject_GetAttr(holder, names);
            if (!v) { PyErr_Clear(); return 1; }
            Py_DECREF(v);
            if (v != expected) return 1;
            continue;
        }
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(names); j++) {
            PyObject *v = PyDict_GetItemWithError(holder, PyTuple_GET_ITEM(names, j));
            if (v != PyTuple_GET_ITEM(expected, j)) return v || !PyErr_Occurred() ? 1 : -1;
        }
    }
    return 0;
}

/* The fast path over bound arguments: slots[i] holds parameter i (borrowed); args, nargsf and kwnames are the
 * call as it was made (args NULL for a call the autotuner bound). */
static PyObject *dispatch(Dispatcher *d, PyObject *grid, PyObject **slots, PyObject *nwg, PyObject *cluster,
                          PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (interpret_requested()) return slow_path(d, grid, slots, nwg, cluster, args, nargsf, kwnames);
    if (d->watched) {
        int changed = watched_changed(d->watched);
        if (changed) return changed < 0 ? NULL : slow_path(d, grid, slots, nwg, cluster, args, nargsf, kwnames);
    }
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

/* set_guard(watched, guard): what each launch checks first (see the Dispatcher's fields). Each entry of watched is
 * (a dict, names, objects: each name must still map to its object) or (an object, an attribute name, the object
 * that attribute must still be); checked here, so that the launch fast path needs no more than this. */
static PyObject *dispatcher_set_guard(Dispatcher *d, PyObject *args) {
    PyObject *watched, *guard;
    if (!PyArg_ParseTuple(args, "O!O", &PyTuple_Type, &watched, &guard)) return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(watched); i++) {
        PyObject *e = PyTuple_GET_ITEM(watched, i);
        int ok = PyTuple_Check(e) && PyTuple_GET_SIZE(e) == 3;
        if (ok && !PyUnicode_Check(PyTuple_GET_ITEM(e, 1)))
            ok = PyDict_CheckExact(PyTuple_GET_ITEM(e, 0)) && PyTuple_Check(PyTuple_GET_ITEM(e, 1)) &&
                 PyTuple_Check(PyTuple_GET_ITEM(e, 2)) &&
                 PyTuple_GET_SIZE(PyTuple_GET_ITEM(e, 1)) == PyTuple_GET_SIZE(PyTuple_GET_ITEM(e, 2));
        if (!ok)
            return PyErr_Format(PyExc_TypeError, "a watched entry is (dict, names, objects) of equal lengths or "
                                "(object, attribute name, object), got %R", e);
    }
    Py_XSETREF(d->watched, PyTuple_GET_SIZE(watched) ? Py_NewRef(watched) : NULL);
    Py_XSETREF(d->guard, guard == Py_None ? NULL : Py_NewRef(guard));
    Py_RETURN_NONE;
}

static PyObject *dispatcher_clear(Dispatcher *d, PyObject *unused) {
    table_clear(&d->plans);
    Py_RETURN_NONE;
}

static PyObject *dispatcher_len(Dispatcher *d, PyObject *unused) { return PyLong_FromSsize_t(d->plans.used); }

static PyMethodDef dispatcher_methods[] = {
    {"set_guard", (PyCFunction)dispatcher_set_guard, METH_VARARGS,
     "set_guard(watched, guard): the reads checked by identity here, and guard() for the rest (None: none)."},
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

#include "_launch_tuned.c"

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
