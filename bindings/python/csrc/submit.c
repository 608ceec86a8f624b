/* The submitting methods of Runtime: the eight collectives and send/recv. Each one reads its
 * buffers (buffers.c), takes the dtype from them and the count from their sizes, calls ccq
 * with the GIL released (a submit waits when the stream is full), and on success hands the
 * buffers to the stream's holds (holds.c) until a fence covering the command answers.
 *
 * Signature (DESIGN.md "Python"): device first, then the buffers, everything else by name:
 *   rt.all_reduce(device, src, dst=None, *, devices=None, op=SUM, stream=0, dtype=None)
 * This file is the hot path measured by bench/bench_overhead.py: vectorcall, no tuple or dict
 * of arguments, interned keyword names compared by pointer. */
#include "ccqpy.h"

#include <string.h>

enum { KW_DEVICES, KW_OP, KW_ROOT, KW_PEER, KW_STREAM, KW_DTYPE, KW_COUNT_ };
static PyObject *kw_names[KW_COUNT_ + 1];

static int names_init(void)
{
    static const char *const s[KW_COUNT_] = {"devices", "op", "root", "peer", "stream", "dtype"};
    for (int i = 0; i < KW_COUNT_; i++)
        if (kw_names[i] == NULL && (kw_names[i] = PyUnicode_InternFromString(s[i])) == NULL)
            return -1;
    return 0;
}

int ccqpy_kwargs(const char *fn, PyObject *const *kwvalues, PyObject *kwnames,
                 PyObject *const *names, PyObject **out)
{
    Py_ssize_t nn = 0;
    while (names[nn])
        out[nn++] = NULL;
    Py_ssize_t n = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        Py_ssize_t j = 0;
        while (j < nn && names[j] != key) /* keywords in a call are interned: pointers match */
            j++;
        if (j == nn)
            for (j = 0; j < nn && PyUnicode_Compare(names[j], key) != 0; j++)
                ;
        if (j == nn) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fn, key);
            return -1;
        }
        out[j] = kwvalues[k];
    }
    return 0;
}

/* ---- what distinguishes the collectives ----------------------------------------------------- */

typedef struct coll {
    const char *name;
    ccq_kind kind;
    uint8_t has_op, has_root;
    uint8_t src_blocks, dst_blocks;       /* 1: count elements; 0: n ranks x count */
    uint8_t src_root_only, dst_root_only; /* the buffer is used on the root only */
    uint8_t in_place_default;             /* dst omitted: in place (dst = src) */
} coll;

static const coll colls[] = {
    {"all_reduce", CCQ_KIND_ALL_REDUCE, 1, 0, 1, 1, 0, 0, 1},
    {"broadcast", CCQ_KIND_BROADCAST, 0, 1, 1, 1, 1, 0, 1},
    {"reduce", CCQ_KIND_REDUCE, 1, 1, 1, 1, 0, 1, 1},
    {"all_gather", CCQ_KIND_ALL_GATHER, 0, 0, 1, 0, 0, 0, 0},
    {"reduce_scatter", CCQ_KIND_REDUCE_SCATTER, 1, 0, 0, 1, 0, 0, 0},
    {"all_to_all", CCQ_KIND_ALL_TO_ALL, 0, 0, 0, 0, 0, 0, 0},
    {"gather", CCQ_KIND_GATHER, 0, 1, 1, 0, 0, 1, 0},
    {"scatter", CCQ_KIND_SCATTER, 0, 1, 0, 1, 1, 0, 0},
};

/* A buffer may stand for a dtype it does not name: the raw bits of a type NumPy lacks. */
static int raw_ok(const ccqpy_buf *b, int dtype)
{
    return (dtype == CCQ_BFLOAT16 || dtype == CCQ_FLOAT8E4M3 || dtype == CCQ_FLOAT8E5M2) &&
           b->raw_bits == (int)ccq_dtype_size((ccq_dtype)dtype) * 8;
}

/* The dtype of the command: the explicit one (each buffer holds it, or its raw bits), else
 * the buffers' own, which must agree. -1 with an error set. */
