/* Runtime._c_loop: the C baseline of bindings/python/bench/bench_overhead.py, the same loops as
 * the Python ones it is compared with, through ccq's C API, in this process, on the same
 * runtime and buffers. Not part of the API (an underscore name). */
#include "ccqpy.h"

#include <time.h>

/* What _c_loop runs: ops times [an all_reduce (unless !submit)], a fence after every `every`
 * of them (0: one at the end; -1: none), ccq_sync_collective or (values) a fence value. */
typedef struct c_loop {
    unsigned device, stream;
    ccqpy_buf src, dst;
    Py_ssize_t ops, every;
    ccq_device_id ids[64];
    size_t n;
    int values, submit;
} c_loop;

static ccq_status c_loop_fence(ccq_runtime *rt, const c_loop *l)
{
    ccq_fence f;
    if (!l->values)
        return ccq_sync_collective(rt, l->device, l->stream);
    ccq_status st = ccq_fence_begin(rt, l->device, l->stream, &f);
    return st != CCQ_OK ? st : ccq_fence_wait(rt, l->device, l->stream, f, 0);
}

/* Runs with the GIL released; returns the nanoseconds it took. */
static uint64_t c_loop_run(ccq_runtime *rt, const c_loop *l, ccq_status *out)
{
    size_t count = l->src.nbytes / ccq_dtype_size((ccq_dtype)l->src.dtype);
    ccq_status st = CCQ_OK;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (Py_ssize_t i = 0; i < l->ops && st == CCQ_OK; i++) {
        if (l->submit)
            st = ccq_all_reduce(rt, l->device, l->stream, l->src.ptr, l->dst.ptr, count,
                                (ccq_dtype)l->src.dtype, CCQ_SUM, l->ids, l->n);
        if (st == CCQ_OK && l->every > 0 && (i + 1) % l->every == 0)
            st = c_loop_fence(rt, l);
    }
    if (st == CCQ_OK && l->every == 0)
        st = c_loop_fence(rt, l);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *out = st;
    return (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000000ull + (uint64_t)t1.tv_nsec -
           (uint64_t)t0.tv_nsec;
}

/* _c_loop(device, src, dst, ops, devices, fence_every, stream=0, fence_values=False,
 * submit=True) -> ns: the loop above through ccq's C API, on this runtime and these buffers:
 * the same work as the Python loop bench_overhead.py compares it with, minus Python. */
PyObject *ccqpy_c_loop(ccqpy_runtime *self, PyObject *args)
{
    c_loop l = {.stream = 0, .values = 0, .submit = 1};
    PyObject *src_o, *dst_o, *devs_o;
    if (!PyArg_ParseTuple(args, "IOOnOn|Ipp:_c_loop", &l.device, &src_o, &dst_o, &l.ops, &devs_o,
                          &l.every, &l.stream, &l.values, &l.submit))
        return NULL;
    if (ccqpy_buf_get(src_o, CCQPY_MEM_HOST, 0, "src", &l.src) != 0)
        return NULL;
    if (ccqpy_buf_get(dst_o, CCQPY_MEM_HOST, 1, "dst", &l.dst) != 0) {
        ccqpy_buf_release(&l.src);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(devs_o, "devices");
    Py_ssize_t n = seq ? PySequence_Fast_GET_SIZE(seq) : 0;
    if (n > 64)
        ccqpy_raisef(CCQ_ERR_INVALID_ARGUMENT, "_c_loop: at most 64 devices");
    for (Py_ssize_t i = 0; seq && i < n && i < 64; i++)
        l.ids[i] = (ccq_device_id)PyLong_AsUnsignedLong(PySequence_Fast_GET_ITEM(seq, i));
    l.n = (size_t)n;
    Py_XDECREF(seq);
    ccq_status st = CCQ_OK;
    uint64_t ns = 0;
    if (!PyErr_Occurred() && l.src.dtype >= 0 && ccqpy_enter(self, 1) == 0) {
        CCQPY_NOGIL(ns = c_loop_run(self->rt, &l, &st));
        ccqpy_leave(self);
    }
    ccqpy_buf_release(&l.src);
    ccqpy_buf_release(&l.dst);
    if (PyErr_Occurred())
        return NULL;
    if (st != CCQ_OK)
        return ccqpy_raise(st, NULL);
    return PyLong_FromUnsignedLongLong(ns);
}
