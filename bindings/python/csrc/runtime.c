/* ccq._ccq.Runtime: a ccq_runtime's life (create from keywords, shutdown, close), the world
 * queries, communicators, stats, metrics, the event log and the CUDA-stream calls. The
 * collectives are in submit.c, the fences in fence.c.
 *
 * Closing while other threads still call: every call on the runtime counts itself in
 * `active` while it is inside ccq (the count changes with the GIL held). close() refuses new
 * submissions, calls ccq_runtime_shutdown (thread-safe: waiting submitters and fences return),
 * waits until no call is inside ccq, then destroys the runtime and releases the buffers it
 * held: ccq_runtime_destroy never races with another call, as ccq.h requires. */
#include "ccqpy.h"

#include <string.h>
#include <time.h>

#include <ccq/ccq_nccl.h>

int ccqpy_enter(ccqpy_runtime *self, int submitting)
{
    if (self->rt == NULL || (submitting && self->closing)) {
        ccqpy_raise(CCQ_ERR_SHUTDOWN, self->rt == NULL && !self->closing
                                          ? "the runtime was not created (Runtime.__init__ failed)"
                                          : "the runtime is closed");
        return -1;
    }
    self->active++;
    return 0;
}

ccqpy_holds *ccqpy_holds_of(ccqpy_runtime *self, ccq_device_id device, ccq_stream_id stream)
{
    if (device < self->first || device - self->first >= self->nlocal || stream >= self->max_streams)
        return NULL;
    return &self->holds[(size_t)(device - self->first) * self->max_streams + stream];
}

static PyObject *rt_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)args, (void)kw;
    ccqpy_runtime *self = (ccqpy_runtime *)type->tp_alloc(type, 0);
    return (PyObject *)self;
}

static int rt_init(ccqpy_runtime *self, PyObject *args, PyObject *kw)
{
    ccq_config cfg;
    ccq_runtime *rt = NULL;
    ccqpy_store *store = NULL;
    ccq_status st;
    if (PyTuple_GET_SIZE(args) != 0) {
        PyErr_SetString(PyExc_TypeError, "Runtime() takes ccq_config fields as keywords only, e.g. "
                                         "Runtime(backend=\"host\", host_devices=4)");
        return -1;
    }
    if (self->rt != NULL || self->closing) {
        PyErr_SetString(PyExc_RuntimeError, "Runtime.__init__ called twice");
        return -1;
    }
    PyObject *keep = PyList_New(0);
    if (keep == NULL)
        return -1;
    if (ccqpy_config_from_kwargs(kw, &cfg, keep, &store) != 0)
        goto fail;
    /* Creating a world can wait for the other processes (up to timeout_ms), and a Python
     * store is called from here: the GIL must be free. */
    CCQPY_NOGIL(st = ccq_runtime_create(&cfg, &rt));
    if (st != CCQ_OK) {
        ccqpy_raise(st, NULL);
        goto fail;
    }
    if (ccq_local_devices(rt, &self->first, &self->nlocal) != CCQ_OK) {
        ccqpy_raise(CCQ_ERR_BACKEND, NULL);
        goto fail_rt;
    }
    self->ndev = ccq_device_count(rt);
    self->max_streams = cfg.max_streams;
    self->cuda = strcmp(ccq_backend_name(rt), "host") != 0;
    self->holds = PyMem_Calloc((size_t)self->nlocal * self->max_streams, sizeof *self->holds);
    self->all = PyMem_Malloc((size_t)self->ndev * sizeof *self->all);
    if (self->holds == NULL || self->all == NULL) {
        PyErr_NoMemory();
        goto fail_rt;
    }
    for (uint32_t i = 0; i < self->ndev; i++)
        self->all[i] = i;
    self->rt = rt;
    self->keep = keep;
    self->store = store;
    return 0;
fail_rt:
    CCQPY_NOGIL(ccq_runtime_destroy(rt));
    PyMem_Free(self->holds);
    PyMem_Free(self->all);
    self->holds = NULL;
    self->all = NULL;
fail:
    ccqpy_store_free(store);
    Py_DECREF(keep);
    return -1;
}