static int resolve_dtype(const char *fn, int dtype, ccqpy_buf *const *bufs,
                         const char *const *names, int n)
{
    const int given = dtype >= 0;
    const char *from = NULL;
    for (int i = 0; i < n; i++) {
        const ccqpy_buf *b = bufs[i];
        if (b->kind == CCQPY_BUF_NONE)
            continue;
        if (given) {
            if (b->dtype != dtype && !raw_ok(b, dtype)) {
                int raw =
                    dtype == CCQ_BFLOAT16 || dtype == CCQ_FLOAT8E4M3 || dtype == CCQ_FLOAT8E5M2;
                ccqpy_raisef(CCQ_ERR_INVALID_ARGUMENT, "%s: dtype=%s, but %s holds %s%s", fn,
                             ccq_dtype_name((ccq_dtype)dtype), names[i], b->what,
                             raw ? " (its raw bits come in an unsigned integer array of the same "
                                   "width: uint16 for bfloat16, uint8 for float8)"
                                 : "");
                return -1;
            }
        } else if (b->dtype < 0) {
            ccqpy_raisef(CCQ_ERR_INVALID_ARGUMENT, "%s: %s holds %s, which is no ccq dtype%s", fn,
                         names[i], b->what,
                         b->raw_bits == 16 ? " (for bfloat16 bits in a uint16 array, pass "
                                             "dtype=ccq.BFLOAT16)"
                                           : " (ccq has int8, uint8, int32, uint32, int64, "
                                             "uint64, float16, float32, float64, bfloat16, "
                                             "float8e4m3, float8e5m2)");
            return -1;
        } else if (from == NULL) {
            dtype = b->dtype;
            from = names[i];
        } else if (b->dtype != dtype) {
            ccqpy_raisef(CCQ_ERR_INVALID_ARGUMENT, "%s: %s holds %s but %s holds %s", fn, from,
                         ccq_dtype_name((ccq_dtype)dtype), names[i], b->what);
            return -1;
        }
    }
    if (dtype < 0)
        ccqpy_raisef(CCQ_ERR_INVALID_ARGUMENT, "%s: no buffer to take the dtype from", fn);
    return dtype;
}

/* Elements of a buffer in units of dtype; -1 with an error when it is not a whole number. */
static int64_t elements(const char *fn, const char *name, const ccqpy_buf *b, int dtype)
{
    size_t es = ccq_dtype_size((ccq_dtype)dtype);
    if (b->nbytes % es != 0) {
        ccqpy_raisef(CCQ_ERR_INVALID_ARGUMENT, "%s: %s has %zu bytes, not a whole number of %s", fn,
                     name, b->nbytes, ccq_dtype_name((ccq_dtype)dtype));
        return -1;
    }
    return (int64_t)(b->nbytes / es);
}

/* The count of a collective from its buffers' sizes, each checked against it. */
static int64_t count_of(const coll *c, ccqpy_buf *src, ccqpy_buf *dst, int dtype, size_t n)
{
    int64_t se = -1, de = -1;
    if (src->kind != CCQPY_BUF_NONE && (se = elements(c->name, "src", src, dtype)) < 0)
        return -1;
    if (dst->kind != CCQPY_BUF_NONE && (de = elements(c->name, "dst", dst, dtype)) < 0)
        return -1;
    int64_t count;
    if (se >= 0 && c->src_blocks == 1)
        count = se;
    else if (de >= 0 && c->dst_blocks == 1)
        count = de;
    else if (se >= 0 || de >= 0) {
        int64_t e = se >= 0 ? se : de;
        if (e % (int64_t)n != 0) {
            ccqpy_raisef(CCQ_ERR_INVALID_ARGUMENT,
                         "%s: %s holds %lld elements, not a multiple of the %zu ranks", c->name,
                         se >= 0 ? "src" : "dst", (long long)e, n);
            return -1;
        }
        count = e / (int64_t)n;
    } else {
        ccqpy_raisef(CCQ_ERR_INVALID_ARGUMENT, "%s: no buffer on this device", c->name);
        return -1;
    }
    const struct {
        const char *name;
        int64_t have;
        int blocks;
    } check[2] = {{"src", se, c->src_blocks}, {"dst", de, c->dst_blocks}};
    for (int i = 0; i < 2; i++) {
        int64_t want = check[i].blocks == 1 ? count : count * (int64_t)n;
        if (check[i].have >= 0 && check[i].have != want) {
            char why[96] = "";
            if (check[i].blocks != 1)
                snprintf(why, sizeof why, " (%zu ranks x %lld)", n, (long long)count);
            ccqpy_raisef(CCQ_ERR_INVALID_ARGUMENT, "%s: %s holds %lld %s elements, expected %lld%s",
                         c->name, check[i].name, (long long)check[i].have,
                         ccq_dtype_name((ccq_dtype)dtype), (long long)want, why);
            return -1;
        }
    }
    return count;
}

