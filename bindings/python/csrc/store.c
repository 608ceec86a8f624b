/* Runtime(store=obj): a ccq_store over a Python object with set(key, value) and
 * get(key) -> bytes | None (None while the key is not there; never waits).
 *
 * ccq calls the store from the thread in ccq_runtime_create (which runs with the GIL
 * released) and from its scheduler thread; each call takes the GIL. Every Runtime call that
 * can wait for the scheduler releases the GIL, so the two never wait for each other. A store
 * call while the interpreter is finalizing would block for ever in PyGILState_Ensure, so it
 * fails instead (ccq/__init__.py closes every runtime at exit, before finalization). */
#include "ccqpy.h"

#include <string.h>

struct ccqpy_store {
    ccq_store c;
    PyObject *obj;
};

static int finalizing(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

/* The Python exception of a store method goes to sys.unraisablehook (printed by default):
 * ccq's own detail then names the key and the status. */
static ccq_status failed(ccqpy_store *s, const char *what)
{
    PyObject *msg = PyUnicode_FromFormat("ccq store %s() of %R", what, s->obj);
    if (msg) {
        PyErr_WriteUnraisable(msg);
        Py_DECREF(msg);
    } else {
        PyErr_Clear();
    }
    return CCQ_ERR_BACKEND;
}

static ccq_status store_set(void *ctx, const char *key, const void *value, size_t len)
{
    ccqpy_store *s = ctx;
    if (finalizing())
        return CCQ_ERR_SHUTDOWN;
    PyGILState_STATE g = PyGILState_Ensure();
    ccq_status st = CCQ_OK;
    PyObject *r =
        PyObject_CallMethod(s->obj, "set", "sy#", key, (const char *)value, (Py_ssize_t)len);
    if (r == NULL)
        st = failed(s, "set");
    Py_XDECREF(r);
    PyGILState_Release(g);
    return st;
}

static ccq_status store_get(void *ctx, const char *key, void *value, size_t *len)
{
    ccqpy_store *s = ctx;
    if (finalizing())
        return CCQ_ERR_SHUTDOWN;
    PyGILState_STATE g = PyGILState_Ensure();
    ccq_status st = CCQ_IN_PROGRESS;
    PyObject *r = PyObject_CallMethod(s->obj, "get", "s", key);
    if (r == NULL) {
        st = failed(s, "get");
    } else if (r != Py_None) {
        Py_buffer v;
        if (PyObject_GetBuffer(r, &v, PyBUF_SIMPLE) != 0) {
            st = failed(s, "get");
        } else {
            size_t n = (size_t)v.len;
            memcpy(value, v.buf, n < *len ? n : *len);
            *len = n;
            st = CCQ_OK;
            PyBuffer_Release(&v);
        }
    }
    Py_XDECREF(r);
    PyGILState_Release(g);
    return st;
}

ccqpy_store *ccqpy_store_new(PyObject *obj)
{
    PyObject *set = PyObject_GetAttrString(obj, "set");
    PyObject *get = set ? PyObject_GetAttrString(obj, "get") : NULL;
    int ok = set && get && PyCallable_Check(set) && PyCallable_Check(get);
    Py_XDECREF(set);
    Py_XDECREF(get);
    if (!ok) {
        PyErr_Clear();
        ccqpy_raisef(CCQ_ERR_INVALID_ARGUMENT,
                     "store: a %s has no set(key, value) and get(key) methods",
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    ccqpy_store *s = PyMem_Calloc(1, sizeof *s);
    if (s == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    s->c.ctx = s;
    s->c.set = store_set;
    s->c.get = store_get;
    s->obj = Py_NewRef(obj);
    return s;
}

const ccq_store *ccqpy_store_c(ccqpy_store *s)
{
    return &s->c;
}

void ccqpy_store_free(ccqpy_store *s)
{
    if (s == NULL)
        return;
    Py_DECREF(s->obj);
    PyMem_Free(s);
}
