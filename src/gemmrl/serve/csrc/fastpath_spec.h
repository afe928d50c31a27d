/* Running a served spec: shared by gemmrl's two hot paths (fastpath.c, CPython API only; fastpath_torch.cpp,
 * built against torch's headers). C and C++; static functions only, included once per extension.
 *
 * A spec (see fastpath.c):
 *   (0, fn)                                         fn(a, b, out)
 *   (3, fn)                                         torch.matmul(a, b, out=out), which fn does: a hot path that can
 *                                                   call ATen itself does (fastpath_torch.cpp), others call fn
 *   (1, getstream, dev, mask, fallback, launches)   Triton: each launch (fn, head[13], args, slots) is called as
 *       fn(head[0..2], stream, head[4..12], *args) with args[pos] = pointer of operand `which` for each
 *       (pos, which) in slots (0/1/2 = a/b/out)
 *   (2, getstream, dev, mask, fallback, fnaddr, plan, error)   int fn(plan, a, b, c, stream); error(status) on a
 *       nonzero status (it raises)
 * Pointers with (pa | pb | pc) & mask go to fallback(a, b, out) (the kernel was built for aligned ones).
 */
#ifndef GEMMRL_FASTPATH_SPEC_H
#define GEMMRL_FASTPATH_SPEC_H

#include <Python.h>
#include <stdint.h>

#define GEMMRL_MAX_ARGS 96

static int gemmrl_run_launches(PyObject *launches, PyObject *stream, PyObject *ptr[3]) {
    Py_ssize_t nl = PyTuple_GET_SIZE(launches);
    PyObject *argv[GEMMRL_MAX_ARGS];
    for (Py_ssize_t i = 0; i < nl; i++) {
        PyObject *l = PyTuple_GET_ITEM(launches, i);
        PyObject *fn = PyTuple_GET_ITEM(l, 0), *head = PyTuple_GET_ITEM(l, 1);
        PyObject *args = PyTuple_GET_ITEM(l, 2), *slots = PyTuple_GET_ITEM(l, 3);
        Py_ssize_t nh = PyTuple_GET_SIZE(head), na = PyTuple_GET_SIZE(args);
        if (nh + na > GEMMRL_MAX_ARGS || nh < 4) {
            PyErr_SetString(PyExc_RuntimeError, "gemmrl fastpath: launcher with too many arguments");
            return -1;
        }
        for (Py_ssize_t k = 0; k < nh; k++) argv[k] = PyTuple_GET_ITEM(head, k);
        argv[3] = stream;
        for (Py_ssize_t k = 0; k < na; k++) argv[nh + k] = PyTuple_GET_ITEM(args, k);
        Py_ssize_t ns = PyTuple_GET_SIZE(slots);
        for (Py_ssize_t k = 0; k < ns; k++) {
            PyObject *s = PyTuple_GET_ITEM(slots, k);
            Py_ssize_t pos = PyLong_AsSsize_t(PyTuple_GET_ITEM(s, 0));
            long which = PyLong_AsLong(PyTuple_GET_ITEM(s, 1));
            if (pos < 0 || pos >= na || which < 0 || which > 2) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "gemmrl fastpath: bad launch slot");
                return -1;
            }
            argv[nh + pos] = ptr[which];
        }
        PyObject *r = PyObject_Vectorcall(fn, argv, nh + na, NULL);
        if (!r) return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* Launch `spec` on operands a, b, out whose data pointers are p[0..2]. ptr[i] is p[i] as a Python int, or NULL
 * (made here where a Triton launch needs it; the caller releases ptr[] either way). `stream`: the spec's device's
 * current raw stream where the caller has asked already (borrowed), else NULL. 0 launched, -1 error. */
static int gemmrl_run_spec(PyObject *spec, PyObject *a, PyObject *b, PyObject *out, const unsigned long long p[3],
                           PyObject *ptr[3], PyObject *stream) {
    long kind = PyLong_AsLong(PyTuple_GET_ITEM(spec, 0));
    if (kind == 0 || kind == 3) {
        PyObject *argv[3] = {a, b, out};
        PyObject *r = PyObject_Vectorcall(PyTuple_GET_ITEM(spec, 1), argv, 3, NULL);
        if (!r) return -1;
        Py_DECREF(r);
        return 0;
    }
    if (kind != 1 && kind != 2) {  /* 0 and 3 returned above */
        if (!PyErr_Occurred()) PyErr_Format(PyExc_RuntimeError, "gemmrl fastpath: unknown spec kind %ld", kind);
        return -1;
    }
    unsigned long long mask = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(spec, 3));
    if (mask == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    if ((p[0] | p[1] | p[2]) & mask) {
        PyObject *argv[3] = {a, b, out};
        PyObject *r = PyObject_Vectorcall(PyTuple_GET_ITEM(spec, 4), argv, 3, NULL);
        if (!r) return -1;
        Py_DECREF(r);
        return 0;
    }
    PyObject *dev = PyTuple_GET_ITEM(spec, 2);
    if (stream) {
        Py_INCREF(stream);
    } else if (!(stream = PyObject_Vectorcall(PyTuple_GET_ITEM(spec, 1), &dev, 1, NULL))) {
        return -1;
    }
    int rc = -1;
    if (kind == 1) {
        for (int i = 0; i < 3; i++) {
            if (!ptr[i] && !(ptr[i] = PyLong_FromUnsignedLongLong(p[i]))) goto done;
        }
        rc = gemmrl_run_launches(PyTuple_GET_ITEM(spec, 5), stream, ptr);
    } else {
        typedef int (*run_fn)(void *, const void *, const void *, void *, void *);
        run_fn f = (run_fn)PyLong_AsVoidPtr(PyTuple_GET_ITEM(spec, 5));
        void *plan = PyLong_AsVoidPtr(PyTuple_GET_ITEM(spec, 6));
        void *st = PyLong_AsVoidPtr(stream);
        if (PyErr_Occurred()) goto done;
        int status = f(plan, (const void *)(uintptr_t)p[0], (const void *)(uintptr_t)p[1], (void *)(uintptr_t)p[2],
                       st);
        if (status) {
            PyObject *s = PyLong_FromLong(status);
            PyObject *r = s ? PyObject_Vectorcall(PyTuple_GET_ITEM(spec, 7), &s, 1, NULL) : NULL;
            Py_XDECREF(s);
            if (r) { /* error() is meant to raise; if it returns, the status stands as an error */
                Py_DECREF(r);
                PyErr_Format(PyExc_RuntimeError, "gemmrl fastpath: vendor call failed with status %d", status);
            }
        } else {
            rc = 0;
        }
    }
done:
    Py_DECREF(stream);
    return rc;
}

#endif
