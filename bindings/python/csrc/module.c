/* ccq._ccq: the module, the tables of ccq.h exported to Python (statuses, dtypes, ops, kinds,
 * event types), versions, and how errors become ccq.Error subclasses. */
#define _GNU_SOURCE /* dladdr */
#include "ccqpy.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <ccq/version.h>

/* {status value: ccq.Error subclass}, and ccq.Error: set by ccq/_errors.py at import. */
static PyObject *error_classes;
static PyObject *error_base;

PyObject *ccqpy_raise(ccq_status st, const char *detail)
{
    if (detail == NULL)
        detail = ccq_last_error_detail();
    PyObject *cls;
    PyObject *key = PyLong_FromLong(st);
    if (key == NULL)
        return NULL;
    cls = error_classes ? PyDict_GetItemWithError(error_classes, key) : NULL;
    Py_DECREF(key);
    if (cls == NULL && PyErr_Occurred())
        return NULL;
    if (cls == NULL)
        cls = error_base ? error_base : PyExc_RuntimeError;
    /* A detail may quote a path or a user's string: never fail on its bytes. */
    PyObject *d = PyUnicode_DecodeUTF8(detail, (Py_ssize_t)strlen(detail), "replace");
    PyObject *exc = d ? PyObject_CallFunction(cls, "iN", (int)st, d) : NULL;
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

PyObject *ccqpy_raisef(ccq_status st, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return ccqpy_raise(st, buf);
}

static PyObject *set_errors(PyObject *mod, PyObject *args)
{
    PyObject *base, *classes;
    (void)mod;
    if (!PyArg_ParseTuple(args, "OO!:_set_errors", &base, &PyDict_Type, &classes))
        return NULL;
    Py_XSETREF(error_base, Py_NewRef(base));
    Py_XSETREF(error_classes, Py_NewRef(classes));
    Py_RETURN_NONE;
}

/* ((value, "CCQ_ERR_TIMEOUT", "timed out"), ...) from the one list in ccq.h. */
static PyObject *status_table(void)
{
    static const struct {
        int value;
        const char *name, *text;
    } rows[] = {
#define CCQPY_STATUS_ROW_(name, value, text) {value, #name, text},
        CCQ_STATUS_MAP(CCQPY_STATUS_ROW_)
#undef CCQPY_STATUS_ROW_
    };
    size_t n = sizeof rows / sizeof rows[0];
    PyObject *t = PyTuple_New((Py_ssize_t)n);
    for (size_t i = 0; t && i < n; i++) {
        PyObject *row = Py_BuildValue("(iss)", rows[i].value, rows[i].name, rows[i].text);
        if (row == NULL)
            Py_CLEAR(t);
        else
            PyTuple_SET_ITEM(t, (Py_ssize_t)i, row);
    }
    return t;
}

/* ((value, name), ...) for the values 0 .. count - 1 of a C enum with a name function. */
static PyObject *name_table(unsigned count, const char *(*name)(unsigned))
{
    PyObject *t = PyTuple_New(count);
    for (unsigned i = 0; t && i < count; i++) {
        PyObject *row = Py_BuildValue("(Is)", i, name(i));
        if (row == NULL)
            Py_CLEAR(t);
        else
            PyTuple_SET_ITEM(t, i, row);
    }
    return t;
}

static const char *dtype_name(unsigned v)
{
    return ccq_dtype_name((ccq_dtype)v);
}
static const char *op_name(unsigned v)
{
    return ccq_reduce_op_name((ccq_reduce_op)v);
}
static const char *kind_name(unsigned v)
{
    return ccq_kind_name(v);
}
static const char *event_name(unsigned v)
{
    return ccq_event_type_name(v);
}

static PyObject *library_version(PyObject *mod, PyObject *unused)
{
    (void)mod, (void)unused;
    return PyUnicode_FromString(ccq_version());
}

/* The file libccq was loaded from (so `python -m ccq --version` can say which one). */
static PyObject *library_path(PyObject *mod, PyObject *unused)
{
    Dl_info info;
    (void)mod, (void)unused;
    if (dladdr((void *)ccq_version, &info) == 0 || info.dli_fname == NULL)
        Py_RETURN_NONE;
    return PyUnicode_DecodeFSDefault(info.dli_fname);
}

static PyObject *status_name(PyObject *mod, PyObject *arg)
{
    (void)mod;
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred())
        return NULL;
    return PyUnicode_FromString(ccq_status_name((ccq_status)v));
}

