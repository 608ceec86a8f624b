/* Fences: rt.sync(device, stream=0), the blocking fence of the seed (ccq_sync_collective),
 * and rt.fence(device, stream=0) -> ccq.Fence, a captured fence value with test() (never
 * blocks) and wait(timeout=None) (seconds; False when the wait ended first).
 *
 * An answer that says the covered commands ended releases the buffers held for them
 * (holds.c): OK or the commands' error. Not released: CCQ_IN_PROGRESS, an invalid argument,
 * and sync's CCQ_ERR_TIMEOUT, which may mean "still pending" (ccq.h: buffers are free only
 * once the commands ended; a later fence or close() releases them). */
#include "ccqpy.h"

#include <structmember.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef struct ccqpy_fence_obj {
    PyObject_HEAD ccqpy_runtime *rt;
    uint32_t device, stream;
    ccq_fence value;
    uint64_t upto;     /* holds of the stream appended before the value was taken */
    int answered;      /* test/wait said the commands ended */
    ccq_status status; /* ... with this */
    PyObject *detail;  /* ... and this detail (str) */
} ccqpy_fence_obj;

static PyObject *kw_stream;

/* (device, stream=0), positional or stream by name. */
static int parse_device_stream(const char *fn, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames, uint32_t *device, uint32_t *stream)
{
    PyObject *names[2] = {kw_stream, NULL}, *kw[1];
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "%s(device, stream=0) takes 1 or 2 arguments", fn);
        return -1;
    }
    if (ccqpy_kwargs(fn, args + nargs, kwnames, names, kw) != 0)
        return -1;
    if (nargs == 2 && kw[0]) {
        PyErr_Format(PyExc_TypeError, "%s() got stream twice", fn);
        return -1;
    }
    PyObject *s = nargs == 2 ? args[1] : kw[0];
    *stream = 0;
    if (ccqpy_u32(args[0], "device", device) != 0 || (s && ccqpy_u32(s, "stream", stream) != 0))
        return -1;
    return 0;
}

/* The detail of the error the last call on this thread returned, whole: ccq_last_error_detail
 * keeps 511 characters; the stream's record keeps all of a long desync report. */
static PyObject *detail_of(ccqpy_runtime *self, uint32_t device, uint32_t stream)
{
    const char *d = ccq_last_error_detail();
    size_t len = strlen(d);
    static const char cut[] = "... [truncated]";
    if (len < sizeof cut - 1 || strcmp(d + len - (sizeof cut - 1), cut) != 0)
        return PyUnicode_DecodeUTF8(d, (Py_ssize_t)len, "replace");
    PyObject *first = PyUnicode_DecodeUTF8(d, (Py_ssize_t)len, "replace");
    for (size_t room = 4096; room <= (1u << 22); room *= 4) {
        char *buf = PyMem_Malloc(room);
        if (buf == NULL)
            break;
        ccq_stream_last_error(self->rt, device, stream, buf, room);
        size_t n = strlen(buf);
        if (n + 1 < room || room == (1u << 22)) {
            PyObject *whole = n > len ? PyUnicode_DecodeUTF8(buf, (Py_ssize_t)n, "replace") : NULL;
            PyMem_Free(buf);
            if (whole) {
                Py_XDECREF(first);
                return whole;
            }
            break;
        }
        PyMem_Free(buf);
    }
    return first;
}

static PyObject *raise_with(ccq_status st, PyObject *detail)
{
    if (detail == NULL && PyErr_Occurred())
        return NULL; /* no memory for the detail: that error instead */
    const char *d = detail ? PyUnicode_AsUTF8(detail) : NULL;
    return ccqpy_raise(st, d ? d : "");
}

PyObject *ccqpy_sync(ccqpy_runtime *self, PyObject *const *args, Py_ssize_t nargs,
                     PyObject *kwnames)
{
    uint32_t device, stream;
    ccq_status st;
    if (parse_device_stream("sync", args, nargs, kwnames, &device, &stream) != 0 ||
        ccqpy_enter(self, 0) != 0)
        return NULL;
    ccqpy_holds *h = ccqpy_holds_of(self, device, stream);
    uint64_t upto = h ? h->appended : 0; /* read before the fence is taken */
    ccq_runtime *rt = self->rt;
    CCQPY_NOGIL(st = ccq_sync_collective(rt, device, stream));
    PyObject *detail = st != CCQ_OK ? detail_of(self, device, stream) : NULL;
    if (h && st != CCQ_ERR_TIMEOUT && st != CCQ_ERR_INVALID_ARGUMENT)
        ccqpy_holds_release(h, upto);
    ccqpy_leave(self);
    if (st == CCQ_OK)
        Py_RETURN_NONE;
    raise_with(st, detail);
    Py_XDECREF(detail);
    return NULL;
}