/* Destroy the runtime (no other call inside ccq), then release every held buffer. */
static void destroy(ccqpy_runtime *self)
{
    ccq_runtime *rt = self->rt;
    if (rt == NULL)
        return;
    self->rt = NULL;
    CCQPY_NOGIL(ccq_runtime_destroy(rt));
    for (size_t i = 0; self->holds && i < (size_t)self->nlocal * self->max_streams; i++)
        ccqpy_holds_clear(&self->holds[i]);
    PyMem_Free(self->holds);
    PyMem_Free(self->all);
    self->holds = NULL;
    self->all = NULL;
    ccqpy_store_free(self->store);
    self->store = NULL;
    Py_CLEAR(self->keep);
}

/* A millisecond with the GIL released, for close() waiting on other threads. */
static void nap(void)
{
    struct timespec ts = {0, 1000000};
    CCQPY_NOGIL(nanosleep(&ts, NULL));
}

static PyObject *rt_close(ccqpy_runtime *self, PyObject *unused)
{
    (void)unused;
    if (self->rt == NULL || self->closing) {
        /* Already closed, or another thread is closing it: wait for that to finish. */
        while (self->rt != NULL)
            nap();
        Py_RETURN_NONE;
    }
    self->closing = 1;
    ccq_runtime *rt = self->rt;
    CCQPY_NOGIL(ccq_runtime_shutdown(rt));
    /* Calls still inside ccq end soon: shutdown made waiting submitters return, and fences
     * answer once the remaining commands finish or are cancelled (bounded by timeout_ms). */
    while (self->active > 0)
        nap();
    destroy(self);
    Py_RETURN_NONE;
}

static PyObject *rt_shutdown(ccqpy_runtime *self, PyObject *unused)
{
    (void)unused;
    if (ccqpy_enter(self, 0) != 0)
        return NULL;
    CCQPY_NOGIL(ccq_runtime_shutdown(self->rt));
    ccqpy_leave(self);
    Py_RETURN_NONE;
}

