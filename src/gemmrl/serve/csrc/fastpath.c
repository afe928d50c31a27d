/* gemmrl's hot call path in C (CPython API only, no torch headers): the lookup, checks and launch of
 * gemmrl.mm for a call signature already seen. Built on first use by gemmrl/serve/fastpath.py; dispatch.py falls
 * back to its pure-Python hot path where it cannot be built.
 *
 * mm(a, b, out) -> out. Everything not on the hot path (a signature not seen yet, a non-contiguous a, a
 * wrong dtype/device/out, autograd) is handed to the Python `slow(a, b, out)` given to init(), which
 * decides, raises the clear errors, and fills the table.
 *
 * table: dict, key (a.shape, b.shape, b.stride(), a.dtype, a.get_device()) -> entry
 *   entry = (out_shape, dtype, dev, empty_kwargs, eager, graph, getstream)
 *   eager / graph are specs, run by fastpath_spec.h (which says what one holds).
 *   With eager is not graph, torch._C._cuda_isCurrentStreamCapturing() picks the graph spec inside capture
 *   (asked only when torch's current stream is not the legacy default stream, which cannot be captured).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "fastpath_spec.h"

static PyObject *g_tensor, *g_table, *g_slow, *g_capturing, *g_grad_enabled, *g_empty;
static PyObject *s_shape, *s_stride, *s_dtype, *s_get_device, *s_is_contiguous, *s_data_ptr, *s_requires_grad;

static PyObject *slow(PyObject *const *args) { return PyObject_Vectorcall(g_slow, args, 3, NULL); }

/* o.name (call = 0) or o.name() (call = 1) is True: 1, False: 0, error: -1 */
static int flag(PyObject *o, PyObject *name, int call) {
    PyObject *r = call ? PyObject_CallMethodNoArgs(o, name) : PyObject_GetAttr(o, name);
    if (!r) return -1;
    int v = r == Py_True;
    Py_DECREF(r);
    return v;
}

/* a.get_device() == dev ? 1 : 0 ; -1 error */
static int same_device(PyObject *o, long dev) {
    PyObject *r = PyObject_CallMethodNoArgs(o, s_get_device);
    if (!r) return -1;
    long d = PyLong_AsLong(r);
    Py_DECREF(r);
    if (d == -1 && PyErr_Occurred()) return -1;
    return d == dev;
}

/* 0 launched, -1 error (exception set) */
static int run_spec(PyObject *spec, PyObject *a, PyObject *b, PyObject *out) {
    PyObject *ptr[3] = {NULL, NULL, NULL};
    PyObject *ops[3] = {a, b, out};
    unsigned long long p[3] = {0, 0, 0};
    int rc = -1;
    long kind = PyLong_AsLong(PyTuple_GET_ITEM(spec, 0));
    if (kind == 1 || kind == 2) { /* 0 and 3 call a Python function with the tensors */
        for (int i = 0; i < 3; i++) {
            ptr[i] = PyObject_CallMethodNoArgs(ops[i], s_data_ptr);
            if (!ptr[i]) goto done;
            p[i] = PyLong_AsUnsignedLongLong(ptr[i]);
            if (p[i] == (unsigned long long)-1 && PyErr_Occurred()) goto done;
        }
    }
    rc = gemmrl_run_spec(spec, a, b, out, p, ptr, NULL);
done:
    for (int i = 0; i < 3; i++) Py_XDECREF(ptr[i]);
    return rc;
}