PyObject *ccqpy_fence(ccqpy_runtime *self, PyObject *const *args, Py_ssize_t nargs,
                      PyObject *kwnames)
{
    uint32_t device, stream;
    ccq_fence value;
    if (parse_device_stream("fence", args, nargs, kwnames, &device, &stream) != 0 ||
        ccqpy_enter(self, 0) != 0)
        return NULL;
    ccqpy_holds *h = ccqpy_holds_of(self, device, stream);
    uint64_t upto = h ? h->appended : 0; /* read before the value is taken */
    /* Two atomic loads: no reason to release the GIL. */
    ccq_status st = ccq_fence_begin(self->rt, device, stream, &value);
    ccqpy_leave(self);
    if (st != CCQ_OK)
        return ccqpy_raise(st, NULL);
    ccqpy_fence_obj *f = PyObject_New(ccqpy_fence_obj, &ccqpy_fence_type);
    if (f == NULL)
        return NULL;
    f->rt = (ccqpy_runtime *)Py_NewRef((PyObject *)self);
    f->device = device;
    f->stream = stream;
    f->value = value;
    f->upto = upto;
    f->answered = 0;
    f->status = CCQ_IN_PROGRESS;
    f->detail = NULL;
    return (PyObject *)f;
}

/* ---- ccq.Fence ---------------------------------------------------------------------------- */

/* The final answer: True, or the error raised (again, each time it is asked). */
static PyObject *answer(ccqpy_fence_obj *f)
{
    if (f->status == CCQ_OK)
        Py_RETURN_TRUE;
    return raise_with(f->status, f->detail);
}

/* Record an answer of ccq_fence_test/_wait (the caller is inside ccq: rt is alive). Returns 1
 * when it is final. */
static int settle(ccqpy_fence_obj *f, ccq_status st)
{
    if (st == CCQ_IN_PROGRESS)
        return 0;
    f->status = st;
    f->detail = st != CCQ_OK ? detail_of(f->rt, f->device, f->stream) : NULL;
    if (st == CCQ_ERR_INVALID_ARGUMENT)
        return 1; /* about the value itself (too old): says nothing of the commands */
    f->answered = 1;
    ccqpy_holds *h = ccqpy_holds_of(f->rt, f->device, f->stream);
    if (h)
        ccqpy_holds_release(h, f->upto);
    return 1;
}