/* devices= : a sequence of ids into ids[] (room for `room`), or the runtime's all. */
static int devices_arg(ccqpy_runtime *self, PyObject *v, ccq_device_id *stack, size_t room,
                       ccq_device_id **ids, size_t *n)
{
    if (v == NULL || v == Py_None) {
        *ids = self->all;
        *n = self->ndev;
        return 0;
    }
    PyObject *seq = PySequence_Fast(v, "devices must be a sequence of device ids");
    if (seq == NULL)
        return -1;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    *ids = (size_t)len <= room ? stack : PyMem_Malloc((size_t)len * sizeof **ids);
    if (*ids == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < len; i++)
        if (ccqpy_u32(items[i], "devices", &(*ids)[i]) != 0) {
            if (*ids != stack)
                PyMem_Free(*ids);
            Py_DECREF(seq);
            return -1;
        }
    Py_DECREF(seq);
    *n = (size_t)len;
    return 0;
}

/* Enter the runtime for a submission on (device, stream) and make room for its hold, so that
 * keeping the buffers after the C call accepted the command cannot fail. 0, or -1 with an
 * error set (nothing entered). */
static int submit_begin(ccqpy_runtime *self, uint32_t device, uint32_t stream, ccqpy_holds **h)
{
    if (ccqpy_enter(self, 1) != 0)
        return -1;
    *h = ccqpy_holds_of(self, device, stream);
    if (*h && ccqpy_holds_reserve(*h) != 0) {
        ccqpy_leave(self);
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* After the C call: the buffers of an accepted command go to its stream's holds (h is NULL
 * only if ccq accepted a device or stream this process does not own, which it never does:
 * the buffers are then kept for ever rather than freed under ccq); a refusal raises ccq's
 * error. Leaves the runtime. None, or NULL with the error set. */
static PyObject *submit_end(ccqpy_runtime *self, ccqpy_holds *h, ccq_status st, ccqpy_buf *bufs,
                            int n)
{
    PyObject *r = NULL;
    if (st == CCQ_OK) {
        if (h != NULL)
            ccqpy_holds_push(h, bufs, n);
        else
            for (int i = 0; i < n; i++)
                bufs[i].kind = CCQPY_BUF_NONE;
        r = Py_NewRef(Py_None);
    } else {
        ccqpy_raise(st, NULL);
    }
    ccqpy_leave(self);
    return r;
}

/* The C call of a collective (run with the GIL released). */
static ccq_status call_coll(const coll *c, ccq_runtime *rt, ccq_device_id device,
                            ccq_stream_id stream, const void *s, void *d, size_t cnt, ccq_dtype dt,
                            ccq_reduce_op o, ccq_device_id root, const ccq_device_id *ids, size_t n)
{
    ccq_status st;
    switch (c->kind) {
    case CCQ_KIND_ALL_REDUCE:
        st = ccq_all_reduce(rt, device, stream, s, d, cnt, dt, o, ids, n);
        break;
    case CCQ_KIND_BROADCAST:
        st = ccq_broadcast(rt, device, stream, s, d, cnt, dt, root, ids, n);
        break;
    case CCQ_KIND_REDUCE:
        st = ccq_reduce(rt, device, stream, s, d, cnt, dt, o, root, ids, n);
        break;
    case CCQ_KIND_ALL_GATHER:
        st = ccq_all_gather(rt, device, stream, s, d, cnt, dt, ids, n);
        break;
    case CCQ_KIND_REDUCE_SCATTER:
        st = ccq_reduce_scatter(rt, device, stream, s, d, cnt, dt, o, ids, n);
        break;
    case CCQ_KIND_ALL_TO_ALL:
        st = ccq_all_to_all(rt, device, stream, s, d, cnt, dt, ids, n);
        break;
    case CCQ_KIND_GATHER:
        st = ccq_gather(rt, device, stream, s, d, cnt, dt, root, ids, n);
        break;
    case CCQ_KIND_SCATTER:
        st = ccq_scatter(rt, device, stream, s, d, cnt, dt, root, ids, n);
        break;
    default:
        st = CCQ_ERR_UNSUPPORTED;
    }
    return st;
}

static PyObject *submit_coll(ccqpy_runtime *self, const coll *c, PyObject *const *args,
                             Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *kw[KW_COUNT_];
    ccq_device_id stack[64], *ids = NULL;
    size_t n = 0;
    uint32_t device, stream = 0, root = 0;
    int op = CCQ_SUM, dtype = -1;
    ccqpy_buf bufs[2] = {{0}, {0}};
    ccqpy_buf *src = &bufs[0], *dst = &bufs[1];
    int in_place = 0;
    PyObject *result = NULL;

    if (nargs < 2 || nargs > 3) {
        PyErr_Format(PyExc_TypeError,
                     "%s(device, src, dst=None, *, ...) takes 2 or 3 "
                     "positional arguments (%zd given)",
                     c->name, nargs);
        return NULL;
    }
    if (ccqpy_kwargs(c->name, args + nargs, kwnames, kw_names, kw) != 0)
        return NULL;
    if (kw[KW_PEER] || (!c->has_op && kw[KW_OP]) || (!c->has_root && kw[KW_ROOT])) {
        PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%s'", c->name,
                     kw[KW_PEER] ? "peer"
                     : kw[KW_OP] ? "op"
                                 : "root");
        return NULL;
    }
    if (c->has_root && kw[KW_ROOT] == NULL) {
        PyErr_Format(PyExc_TypeError, "%s() needs root= (a device id)", c->name);
        return NULL;
    }
    if (ccqpy_u32(args[0], "device", &device) != 0 ||
        (kw[KW_STREAM] && ccqpy_u32(kw[KW_STREAM], "stream", &stream) != 0) ||
        (kw[KW_ROOT] && ccqpy_u32(kw[KW_ROOT], "root", &root) != 0))
        return NULL;
    if (kw[KW_OP]) {
        long v = PyLong_AsLong(kw[KW_OP]);
        if (v == -1 && PyErr_Occurred())
            return NULL;
        if (v < INT32_MIN || v > INT32_MAX)
            return ccqpy_raisef(CCQ_ERR_INVALID_ARGUMENT, "%s: op %ld out of range", c->name, v);
        op = (int)v; /* ccq checks it and names it in its detail */
    }
    if (kw[KW_DTYPE] && kw[KW_DTYPE] != Py_None && (dtype = ccqpy_dtype_arg(kw[KW_DTYPE])) < 0)
        return NULL;

    /* The buffers this device uses. */
    int is_root = c->has_root && device == root;
    PyObject *src_o = args[1];
    PyObject *dst_o = nargs > 2 ? args[2] : (c->in_place_default ? args[1] : Py_None);
    ccqpy_mem mem = self->cuda ? CCQPY_MEM_CUDA : CCQPY_MEM_HOST;
    int use_src = !(c->src_root_only && !is_root);
    int use_dst = !(c->dst_root_only && !is_root);
    if (use_src && src_o == Py_None)
        return ccqpy_raisef(CCQ_ERR_INVALID_ARGUMENT, "%s: src is None%s", c->name,
                            c->src_root_only ? " on the root" : "");
    if (use_dst && dst_o == Py_None)
        return ccqpy_raisef(CCQ_ERR_INVALID_ARGUMENT, "%s: dst is None%s", c->name,
                            c->dst_root_only ? " on the root" : "");
    if (use_src && use_dst && src_o == dst_o) {
        /* In place: one export, writable, serves both (and is held once). */
        if (ccqpy_buf_get(dst_o, mem, 1, "src (in place)", dst) != 0)
            return NULL;
        in_place = 1;
    } else {
        if (use_src && ccqpy_buf_get(src_o, mem, 0, "src", src) != 0)
            return NULL;
        if (use_dst && ccqpy_buf_get(dst_o, mem, 1, "dst", dst) != 0)
            goto out;
    }
    static const char *const names[2] = {"src", "dst"}, *const names_in_place[2] = {
                                                            "src", "src (in place)"};
    ccqpy_buf *pb[2] = {src, dst};
    if ((dtype = resolve_dtype(c->name, dtype, pb, in_place ? names_in_place : names, 2)) < 0)
        goto out;
    if (devices_arg(self, kw[KW_DEVICES], stack, 64, &ids, &n) != 0)
        goto out;
    int64_t count = count_of(c, src, dst, dtype, n ? n : 1);
    if (count < 0)
        goto out;

    ccqpy_holds *h;
    if (submit_begin(self, device, stream, &h) != 0)
        goto out;
    ccq_runtime *rt = self->rt;
    const void *s = in_place ? dst->ptr : src->kind ? src->ptr : NULL;
    void *d = dst->kind ? dst->ptr : NULL;
    size_t cnt = (size_t)count;
    ccq_dtype dt = (ccq_dtype)dtype;
    ccq_reduce_op o = (ccq_reduce_op)op;
    ccq_status st;
    CCQPY_NOGIL(st = call_coll(c, rt, device, stream, s, d, cnt, dt, o, root, ids, n));
    result = submit_end(self, h, st, bufs, 2);
out:
    if (ids && ids != stack && ids != self->all)
        PyMem_Free(ids);
    ccqpy_buf_release(src);
    ccqpy_buf_release(dst);
    return result;
}