/* _describe(obj, cuda=False, writable=False) -> (address, nbytes, dtype or None, what): how
 * the binding reads a buffer, for tests and for users who wonder why one is refused. */
static PyObject *describe(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *names[] = {"obj", "cuda", "writable", NULL};
    PyObject *obj;
    int cuda = 0, writable = 0;
    ccqpy_buf b;
    (void)mod;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|pp:_describe", names, &obj, &cuda, &writable))
        return NULL;
    if (ccqpy_buf_get(obj, cuda ? CCQPY_MEM_CUDA : CCQPY_MEM_HOST, writable, "buffer", &b) != 0)
        return NULL;
    PyObject *dt = b.dtype >= 0 ? PyLong_FromLong(b.dtype) : Py_NewRef(Py_None);
    PyObject *r = dt ? Py_BuildValue("(KnNs)", (unsigned long long)(uintptr_t)b.ptr,
                                     (Py_ssize_t)b.nbytes, dt, b.what)
                     : NULL;
    ccqpy_buf_release(&b);
    return r;
}

static PyMethodDef module_methods[] = {
    {"_set_errors", set_errors, METH_VARARGS, "Register ccq.Error and its subclasses."},
    {"library_version", library_version, METH_NOARGS,
     "The version of the libccq that is loaded (ccq_version())."},
    {"library_path", library_path, METH_NOARGS, "The file libccq was loaded from."},
    {"status_name", status_name, METH_O, "ccq_status_name()."},
    {"config_defaults", ccqpy_config_defaults, METH_NOARGS,
     "{field: value} of ccq_config_init(): the defaults with the CCQ_* variables applied."},
    {"config_fields", ccqpy_config_fields, METH_NOARGS,
     "The ccq_config fields Runtime takes as keywords."},
    {"_describe", (PyCFunction)(void (*)(void))describe, METH_VARARGS | METH_KEYWORDS,
     "How the binding reads a buffer: (address, nbytes, dtype or None, description)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "ccq._ccq",
    "The C extension of ccq's Python package: use the package `ccq`.",
    -1,
    module_methods,
};

static int add(PyObject *m, const char *name, PyObject *v)
{
    if (v == NULL)
        return -1;
    int r = PyModule_AddObject(m, name, v);
    if (r != 0)
        Py_DECREF(v);
    return r;
}

PyMODINIT_FUNC PyInit__ccq(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    /* A library of another major version has another ABI: refuse it at import. */
    if ((ccq_version_number() >> 16) != CCQ_VERSION_MAJOR ||
        ccq_version_number() < (unsigned)CCQ_VERSION_HEX) {
        PyErr_Format(PyExc_ImportError,
                     "ccq: the extension was built against ccq %s but loaded libccq %s, which is "
                     "older or of another major version",
                     CCQ_VERSION_STRING, ccq_version());
        goto fail;
    }
    if (ccqpy_runtime_type_init() < 0 || ccqpy_fence_init() < 0)
        goto fail;
    if (add(m, "Runtime", Py_NewRef((PyObject *)&ccqpy_runtime_type)) ||
        add(m, "Fence", Py_NewRef((PyObject *)&ccqpy_fence_type)) ||
        add(m, "HEADER_VERSION", PyUnicode_FromString(CCQ_VERSION_STRING)) ||
        add(m, "STATUSES", status_table()) ||
        add(m, "DTYPES", name_table(CCQ_DTYPE_COUNT_, dtype_name)) ||
        add(m, "REDUCE_OPS", name_table(CCQ_REDUCE_OP_COUNT_, op_name)) ||
        add(m, "KINDS", name_table(CCQ_KIND_COUNT_, kind_name)) ||
        add(m, "EVENT_TYPES", name_table(CCQ_EV_TYPE_COUNT_, event_name)) ||
        PyModule_AddIntConstant(m, "FLAG_NONBLOCKING_SUBMIT", CCQ_FLAG_NONBLOCKING_SUBMIT) ||
        ccqpy_records_init(m) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
