/* mgjit's launch fast path: pack a launch's argument values into the kernel's parameter buffer and call
 * cuLaunchKernel, in one C call. Built on first use by mgjit/fastlaunch.py with the system C compiler; it
 * needs no CUDA headers (the few driver types are declared here) and finds the driver with dlopen.
 * The field codes and error returns come from mgjit/abi.py, which fastlaunch passes as -D definitions. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

typedef int (*cuLaunchKernel_t)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                unsigned bz, unsigned smem, void *stream, void **params, void **extra);
static cuLaunchKernel_t cu_launch = NULL;

#if !defined(MGJIT_FIELD_PTR) || !defined(MGJIT_FIELD_I32) || !defined(MGJIT_FIELD_I64) || \
    !defined(MGJIT_FIELD_F32) || !defined(MGJIT_FIELD_F64) || !defined(MGJIT_FIELD_I1) || \
    !defined(MGJIT_FIELD_TENSORMAP) || !defined(MGJIT_E_GRID) || !defined(MGJIT_E_VALUE) || !defined(MGJIT_E_COUNT)
#error "build with the definitions of mgjit.abi.c_defines()"
#endif

static int grid_dim(PyObject *o, unsigned long long limit, unsigned *out) {
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
    if (v == 0 || v > limit) return 0;
    *out = (unsigned)v;
    return 1;
}

/* launch(function, grid, threads, smem, stream, buffer, layout, values, pointers) -> int */
static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) { PyErr_SetString(PyExc_TypeError, "launch takes 9 arguments"); return NULL; }
    void *function = PyLong_AsVoidPtr(args[0]);
    PyObject *grid = args[1];
    unsigned threads = (unsigned)PyLong_AsUnsignedLong(args[2]);
    unsigned smem = (unsigned)PyLong_AsUnsignedLong(args[3]);
    void *stream = PyLong_AsVoidPtr(args[4]);
    char *buffer = (char *)PyLong_AsVoidPtr(args[5]);
    PyObject *layout = args[6], *values = args[7];
    void **pointers = (void **)PyLong_AsVoidPtr(args[8]);
    if (PyErr_Occurred()) return NULL;

    unsigned g[3] = {1, 1, 1};
    if (PyLong_Check(grid)) {
        if (!grid_dim(grid, 2147483647ULL, &g[0])) return PyLong_FromLong(MGJIT_E_GRID);
    } else if (PyTuple_Check(grid)) {
        Py_ssize_t n = PyTuple_GET_SIZE(grid);
        if (n < 1 || n > 3) return PyLong_FromLong(MGJIT_E_GRID);
        for (Py_ssize_t i = 0; i < n; i++)
            if (!grid_dim(PyTuple_GET_ITEM(grid, i), i ? 65535ULL : 2147483647ULL, &g[i]))
                return PyLong_FromLong(MGJIT_E_GRID);
    } else {
        return PyLong_FromLong(MGJIT_E_GRID);
    }

    const unsigned char *lay = (const unsigned char *)PyBytes_AS_STRING(layout);
    Py_ssize_t count = PyBytes_GET_SIZE(layout) / 5;
    if (!PyList_Check(values) || PyList_GET_SIZE(values) != count) return PyLong_FromLong(MGJIT_E_COUNT);
    for (Py_ssize_t i = 0; i < count; i++) {
        unsigned char code = lay[5 * i];
        uint32_t offset;
        memcpy(&offset, lay + 5 * i + 1, 4);
        PyObject *v = PyList_GET_ITEM(values, i);
        char *dst = buffer + offset;
        switch (code) {
        case MGJIT_FIELD_PTR: { unsigned long long x = PyLong_AsUnsignedLongLong(v); memcpy(dst, &x, 8); break; }
        case MGJIT_FIELD_I64: { long long x = PyLong_AsLongLong(v); memcpy(dst, &x, 8); break; }
        case MGJIT_FIELD_I32: {
            long long x = PyLong_AsLongLong(v);
            if (x > 2147483647LL || x < -2147483648LL) { PyErr_Clear(); return PyLong_FromLong(MGJIT_E_VALUE); }
            int32_t y = (int32_t)x; memcpy(dst, &y, 4); break;
        }
        case MGJIT_FIELD_F32: { float x = (float)PyFloat_AsDouble(v); memcpy(dst, &x, 4); break; }
        case MGJIT_FIELD_F64: { double x = PyFloat_AsDouble(v); memcpy(dst, &x, 8); break; }
        case MGJIT_FIELD_I1: { char x = (char)PyObject_IsTrue(v); *dst = x; break; }
        case MGJIT_FIELD_TENSORMAP: {
            if (!PyBytes_Check(v) || PyBytes_GET_SIZE(v) != 128) return PyLong_FromLong(MGJIT_E_VALUE);
            memcpy(dst, PyBytes_AS_STRING(v), 128); break;
        }
        default: return PyLong_FromLong(MGJIT_E_VALUE);
        }
        if (PyErr_Occurred()) { PyErr_Clear(); return PyLong_FromLong(MGJIT_E_VALUE); }
    }
    int rc = cu_launch(function, g[0], g[1], g[2], threads, 1, 1, smem, stream, pointers, NULL);
    return PyLong_FromLong(rc);
}

static PyMethodDef methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "Pack the values and launch."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "mgjit_launch", NULL, -1, methods};

PyMODINIT_FUNC PyInit_mgjit_launch(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) { PyErr_SetString(PyExc_ImportError, "libcuda.so.1 not found"); return NULL; }
    cu_launch = (cuLaunchKernel_t)dlsym(lib, "cuLaunchKernel");
    if (!cu_launch) { PyErr_SetString(PyExc_ImportError, "cuLaunchKernel not found in libcuda"); return NULL; }
    return PyModule_Create(&module);
}