/* send(device, buf, *, peer, stream=0, dtype=None) and recv(...). */
static PyObject *submit_p2p(ccqpy_runtime *self, int is_send, PyObject *const *args,
                            Py_ssize_t nargs, PyObject *kwnames)
{
    const char *fn = is_send ? "send" : "recv";
    PyObject *kw[KW_COUNT_];
    uint32_t device, stream = 0, peer;
    int dtype = -1;
    ccqpy_buf buf = {0};
    PyObject *result = NULL;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError,
                     "%s(device, buf, *, peer, stream=0, dtype=None) takes 2 "
                     "positional arguments (%zd given)",
                     fn, nargs);
        return NULL;
    }
    if (ccqpy_kwargs(fn, args + nargs, kwnames, kw_names, kw) != 0)
        return NULL;
    if (kw[KW_DEVICES] || kw[KW_OP] || kw[KW_ROOT]) {
        PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%s'", fn,
                     kw[KW_DEVICES] ? "devices"
                     : kw[KW_OP]    ? "op"
                                    : "root");
        return NULL;
    }
    if (kw[KW_PEER] == NULL) {
        PyErr_Format(PyExc_TypeError, "%s() needs peer= (a device id)", fn);
        return NULL;
    }
    if (ccqpy_u32(args[0], "device", &device) != 0 || ccqpy_u32(kw[KW_PEER], "peer", &peer) != 0 ||
        (kw[KW_STREAM] && ccqpy_u32(kw[KW_STREAM], "stream", &stream) != 0))
        return NULL;
    if (kw[KW_DTYPE] && kw[KW_DTYPE] != Py_None && (dtype = ccqpy_dtype_arg(kw[KW_DTYPE])) < 0)
        return NULL;
    if (args[1] == Py_None)
        return ccqpy_raisef(CCQ_ERR_INVALID_ARGUMENT, "%s: buf is None", fn);
    if (ccqpy_buf_get(args[1], self->cuda ? CCQPY_MEM_CUDA : CCQPY_MEM_HOST, !is_send, "buf",
                      &buf) != 0)
        return NULL;
    static const char *const names[1] = {"buf"};
    ccqpy_buf *pb[1] = {&buf};
    int64_t count;
    if ((dtype = resolve_dtype(fn, dtype, pb, names, 1)) < 0 ||
        (count = elements(fn, "buf", &buf, dtype)) < 0)
        goto out;
    ccqpy_holds *h;
    if (submit_begin(self, device, stream, &h) != 0)
        goto out;
    ccq_runtime *rt = self->rt;
    ccq_status st;
    CCQPY_NOGIL(
        st = is_send
                 ? ccq_send(rt, device, stream, buf.ptr, (size_t)count, (ccq_dtype)dtype, peer)
                 : ccq_recv(rt, device, stream, buf.ptr, (size_t)count, (ccq_dtype)dtype, peer));
    result = submit_end(self, h, st, &buf, 1);