static void rt_dealloc(ccqpy_runtime *self)
{
    if (self->weakrefs)
        PyObject_ClearWeakRefs((PyObject *)self);
    /* Nobody else can call it now (every call holds a reference): destroy directly. */
    destroy(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ---- world ------------------------------------------------------------------------------- */

static int check_open(ccqpy_runtime *self)
{
    if (self->rt != NULL)
        return 0;
    ccqpy_raise(CCQ_ERR_SHUTDOWN, "the runtime is closed");
    return -1;
}

static PyObject *get_world_rank(ccqpy_runtime *self, void *c)
{
    (void)c;
    return check_open(self) ? NULL : PyLong_FromUnsignedLong(ccq_world_rank(self->rt));
}

static PyObject *get_world_size(ccqpy_runtime *self, void *c)
{
    (void)c;
    return check_open(self) ? NULL : PyLong_FromUnsignedLong(ccq_world_size(self->rt));
}

static PyObject *get_device_count(ccqpy_runtime *self, void *c)
{
    (void)c;
    return check_open(self) ? NULL : PyLong_FromUnsignedLong(self->ndev);
}

static PyObject *get_local_devices(ccqpy_runtime *self, void *c)
{
    (void)c;
    if (check_open(self))
        return NULL;
    return PyObject_CallFunction((PyObject *)&PyRange_Type, "kk", (unsigned long)self->first,
                                 (unsigned long)(self->first + self->nlocal));
}

static PyObject *get_backend(ccqpy_runtime *self, void *c)
{
    (void)c;
    return check_open(self) ? NULL : PyUnicode_FromString(ccq_backend_name(self->rt));
}

static PyObject *get_max_streams(ccqpy_runtime *self, void *c)
{
    (void)c;
    return check_open(self) ? NULL : PyLong_FromUnsignedLong(self->max_streams);
}

static PyObject *get_closed(ccqpy_runtime *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->rt == NULL);
}

/* ---- a list of device ids ----------------------------------------------------------------- */

int ccqpy_u32(PyObject *v, const char *what, uint32_t *out)
{
    unsigned long long u;
    if (!PyLong_Check(v)) {
        if (!PyIndex_Check(v)) {
            ccqpy_raisef(CCQ_ERR_INVALID_ARGUMENT, "%s: an integer is required, got %s", what,
                         Py_TYPE(v)->tp_name);
            return -1;
        }
        PyObject *i = PyNumber_Index(v);
        if (i == NULL)
            return -1;
        u = PyLong_AsUnsignedLongLong(i);
        Py_DECREF(i);
    } else {
        u = PyLong_AsUnsignedLongLong(v);
    }
    if ((u == (unsigned long long)-1 && PyErr_Occurred()) || u > UINT32_MAX) {
        PyErr_Clear();
        ccqpy_raisef(CCQ_ERR_INVALID_ARGUMENT, "%s: out of range (0 .. 2^32-1)", what);
        return -1;
    }
    *out = (uint32_t)u;
    return 0;
}

static PyObject *rt_comm_init(ccqpy_runtime *self, PyObject *devices)
{
    PyObject *seq = PySequence_Fast(devices, "comm_init: devices must be a sequence of ints");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    ccq_device_id *ids = PyMem_Malloc((size_t)(n ? n : 1) * sizeof *ids);
    if (ids == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (ccqpy_u32(PySequence_Fast_GET_ITEM(seq, i), "comm_init: device", &ids[i]) != 0) {
            PyMem_Free(ids);
            Py_DECREF(seq);
            return NULL;
        }
    Py_DECREF(seq);
    if (ccqpy_enter(self, 1) != 0) {
        PyMem_Free(ids);
        return NULL;
    }
    ccq_status st;
    /* Forming a communicator across processes waits for them (up to timeout_ms). */
    CCQPY_NOGIL(st = ccq_comm_init(self->rt, ids, (size_t)n));
    ccqpy_leave(self);
    PyMem_Free(ids);
    if (st != CCQ_OK)
        return ccqpy_raise(st, NULL);
    Py_RETURN_NONE;
}

/* ---- stats, metrics, events ---------------------------------------------------------------- */

static PyObject *rt_stats(ccqpy_runtime *self, PyObject *unused)
{
    ccq_stats s = {.struct_size = sizeof s};
    (void)unused;
    if (check_open(self))
        return NULL;
    ccq_status st = ccq_get_stats(self->rt, &s);
    return st == CCQ_OK ? ccqpy_stats_record(&s) : ccqpy_raise(st, NULL);
}

/* Job health: what this process knows of world rank p (an int: ccq.ProcessState). */
static PyObject *rt_process_state(ccqpy_runtime *self, PyObject *arg)
{
    uint32_t p;
    ccq_process_state state;
    if (ccqpy_u32(arg, "process", &p) || check_open(self))
        return NULL;
    ccq_status st = ccq_world_process_state(self->rt, p, &state);
    return st == CCQ_OK ? PyLong_FromLong((long)state) : ccqpy_raise(st, NULL);
}

/* Job health: every process's progress on the communicators spanning processes (a list of
 * ccq.Progress). Waits at most a scheduler pass for this process's own: without the GIL. */
static PyObject *rt_progress(ccqpy_runtime *self, PyObject *unused)
{
    size_t n = 0, cap = 0;
    ccq_progress *out = NULL;
    ccq_status st;
    (void)unused;
    if (ccqpy_enter(self, 0))
        return NULL;
    for (;;) {
        CCQPY_NOGIL(st = ccq_world_progress(self->rt, out, cap, &n));
        if (st != CCQ_OK || n <= cap)
            break;
        PyMem_Free(out);
        cap = n + 8; /* room for a few more meanwhile */
        out = PyMem_Calloc(cap, sizeof *out);
        if (out == NULL) {
            ccqpy_leave(self);
            return PyErr_NoMemory();
        }
        out[0].struct_size = sizeof *out;
    }
    ccqpy_leave(self);
    if (st != CCQ_OK) {
        PyMem_Free(out);
        return ccqpy_raise(st, NULL);
    }
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list != NULL && i < n; i++) {
        PyObject *r = ccqpy_progress_record(&out[i]);
        if (r == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, r);
    }
    PyMem_Free(out);
    return list;
}

static PyObject *rt_metrics(ccqpy_runtime *self, PyObject *unused)
{
    ccq_metrics m = {.struct_size = sizeof m};
    (void)unused;
    if (check_open(self))
        return NULL;
    ccq_status st = ccq_get_metrics(self->rt, &m);
    return st == CCQ_OK ? ccqpy_metrics_record(&m) : ccqpy_raise(st, NULL);
}

static PyObject *rt_trace_dump(ccqpy_runtime *self, PyObject *path)
{
    PyObject *bytes;
    ccq_status st;
    if (!PyUnicode_FSConverter(path, &bytes))
        return NULL;
    if (ccqpy_enter(self, 0) != 0) {
        Py_DECREF(bytes);
        return NULL;
    }
    /* Writing a large recorder to a file takes time. */
    CCQPY_NOGIL(st = ccq_trace_dump(self->rt, PyBytes_AS_STRING(bytes)));
    ccqpy_leave(self);
    Py_DECREF(bytes);
    if (st != CCQ_OK)
        return ccqpy_raise(st, NULL);
    Py_RETURN_NONE;
}

static PyObject *rt_trace_events(ccqpy_runtime *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"capacity", NULL};
    Py_ssize_t cap = 65536;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|n:trace_events", names, &cap))
        return NULL;
    if (cap < 1)
        return ccqpy_raise(CCQ_ERR_INVALID_ARGUMENT, "trace_events: capacity must be >= 1");
    ccq_event *ev = PyMem_Calloc((size_t)cap, sizeof *ev);
    if (ev == NULL)
        return PyErr_NoMemory();
    ev[0].struct_size = sizeof *ev;
    size_t n = 0;
    uint64_t dropped = 0;
    ccq_status st = CCQ_ERR_SHUTDOWN;
    if (ccqpy_enter(self, 0) == 0) {
        CCQPY_NOGIL(st = ccq_trace_snapshot(self->rt, ev, (size_t)cap, &n, &dropped));
        ccqpy_leave(self);
    } else {
        PyMem_Free(ev);
        return NULL;
    }
    if (st != CCQ_OK) {
        PyMem_Free(ev);
        return ccqpy_raise(st, NULL);
    }
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *r = ccqpy_event_record(&ev[i]);
        if (r == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, r);
    }
    PyMem_Free(ev);
    return list ? Py_BuildValue("(NK)", list, (unsigned long long)dropped) : NULL;
}