static PyObject *fast_mm(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "gemmrl fastpath mm(a, b, out)");
        return NULL;
    }
    if (!g_table) {
        PyErr_SetString(PyExc_RuntimeError, "gemmrl fastpath: init() not called");
        return NULL;
    }
    PyObject *a = args[0], *b = args[1], *out = args[2];
    if ((PyObject *)Py_TYPE(a) != g_tensor || (PyObject *)Py_TYPE(b) != g_tensor) return slow(args);
    int ra = flag(a, s_requires_grad, 0), rb = ra < 0 ? -1 : flag(b, s_requires_grad, 0);
    if (ra < 0 || rb < 0) return NULL;
    if (ra || rb) {
        PyObject *g = PyObject_CallNoArgs(g_grad_enabled);
        if (!g) return NULL;
        int on = g == Py_True;
        Py_DECREF(g);
        if (on) return slow(args);
    }
    PyObject *key = PyTuple_New(5);
    if (!key) return NULL;
    PyObject *k0 = PyObject_GetAttr(a, s_shape), *k1 = k0 ? PyObject_GetAttr(b, s_shape) : NULL;
    PyObject *k2 = k1 ? PyObject_CallMethodNoArgs(b, s_stride) : NULL;
    PyObject *k3 = k2 ? PyObject_GetAttr(a, s_dtype) : NULL;
    PyObject *k4 = k3 ? PyObject_CallMethodNoArgs(a, s_get_device) : NULL;
    PyTuple_SET_ITEM(key, 0, k0 ? k0 : (Py_INCREF(Py_None), Py_None));
    PyTuple_SET_ITEM(key, 1, k1 ? k1 : (Py_INCREF(Py_None), Py_None));
    PyTuple_SET_ITEM(key, 2, k2 ? k2 : (Py_INCREF(Py_None), Py_None));
    PyTuple_SET_ITEM(key, 3, k3 ? k3 : (Py_INCREF(Py_None), Py_None));
    PyTuple_SET_ITEM(key, 4, k4 ? k4 : (Py_INCREF(Py_None), Py_None));
    if (!k4) { Py_DECREF(key); return NULL; }
    PyObject *entry = PyDict_GetItemWithError(g_table, key); /* borrowed */
    Py_DECREF(key);
    if (!entry) return PyErr_Occurred() ? NULL : slow(args);
    Py_INCREF(entry); /* the table may change under a Python callback below */
    PyObject *res = NULL;
    PyObject *out_shape = PyTuple_GET_ITEM(entry, 0), *dtype = PyTuple_GET_ITEM(entry, 1);
    long dev = PyLong_AsLong(PyTuple_GET_ITEM(entry, 2));
    PyObject *bd = PyObject_GetAttr(b, s_dtype);
    if (!bd) goto fail;
    int ok = bd == dtype;
    Py_DECREF(bd);
    int t;
    if (ok) { t = same_device(b, dev); if (t < 0) goto fail; ok = t; }
    if (ok) { t = flag(a, s_is_contiguous, 1); if (t < 0) goto fail; ok = t; }
    if (!ok) { res = slow(args); goto fail; }
    PyObject *o;
    if (out == Py_None) {
        PyObject *shape_args = PyTuple_Pack(1, out_shape);
        if (!shape_args) goto fail;
        o = PyObject_Call(g_empty, shape_args, PyTuple_GET_ITEM(entry, 3));
        Py_DECREF(shape_args);
        if (!o) goto fail;
    } else {
        PyObject *os = PyObject_GetAttr(out, s_shape);
        if (!os) goto fail;
        t = PyObject_RichCompareBool(os, out_shape, Py_EQ);
        Py_DECREF(os);
        if (t < 0) goto fail;
        ok = t;
        if (ok) {
            PyObject *od = PyObject_GetAttr(out, s_dtype);
            if (!od) goto fail;
            ok = od == dtype;
            Py_DECREF(od);
        }
        if (ok) { t = flag(out, s_is_contiguous, 1); if (t < 0) goto fail; ok = t; }
        if (ok) { t = same_device(out, dev); if (t < 0) goto fail; ok = t; }
        if (!ok) { res = slow(args); goto fail; }
        Py_INCREF(out);
        o = out;
    }
    PyObject *spec = PyTuple_GET_ITEM(entry, 4), *graph = PyTuple_GET_ITEM(entry, 5);
    if (graph != spec && dev >= 0) {
        /* the legacy default stream (raw handle 0) cannot be captured: ask the runtime only on other streams */
        PyObject *devo = PyTuple_GET_ITEM(entry, 2);
        PyObject *st = PyObject_Vectorcall(PyTuple_GET_ITEM(entry, 6), &devo, 1, NULL);
        if (!st) { Py_DECREF(o); goto fail; }
        void *h = PyLong_AsVoidPtr(st);
        Py_DECREF(st);
        if (PyErr_Occurred()) { Py_DECREF(o); goto fail; }
        if (h) {
            PyObject *c = PyObject_CallNoArgs(g_capturing);
            if (!c) { Py_DECREF(o); goto fail; }
            if (c == Py_True) spec = graph;
            Py_DECREF(c);
        }
    }
    if (run_spec(spec, a, b, o) < 0) { Py_DECREF(o); goto fail; }
    res = o;
fail:
    Py_DECREF(entry);
    return res;
}

static PyObject *init(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *tensor, *table, *slow_fn, *capturing, *grad_enabled, *empty;
    if (!PyArg_ParseTuple(args, "OO!OOOO", &tensor, &PyDict_Type, &table, &slow_fn, &capturing, &grad_enabled, &empty))
        return NULL;
    PyObject *objs[6] = {tensor, table, slow_fn, capturing, grad_enabled, empty};
    PyObject **dst[6] = {&g_tensor, &g_table, &g_slow, &g_capturing, &g_grad_enabled, &g_empty};
    for (int i = 0; i < 6; i++) {
        Py_INCREF(objs[i]);
        Py_XSETREF(*dst[i], objs[i]);
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"mm", (PyCFunction)(void (*)(void))fast_mm, METH_FASTCALL, "mm(a, b, out): gemmrl's hot path"},
    {"init", init, METH_VARARGS, "init(Tensor, table, slow, capturing, grad_enabled, empty)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gemmrl_fastpath", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__gemmrl_fastpath(void) {
    const char *names[7] = {"shape", "stride", "dtype", "get_device", "is_contiguous", "data_ptr", "requires_grad"};
    PyObject **dst[7] = {&s_shape, &s_stride, &s_dtype, &s_get_device, &s_is_contiguous, &s_data_ptr, &s_requires_grad};
    for (int i = 0; i < 7; i++) {
        *dst[i] = PyUnicode_InternFromString(names[i]);
        if (!*dst[i]) return NULL;
    }
    return PyModule_Create(&module);
}
