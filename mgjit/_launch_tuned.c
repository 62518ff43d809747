/* The C launcher's autotuned-kernel launch (Tuned). Part of mgjit/_launch.c's one translation unit (it #includes this file where the
 * text stands: the statics stay private to the module and the compiler sees every call); not built alone. */

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