/* (device, stream=0) for the per-stream queries. */
static int device_stream(PyObject *args, const char *fn, uint32_t *device, uint32_t *stream)
{
    PyObject *d, *s = NULL;
    if (!PyArg_UnpackTuple(args, fn, 1, 2, &d, &s))
        return -1;
    *stream = 0;
    if (ccqpy_u32(d, "device", device) != 0 || (s && ccqpy_u32(s, "stream", stream) != 0))
        return -1;
    return 0;
}

static PyObject *rt_stream_last_error(ccqpy_runtime *self, PyObject *args)
{
    uint32_t device, stream;
    if (device_stream(args, "stream_last_error", &device, &stream) != 0 || check_open(self))
        return NULL;
    size_t len = 256;
    for (;;) {
        char *buf = PyMem_Malloc(len);
        if (buf == NULL)
            return PyErr_NoMemory();
        ccq_status st = ccq_stream_last_error(self->rt, device, stream, buf, len);
        if (st == CCQ_ERR_INVALID_ARGUMENT) {
            PyMem_Free(buf);
            return ccqpy_raise(st, NULL);
        }
        /* A cut detail ends with "... [truncated]": ask again with more room. */
        if (strlen(buf) + 1 >= len && len < (1u << 22)) {
            PyMem_Free(buf);
            len *= 4;
            continue;
        }
        PyObject *r = Py_BuildValue("(iN)", (int)st,
                                    PyUnicode_DecodeUTF8(buf, (Py_ssize_t)strlen(buf), "replace"));
        PyMem_Free(buf);
        return r;
    }
}

