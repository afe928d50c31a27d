/* gemmrl's hot call path built against torch's own headers: fastpath.c's lookup, checks and launch, with the
 * operands' metadata read from their at::Tensor (a few ns each) instead of through ~18 Python attribute calls.
 * Built on first use by gemmrl/serve/fastpath.py for the installed torch (its version is in the build key: the
 * TensorImpl layout this reads is torch's, per version); where it cannot be built, fastpath.c serves.
 *
 * mm(a, b, out) -> out. Everything not on the hot path (a signature not put() yet, a wrong dtype/device/out,
 * autograd, tensor subclasses, non-strided layouts) goes to the Python `slow(a, b, out)` given to init(), which
 * decides, raises the clear errors, and put()s what it built.
 *
 * put(a, b, entry): serve calls whose a and b have a's shape and row-majorness, b's shape and strides, a's dtype
 *   and device with entry = (out_shape, dtype, dev, empty_kwargs, eager, graph, getstream), fastpath.c's entry.
 *   A signature whose a is not row-major is only ever served by torch.matmul (spec kind 3: ATen's matmul_out
 *   reads any strides); backward's weight gradient is one, [N, M] @ [M, K] with the activation's gradient
 *   transposed, and through Python it cost ~10 us per call more than torch.matmul.
 * clear(): forget every entry.
 * With eager is not graph, the graph spec serves inside CUDA-graph capture. Whether torch's current stream is
 * capturing is asked of the driver (cuStreamIsCapturing, resolved from the already loaded libcuda.so.1), else of
 * torch._C._cuda_isCurrentStreamCapturing(); only when that stream is not the legacy default stream (handle 0),
 * which cannot be captured. (Through Python the question cost 1-2 us per call in the offline protocol: more than
 * everything else this path does.)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/matmul.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/python_variable.h>

#include <dlfcn.h>

#include <cstring>
#include <exception>
#include <unordered_map>

#include "fastpath_spec.h"

namespace {

PyObject *g_tensor, *g_slow, *g_capturing;

typedef int (*stream_is_capturing_fn)(void *stream, int *status);  // CUresult cuStreamIsCapturing(CUstream, ...)
stream_is_capturing_fn g_is_capturing = nullptr;

/* Is `stream` (not the legacy default stream) capturing? 1 yes, 0 no, -1 error (exception set). */
int capturing(void *stream) {
    if (g_is_capturing) {
        int status = 0;
        if (g_is_capturing(stream, &status) == 0) return status != 0;  // active or invalidated: in a capture
    }
    PyObject *c = PyObject_CallNoArgs(g_capturing);
    if (!c) return -1;
    int v = c == Py_True;
    Py_DECREF(c);
    return v;
}

constexpr int kMaxDims = 8;
constexpr int kRowMajor = 1 + kMaxDims + 7;  // the key's slot saying whether a is row-major

struct Key {
    int64_t v[1 + kMaxDims + 8];  // ndim(a), a's sizes (padded), b's sizes and strides, dtype, device, row-major a
    bool operator==(const Key &o) const { return std::memcmp(v, o.v, sizeof v) == 0; }
};

struct KeyHash {
    size_t operator()(const Key &k) const {
        uint64_t h = 1469598103934665603ull;
        for (int64_t x : k.v) h = (h ^ (uint64_t)x) * 1099511628211ull;
        return (size_t)h;
    }
};

std::unordered_map<Key, PyObject *, KeyHash> g_entries;  // owned references

/* The key of (a, b), a strided plain tensor pair with a of at most kMaxDims dims; false where there is none. */
bool make_key(const at::Tensor &a, const at::Tensor &b, Key &k) {
    if (a.layout() != c10::kStrided || b.layout() != c10::kStrided || a.is_nested() || b.is_nested()) return false;
    int64_t n = a.dim();
    if (n < 2 || n > kMaxDims || b.dim() != 2) return false;
    std::memset(k.v, 0, sizeof k.v);
    k.v[0] = n;
    auto as = a.sizes();
    for (int64_t i = 0; i < n; i++) k.v[1 + i] = as[i];
    int64_t *t = k.v + 1 + kMaxDims;  // 8 slots left: t[0..7]
    static_assert(sizeof(k.v) / sizeof(k.v[0]) == 1 + kMaxDims + 8, "key layout");
    t[0] = b.size(0);
    t[1] = b.size(1);
    t[2] = b.stride(0);
    t[3] = b.stride(1);
    t[4] = (int64_t)a.scalar_type();
    t[5] = (int64_t)a.device().type();
    t[6] = a.device().index();
    t[7] = a.is_contiguous();  // k.v[kRowMajor]
    return true;
}