out:
    ccqpy_buf_release(&buf);
    return result;
}

#define CCQPY_COLL_METHOD_(i, fname)                                                               \
    static PyObject *m_##fname(PyObject *self, PyObject *const *args, Py_ssize_t nargs,            \
                               PyObject *kwnames)                                                  \
    {                                                                                              \
        return submit_coll((ccqpy_runtime *)self, &colls[i], args, nargs, kwnames);                \
    }
CCQPY_COLL_METHOD_(0, all_reduce)
CCQPY_COLL_METHOD_(1, broadcast)
CCQPY_COLL_METHOD_(2, reduce)
CCQPY_COLL_METHOD_(3, all_gather)
CCQPY_COLL_METHOD_(4, reduce_scatter)
CCQPY_COLL_METHOD_(5, all_to_all)
CCQPY_COLL_METHOD_(6, gather)
CCQPY_COLL_METHOD_(7, scatter)
#undef CCQPY_COLL_METHOD_

static PyObject *m_send(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return submit_p2p((ccqpy_runtime *)self, 1, args, nargs, kwnames);
}

static PyObject *m_recv(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return submit_p2p((ccqpy_runtime *)self, 0, args, nargs, kwnames);
}

#define CCQPY_M_(name, doc)                                                                        \
    {                                                                                              \
#name, (PyCFunction)(void (*)(void))m_##name, METH_FASTCALL | METH_KEYWORDS, doc           \
    }