static PyObject *rt_queue_depth(ccqpy_runtime *self, PyObject *args)
{
    uint32_t device, stream;
    uint64_t depth;
    if (device_stream(args, "queue_depth", &device, &stream) != 0 || check_open(self))
        return NULL;
    ccq_status st = ccq_stream_queue_depth(self->rt, device, stream, &depth);
    return st == CCQ_OK ? PyLong_FromUnsignedLongLong(depth) : ccqpy_raise(st, NULL);
}

/* ---- CUDA streams (nccl backend) ----------------------------------------------------------- */

/* A cudaStream_t from an int, or an object with .cuda_stream (PyTorch) or .ptr (CuPy). */
static int cuda_stream_arg(PyObject *v, struct CUstream_st **out)
{
    PyObject *o = NULL;
    if (v == Py_None) {
        *out = NULL;
        return 0;
    }
    if (!PyLong_Check(v)) {
        o = PyObject_GetAttrString(v, "cuda_stream");
        if (o == NULL) {
            PyErr_Clear();
            o = PyObject_GetAttrString(v, "ptr");
        }
        if (o == NULL) {
            PyErr_Clear();
            ccqpy_raisef(CCQ_ERR_INVALID_ARGUMENT,
                         "cuda_stream: an int (cudaStream_t) or an object with .cuda_stream or "
                         ".ptr is required, got %s",
                         Py_TYPE(v)->tp_name);
            return -1;
        }
        v = o;
    }
    unsigned long long p = PyLong_AsUnsignedLongLong(v);
    Py_XDECREF(o);
    if (p == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = (struct CUstream_st *)(uintptr_t)p;
    return 0;
}

static PyObject *nccl_call(ccqpy_runtime *self, PyObject *args, const char *fn,
                           ccq_status (*call)(ccq_runtime *, ccq_device_id, ccq_stream_id,
                                              struct CUstream_st *))
{
    PyObject *d, *s, *cs;
    uint32_t device, stream;
    struct CUstream_st *cuda;
    ccq_status st;
    if (!PyArg_UnpackTuple(args, fn, 3, 3, &d, &s, &cs) || ccqpy_u32(d, "device", &device) ||
        ccqpy_u32(s, "stream", &stream) || cuda_stream_arg(cs, &cuda) || ccqpy_enter(self, 0))
        return NULL;
    CCQPY_NOGIL(st = call(self->rt, device, stream, cuda));
    ccqpy_leave(self);
    if (st != CCQ_OK)
        return ccqpy_raise(st, NULL);
    Py_RETURN_NONE;
}

static PyObject *rt_nccl_bind_stream(ccqpy_runtime *self, PyObject *args)
{
    return nccl_call(self, args, "nccl_bind_stream", ccq_nccl_bind_stream);
}

static PyObject *rt_nccl_stream_wait(ccqpy_runtime *self, PyObject *args)
{
    return nccl_call(self, args, "nccl_stream_wait", ccq_nccl_stream_wait);
}

/* ---- the type ------------------------------------------------------------------------------ */

static PyMethodDef rt_methods[] = {
    {"close", (PyCFunction)rt_close, METH_NOARGS,
     "Shut down, wait for calls of other threads to leave, destroy the runtime and release "
     "every buffer it held. Idempotent."},
    {"shutdown", (PyCFunction)rt_shutdown, METH_NOARGS,
     "ccq_runtime_shutdown: stop accepting commands, finish or cancel the rest."},
    {"comm_init", (PyCFunction)rt_comm_init, METH_O,
     "comm_init(devices): create the communicator of a device set (idempotent)."},
    {"stats", (PyCFunction)rt_stats, METH_NOARGS, "ccq_get_stats as a ccq.Stats."},
    {"metrics", (PyCFunction)rt_metrics, METH_NOARGS, "ccq_get_metrics as a ccq.Metrics."},
    {"process_state", (PyCFunction)rt_process_state, METH_O,
     "process_state(p) -> ccq.ProcessState of world rank p (job health)."},
    {"progress", (PyCFunction)rt_progress, METH_NOARGS,
     "ccq_world_progress as a list of ccq.Progress (job health)."},
    {"trace_dump", (PyCFunction)rt_trace_dump, METH_O,
     "trace_dump(path): write the flight recorder as Chrome/Perfetto JSON."},
    {"trace_events", (PyCFunction)(void (*)(void))rt_trace_events, METH_VARARGS | METH_KEYWORDS,
     "trace_events(capacity=65536) -> (list of ccq.Event, dropped)."},
    {"stream_last_error", (PyCFunction)rt_stream_last_error, METH_VARARGS,
     "stream_last_error(device, stream=0) -> (status, detail) of the last error a fence "
     "returned on the stream."},
    {"queue_depth", (PyCFunction)rt_queue_depth, METH_VARARGS,
     "queue_depth(device, stream=0): commands queued or in flight on the stream."},
    {"nccl_bind_stream", (PyCFunction)rt_nccl_bind_stream, METH_VARARGS,
     "nccl_bind_stream(device, stream, cuda_stream): ccq_nccl_bind_stream."},
    {"nccl_stream_wait", (PyCFunction)rt_nccl_stream_wait, METH_VARARGS,
     "nccl_stream_wait(device, stream, cuda_stream): ccq_nccl_stream_wait."},
    {"sync", (PyCFunction)(void (*)(void))ccqpy_sync, METH_FASTCALL | METH_KEYWORDS,
     "sync(device, stream=0): the blocking fence (ccq_sync_collective); raises ccq.Error."},
    {"fence", (PyCFunction)(void (*)(void))ccqpy_fence, METH_FASTCALL | METH_KEYWORDS,
     "fence(device, stream=0) -> ccq.Fence covering every command submitted on the stream."},
    {"_c_loop", (PyCFunction)ccqpy_c_loop, METH_VARARGS,
     "Benchmark baseline: the same all_reduce loop through the C API (bench_overhead.py)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef rt_getset[] = {
    {"world_rank", (getter)get_world_rank, NULL, "this process's rank in the world", NULL},
    {"world_size", (getter)get_world_size, NULL, "processes in the world", NULL},
    {"device_count", (getter)get_device_count, NULL, "devices of the world (global ids)", NULL},
    {"local_devices", (getter)get_local_devices, NULL, "this process's device ids (a range)", NULL},
    {"backend", (getter)get_backend, NULL, "the backend's name", NULL},
    {"max_streams", (getter)get_max_streams, NULL, "streams per device", NULL},
    {"closed", (getter)get_closed, NULL, "True once close() destroyed the runtime", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef *all_methods(void)
{
    /* rt_methods + the collectives of submit.c, joined once. */
    static PyMethodDef joined[64]; /* zero-filled: the terminator */
    size_t n = 0;
    for (PyMethodDef *m = rt_methods; m->ml_name && n < 63; m++)
        joined[n++] = *m;
    for (PyMethodDef *m = ccqpy_submit_methods; m->ml_name && n < 63; m++)
        joined[n++] = *m;
    return joined;
}

PyTypeObject ccqpy_runtime_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ccq._ccq.Runtime",
    .tp_basicsize = sizeof(ccqpy_runtime),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "A ccq runtime (the C part of ccq.Runtime).",
    .tp_new = rt_new,
    .tp_init = (initproc)rt_init,
    .tp_dealloc = (destructor)rt_dealloc,
    .tp_getset = rt_getset,
    .tp_weaklistoffset = offsetof(ccqpy_runtime, weakrefs),
};

int ccqpy_runtime_type_init(void)
{
    if (ccqpy_submit_init() != 0)
        return -1;
    ccqpy_runtime_type.tp_methods = all_methods();
    return PyType_Ready(&ccqpy_runtime_type);
}