PyObject *slow(PyObject *const *args) { return PyObject_Vectorcall(g_slow, args, 3, NULL); }

bool plain(PyObject *o) { return (PyObject *)Py_TYPE(o) == g_tensor; }

/* References mm_impl owns, released on every way out (torch may throw after they are taken). */
struct Owned {
    PyObject *entry = nullptr, *o = nullptr, *st = nullptr, *ptr[3] = {nullptr, nullptr, nullptr};
    ~Owned() {
        for (PyObject *x : ptr) Py_XDECREF(x);
        Py_XDECREF(st);
        Py_XDECREF(o);
        Py_XDECREF(entry);
    }
};

PyObject *mm_impl(PyObject *const *args) {
    PyObject *a = args[0], *b = args[1], *out = args[2];
    if (!plain(a) || !plain(b) || (out != Py_None && !plain(out))) return slow(args);
    const at::Tensor &ta = THPVariable_Unpack(a);
    const at::Tensor &tb = THPVariable_Unpack(b);
    if ((ta.requires_grad() || tb.requires_grad()) && c10::GradMode::is_enabled()) return slow(args);
    Key k;
    if (!make_key(ta, tb, k)) return slow(args);
    auto it = g_entries.find(k);
    if (it == g_entries.end()) return slow(args);
    if (tb.scalar_type() != ta.scalar_type() || tb.device() != ta.device()) return slow(args);
    Owned r;
    r.entry = it->second;
    Py_INCREF(r.entry); /* the table may change under a Python callback below */
    PyObject *spec = PyTuple_GET_ITEM(r.entry, 4), *graph = PyTuple_GET_ITEM(r.entry, 5);
    at::Tensor tout;
    if (out == Py_None) {
        std::vector<int64_t> shape(ta.sizes().begin(), ta.sizes().end());
        shape.back() = tb.size(1);
        tout = at::empty(shape, ta.options());
        if (!(r.o = THPVariable_Wrap(tout))) return NULL;
    } else {
        tout = THPVariable_Unpack(out);
        auto os = tout.sizes(), as = ta.sizes();
        bool ok = tout.layout() == c10::kStrided && !tout.is_nested() && (int64_t)os.size() == (int64_t)as.size() &&
                  tout.scalar_type() == ta.scalar_type() && tout.device() == ta.device();
        for (size_t i = 0; ok && i + 1 < as.size(); i++) ok = os[i] == as[i];
        if (!(ok && os.back() == tb.size(1) && tout.is_contiguous())) return slow(args);
        Py_INCREF(out);
        r.o = out;
    }
    if (graph != spec && ta.is_cuda()) {
        /* the legacy default stream (raw handle 0) cannot be captured: ask only on other streams */
        PyObject *devo = PyTuple_GET_ITEM(r.entry, 2);
        if (!(r.st = PyObject_Vectorcall(PyTuple_GET_ITEM(r.entry, 6), &devo, 1, NULL))) return NULL;
        void *h = PyLong_AsVoidPtr(r.st);
        if (PyErr_Occurred()) return NULL;
        if (h) {
            int c = capturing(h);
            if (c < 0) return NULL;
            if (c) spec = graph;
        }
    }
    if (PyLong_AsLong(PyTuple_GET_ITEM(spec, 0)) == 3) {  /* torch.matmul(a, b, out=out), without Python */
        at::matmul_out(tout, ta, tb);
        PyObject *res = r.o;
        r.o = nullptr;
        return res;
    }
    if (!k.v[kRowMajor]) return slow(args);  /* launchers read a row-major a only (none is put for others) */
    unsigned long long p[3] = {(unsigned long long)(uintptr_t)ta.const_data_ptr(),
                               (unsigned long long)(uintptr_t)tb.const_data_ptr(),
                               (unsigned long long)(uintptr_t)tout.mutable_data_ptr()};
    if (gemmrl_run_spec(spec, a, b, r.o, p, r.ptr, r.st) != 0) return NULL;
    PyObject *res = r.o;
    r.o = nullptr;  /* handed to the caller */
    return res;
}