PyMethodDef ccqpy_submit_methods[] = {
    CCQPY_M_(all_reduce, "all_reduce(device, src, dst=None, *, devices=None, op=SUM, stream=0, "
                         "dtype=None): queue this device's part (dst None: in place)."),
    CCQPY_M_(broadcast, "broadcast(device, src, dst=None, *, root, devices=None, stream=0, "
                        "dtype=None): the root's src to every dst (src read on the root only)."),
    CCQPY_M_(reduce, "reduce(device, src, dst=None, *, root, devices=None, op=SUM, stream=0, "
                     "dtype=None): every src reduced into the root's dst."),
    CCQPY_M_(all_gather, "all_gather(device, src, dst, *, devices=None, stream=0, dtype=None): "
                         "rank r's src to block r of every dst (n x count)."),
    CCQPY_M_(reduce_scatter, "reduce_scatter(device, src, dst, *, devices=None, op=SUM, "
                             "stream=0, dtype=None): block r of every src reduced into rank r's "
                             "dst."),
    CCQPY_M_(all_to_all, "all_to_all(device, src, dst, *, devices=None, stream=0, dtype=None): "
                         "block j of rank i's src to block i of rank j's dst."),
    CCQPY_M_(gather, "gather(device, src, dst=None, *, root, devices=None, stream=0, "
                     "dtype=None): every src into block r of the root's dst."),
    CCQPY_M_(scatter, "scatter(device, src, dst, *, root, devices=None, stream=0, dtype=None): "
                      "block r of the root's src to rank r's dst."),
    CCQPY_M_(send, "send(device, buf, *, peer, stream=0, dtype=None): one half of a transfer."),
    CCQPY_M_(recv, "recv(device, buf, *, peer, stream=0, dtype=None): the other half."),
    {NULL, NULL, 0, NULL},
};

int ccqpy_submit_init(void)
{
    return names_init();
}