static PyObject *fence_test(ccqpy_fence_obj *f, PyObject *unused)
{
    (void)unused;
    if (f->answered)
        return answer(f);
    if (ccqpy_enter(f->rt, 0) != 0)
        return NULL;
    /* Two atomic loads while nothing failed: cheaper than releasing the GIL. */
    ccq_status st = ccq_fence_test(f->rt->rt, f->device, f->stream, f->value);
    int final = settle(f, st);
    ccqpy_leave(f->rt);
    if (!final)
        Py_RETURN_FALSE;
    return answer(f);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Waits in slices so that Ctrl-C (a signal handled by the main thread) is seen within one. */
enum { SLICE_MS = 100 };

static PyObject *fence_wait(ccqpy_fence_obj *f, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames)
{
    static PyObject *kw_timeout;
    PyObject *names[2], *kw[1];
    if (kw_timeout == NULL && (kw_timeout = PyUnicode_InternFromString("timeout")) == NULL)
        return NULL;
    names[0] = kw_timeout, names[1] = NULL;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "wait(timeout=None) takes at most 1 argument");
        return NULL;
    }
    if (ccqpy_kwargs("wait", args + nargs, kwnames, names, kw) != 0)
        return NULL;
    PyObject *t = nargs == 1 ? args[0] : kw[0];
    double timeout = -1; /* none: until the commands end (the runtime's watchdog ends them) */
    if (t && t != Py_None) {
        timeout = PyFloat_AsDouble(t);
        if (timeout == -1 && PyErr_Occurred())
            return NULL;
        if (timeout < 0 || timeout != timeout)
            return ccqpy_raise(CCQ_ERR_INVALID_ARGUMENT, "wait: timeout must be >= 0 seconds");
    }
    if (f->answered)
        return answer(f);
    uint64_t deadline = timeout >= 0 ? now_ns() + (uint64_t)(timeout * 1e9) : UINT64_MAX;
    for (;;) {
        uint64_t slice = SLICE_MS;
        uint64_t now = now_ns();
        int last = 0;
        if (deadline != UINT64_MAX) {
            uint64_t left = deadline > now ? deadline - now : 0;
            /* ccq_fence_wait takes whole milliseconds (0 = the runtime's timeout): round up. */
            uint64_t left_ms = (left + 999999) / 1000000;
            if (left_ms <= slice) {
                slice = left_ms;
                last = 1;
            }
        }
        if (ccqpy_enter(f->rt, 0) != 0)
            return NULL;
        ccq_runtime *rt = f->rt->rt;
        ccq_status st;
        if (slice == 0) {
            st = ccq_fence_test(rt, f->device, f->stream, f->value);
        } else {
            CCQPY_NOGIL(st = ccq_fence_wait(rt, f->device, f->stream, f->value, slice));
        }
        int final = settle(f, st);
        ccqpy_leave(f->rt);
        if (final)
            return answer(f);
        if (last)
            Py_RETURN_FALSE;
        if (PyErr_CheckSignals() != 0)
            return NULL;
    }
}

static void fence_dealloc(ccqpy_fence_obj *f)
{
    Py_XDECREF(f->detail);
    Py_DECREF(f->rt);
    PyObject_Free(f);
}

static PyObject *fence_repr(ccqpy_fence_obj *f)
{
    char buf[160];
    snprintf(buf, sizeof buf, "<ccq.Fence device %u stream %u value 0x%llx %s>", f->device,
             f->stream, (unsigned long long)f->value,
             !f->answered          ? "pending"
             : f->status == CCQ_OK ? "done"
                                   : ccq_status_name(f->status));
    return PyUnicode_FromString(buf);
}

static PyObject *get_done(ccqpy_fence_obj *f, void *c)
{
    (void)c;
    return PyBool_FromLong(f->answered);
}

static PyMethodDef fence_methods[] = {
    {"test", (PyCFunction)fence_test, METH_NOARGS,
     "test() -> bool: True when every covered command completed, False while some has not "
     "ended; raises ccq.Error when one failed. Never blocks."},
    {"wait", (PyCFunction)(void (*)(void))fence_wait, METH_FASTCALL | METH_KEYWORDS,
     "wait(timeout=None) -> bool: wait (GIL released) at most timeout seconds (None: until "
     "the commands end, which the runtime's timeout_ms bounds); True when they completed, "
     "False when the wait ended first; raises ccq.Error when one failed."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef fence_members[] = {
    {"device", T_UINT, offsetof(ccqpy_fence_obj, device), READONLY, "the device"},
    {"stream", T_UINT, offsetof(ccqpy_fence_obj, stream), READONLY, "the stream"},
    {"value", T_ULONGLONG, offsetof(ccqpy_fence_obj, value), READONLY, "the ccq_fence value"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef fence_getset[] = {
    {"done", (getter)get_done, NULL, "an answer other than 'in progress' was given", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject ccqpy_fence_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ccq.Fence",
    .tp_basicsize = sizeof(ccqpy_fence_obj),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "What rt.fence(device, stream) captured: every command submitted on the stream "
              "before it. Any thread may test or wait on it.",
    .tp_dealloc = (destructor)fence_dealloc,
    .tp_repr = (reprfunc)fence_repr,
    .tp_methods = fence_methods,
    .tp_members = fence_members,
    .tp_getset = fence_getset,
};

int ccqpy_fence_init(void)
{
    if (kw_stream == NULL && (kw_stream = PyUnicode_InternFromString("stream")) == NULL)
        return -1;
    return PyType_Ready(&ccqpy_fence_type);
}