PyObject *fast_mm(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "gemmrl fastpath mm(a, b, out)");
        return NULL;
    }
    if (!g_slow) {
        PyErr_SetString(PyExc_RuntimeError, "gemmrl fastpath: init() not called");
        return NULL;
    }
    try {
        return mm_impl(args);
    } catch (const std::exception &e) {
        /* torch refused a metadata read (an unusual tensor): the full path decides and explains */
        if (PyErr_Occurred()) return NULL;
        return slow(args);
    }
}

PyObject *put(PyObject *, PyObject *args) {
    PyObject *a, *b, *entry;
    if (!PyArg_ParseTuple(args, "OOO!", &a, &b, &PyTuple_Type, &entry)) return NULL;
    if (!g_tensor || !plain(a) || !plain(b) || PyTuple_GET_SIZE(entry) != 7) {
        PyErr_SetString(PyExc_TypeError, "gemmrl fastpath put(a, b, entry): init() first; plain tensors; a 7-tuple");
        return NULL;
    }
    Key k;
    try {
        if (!make_key(THPVariable_Unpack(a), THPVariable_Unpack(b), k)) {
            PyErr_SetString(PyExc_ValueError, "gemmrl fastpath put: no key for these tensors");
            return NULL;
        }
    } catch (const std::exception &e) {
        PyErr_SetString(PyExc_ValueError, e.what());
        return NULL;
    }
    Py_INCREF(entry);
    auto r = g_entries.emplace(k, entry);
    if (!r.second) {
        PyObject *old = r.first->second;
        r.first->second = entry;
        Py_DECREF(old);
    }
    Py_RETURN_NONE;
}

PyObject *clear(PyObject *, PyObject *) {
    std::unordered_map<Key, PyObject *, KeyHash> gone;
    gone.swap(g_entries);  // decref after the swap: a destructor running Python sees an empty table
    for (auto &kv : gone) Py_DECREF(kv.second);
    Py_RETURN_NONE;
}

PyObject *size(PyObject *, PyObject *) { return PyLong_FromSize_t(g_entries.size()); }

PyObject *driver_capture_query(PyObject *, PyObject *) { return PyBool_FromLong(g_is_capturing != nullptr); }

PyObject *init(PyObject *, PyObject *args) {
    PyObject *tensor, *slow_fn, *capturing;
    if (!PyArg_ParseTuple(args, "OOO", &tensor, &slow_fn, &capturing)) return NULL;
    PyObject *objs[3] = {tensor, slow_fn, capturing};
    PyObject **dst[3] = {&g_tensor, &g_slow, &g_capturing};
    for (int i = 0; i < 3; i++) {
        Py_INCREF(objs[i]);
        Py_XSETREF(*dst[i], objs[i]);
    }
    /* the driver torch loaded (never loaded here: RTLD_NOLOAD); without it, torch is asked */
    void *cuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    g_is_capturing = cuda ? (stream_is_capturing_fn)dlsym(cuda, "cuStreamIsCapturing") : nullptr;
    Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"mm", (PyCFunction)(void (*)(void))fast_mm, METH_FASTCALL, "mm(a, b, out): gemmrl's hot path"},
    {"put", put, METH_VARARGS, "put(a, b, entry): serve this signature with entry"},
    {"clear", clear, METH_NOARGS, "forget every entry"},
    {"size", size, METH_NOARGS, "number of entries"},
    {"driver_capture_query", driver_capture_query, METH_NOARGS, "whether capture is asked of the driver"},
    {"init", init, METH_VARARGS, "init(Tensor, slow, capturing)"},
    {NULL, NULL, 0, NULL},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gemmrl_fastpath_torch", NULL, -1, methods, NULL, NULL, NULL, NULL};

}  // namespace

PyMODINIT_FUNC PyInit__gemmrl_fastpath_torch(void) { return PyModule_Create(&module); }
