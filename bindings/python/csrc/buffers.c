/* User buffers as ccq sees them: the buffer protocol (NumPy, array, memoryview, bytes...),
 * DLPack (__dlpack__, both capsule versions) and, for CUDA memory, __cuda_array_interface__;
 * the element type each one holds, and what keeps it alive while ccq borrows it. */
#include "ccqpy.h"

#include <string.h>

/* ---- DLPack: the ABI of dlpack.h (v1.x), declared here from its specification ------------ */

typedef struct {
    int32_t device_type; /* kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13 */
    int32_t device_id;
} ccqpy_dl_device;

typedef struct {
    uint8_t code; /* int 0, uint 1, float 2, bfloat 4, float8_e4m3fn 10, float8_e5m2 12 */
    uint8_t bits;
    uint16_t lanes;
} ccqpy_dl_dtype;

typedef struct {
    void *data;
    ccqpy_dl_device device;
    int32_t ndim;
    ccqpy_dl_dtype dtype;
    int64_t *shape;
    int64_t *strides; /* in elements; NULL = compact row-major */
    uint64_t byte_offset;
} ccqpy_dl_tensor;

typedef struct ccqpy_dl_managed {
    ccqpy_dl_tensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct ccqpy_dl_managed *self);
} ccqpy_dl_managed;

typedef struct ccqpy_dl_managed_v1 {
    struct {
        uint32_t major, minor;
    } version;
    void *manager_ctx;
    void (*deleter)(struct ccqpy_dl_managed_v1 *self);
    uint64_t flags; /* bit 0: read only */
    ccqpy_dl_tensor dl_tensor;
} ccqpy_dl_managed_v1;

enum { DL_CPU = 1, DL_CUDA = 2, DL_CUDA_HOST = 3, DL_CUDA_MANAGED = 13 };
enum { DL_INT = 0, DL_UINT = 1, DL_FLOAT = 2, DL_BFLOAT = 4, DL_F8E4M3FN = 10, DL_F8E5M2 = 12 };
#define DL_FLAG_READ_ONLY 1ull

/* ---- element types ----------------------------------------------------------------------- */

/* A signed/unsigned integer or float of @p bytes as ccq's dtype; -1 when ccq has none.
 * Unsigned integers also report their width as raw bits (a view of bf16/fp8 data). */
static void classify(char kind, size_t bytes, ccqpy_buf *b)
{
    static const char *const ints[] = {"int8", "int16", "int32", "int64"};
    static const char *const uints[] = {"uint8", "uint16", "uint32", "uint64"};
    int l = bytes == 1 ? 0 : bytes == 2 ? 1 : bytes == 4 ? 2 : bytes == 8 ? 3 : -1;
    b->dtype = -1;
    b->raw_bits = 0;
    b->what = "an element type ccq does not have";
    if (l < 0)
        return;
    if (kind == 'i') {
        static const int map[] = {CCQ_INT8, -1, CCQ_INT32, CCQ_INT64};
        b->dtype = map[l];
        b->what = ints[l];
    } else if (kind == 'u') {
        static const int map[] = {CCQ_UINT8, -1, CCQ_UINT32, CCQ_UINT64};
        b->dtype = map[l];
        b->raw_bits = (int)bytes * 8;
        b->what = uints[l];
    } else if (kind == 'f') {
        static const int map[] = {-1, CCQ_FLOAT16, CCQ_FLOAT32, CCQ_FLOAT64};
        static const char *const floats[] = {"float8", "float16", "float32", "float64"};
        b->dtype = map[l];
        b->what = floats[l];
    }
}

static int little_endian(void)
{
    const uint16_t one = 1;
    return *(const uint8_t *)&one == 1;
}

/* The struct-module format of a buffer: one native-order integer or float. */
static void classify_format(const char *f, size_t itemsize, ccqpy_buf *b)
{
    char order = '@';
    if (f == NULL)
        f = "B";
    if (*f == '@' || *f == '=' || *f == '<' || *f == '>' || *f == '!')
        order = *f++;
    int big = order == '>' || order == '!';
    if ((big && little_endian()) || (order == '<' && !little_endian()) || strlen(f) != 1) {
        b->dtype = -1;
        b->raw_bits = 0;
        b->what = big ? "big-endian data" : "a format ccq does not read";
        return;
    }
    switch (*f) {
    case 'b':
    case 'h':
    case 'i':
    case 'l':
    case 'q':
    case 'n':
        classify('i', itemsize, b);
        break;
    case 'B':
    case 'c':
    case 'H':
    case 'I':
    case 'L':
    case 'Q':
    case 'N':
        classify('u', itemsize, b);
        break;
    case 'e':
    case 'f':
    case 'd':
        classify('f', itemsize, b);
        break;
    case '?':
        b->dtype = -1, b->raw_bits = 0, b->what = "bool";
        break;
    default:
        b->dtype = -1, b->raw_bits = 0, b->what = "an element type ccq does not have";
    }
}

/* ---- the three protocols ----------------------------------------------------------------- */

static int refuse(const char *name, const char *fmt, const char *arg)
{
    char msg[512];
    snprintf(msg, sizeof msg, fmt, arg);
    ccqpy_raisef(CCQ_ERR_INVALID_ARGUMENT, "%s: %s", name, msg);
    return -1;
}

/* Types NumPy exports through neither protocol (ml_dtypes' bfloat16, float8_*): say how. */
static int hint_export(PyObject *obj, const char *name)
{
    PyObject *dt = PyObject_GetAttrString(obj, "dtype");
    PyObject *s = dt ? PyObject_Str(dt) : NULL;
    const char *d = s ? PyUnicode_AsUTF8(s) : NULL;
    int done = -1;
    PyErr_Clear();
    if (d && (strstr(d, "bfloat16") || strstr(d, "float8"))) {
        const char *raw = strstr(d, "bfloat16") ? "np.uint16" : "np.uint8";
        char msg[400];
        snprintf(msg, sizeof msg,
                 "an array of %s cannot be exported (NumPy has no such type: neither the buffer "
                 "protocol nor DLPack carries it); pass its bits, a.view(%s), with dtype=ccq.%s",
                 d, raw,
                 strstr(d, "bfloat16") ? "BFLOAT16"
                 : strstr(d, "e5m2")   ? "FLOAT8E5M2"
                                       : "FLOAT8E4M3");
        ccqpy_raisef(CCQ_ERR_INVALID_ARGUMENT, "%s: %s", name, msg);
        done = 0;
    }
    Py_XDECREF(s);
    Py_XDECREF(dt);
    return done;
}

static int from_view(PyObject *obj, int writable, const char *name, ccqpy_buf *b)
{
    /* Ask for strides and format without requiring anything, then check contiguity and
     * writability here: the exporter's own refusals ("ndarray is not C-contiguous") would not
     * say which argument or why ccq needs it. */
    if (PyObject_GetBuffer(obj, &b->u.view, PyBUF_RECORDS_RO) != 0)
        return -2; /* the exporter's own refusal, still set */
    b->kind = CCQPY_BUF_VIEW;
    Py_buffer *v = &b->u.view;
    if (writable && v->readonly) {
        ccqpy_buf_release(b);
        return refuse(name, "%s is read-only, and ccq writes the result into it",
                      Py_TYPE(obj)->tp_name);
    }
    if (!PyBuffer_IsContiguous(v, 'C')) {
        ccqpy_buf_release(b);
        return refuse(name,
                      "the %s is not contiguous (C order): ccq reads and writes one block of "
                      "memory (np.ascontiguousarray makes a contiguous copy)",
                      Py_TYPE(obj)->tp_name);
    }
    b->ptr = v->buf;
    b->nbytes = (size_t)v->len;
    classify_format(v->format, (size_t)v->itemsize, b);
    return 0;
}

/* Check a DLTensor: memory kind, element type, contiguity; fills ptr, nbytes, dtype. */
static int check_dl(const ccqpy_dl_tensor *t, ccqpy_mem mem, const char *name, ccqpy_buf *b)
{
    int dev = t->device.device_type;
    int host_ok = dev == DL_CPU || dev == DL_CUDA_HOST || dev == DL_CUDA_MANAGED;
    int cuda_ok = dev == DL_CUDA || dev == DL_CUDA_MANAGED;
    if (mem == CCQPY_MEM_HOST ? !host_ok : !cuda_ok) {
        char what[64];
        snprintf(what, sizeof what, "%d", dev);
        return refuse(name,
                      mem == CCQPY_MEM_HOST
                          ? "the tensor is in device memory (DLPack device type %s), and the "
                            "host backend takes host memory"
                          : "the tensor is not in CUDA memory (DLPack device type %s), and the "
                            "nccl backend takes device memory",
                      what);
    }
    if (t->dtype.lanes != 1)
        return refuse(name, "%s", "vector element types (DLPack lanes > 1) are not supported");
    size_t bytes = t->dtype.bits / 8;
    switch (t->dtype.code) {
    case DL_INT:
        classify('i', bytes, b);
        break;
    case DL_UINT:
        classify('u', bytes, b);
        break;
    case DL_FLOAT:
        classify('f', bytes, b);
        break;
    case DL_BFLOAT:
        b->dtype = t->dtype.bits == 16 ? CCQ_BFLOAT16 : -1, b->raw_bits = 0, b->what = "bfloat16";
        break;
    case DL_F8E4M3FN:
        b->dtype = CCQ_FLOAT8E4M3, b->raw_bits = 0, b->what = "float8_e4m3fn";
        break;
    case DL_F8E5M2:
        b->dtype = CCQ_FLOAT8E5M2, b->raw_bits = 0, b->what = "float8_e5m2";
        break;
    default:
        b->dtype = -1, b->raw_bits = 0, b->what = "an element type ccq does not have";
    }
    if (t->dtype.bits % 8 != 0 || bytes == 0)
        return refuse(name, "%s", "sub-byte element types are not supported");
    size_t n = 1;
    int64_t expect = 1;
    int contiguous = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] < 0)
            return refuse(name, "%s", "negative DLPack shape");
        if (t->strides && t->shape[i] > 1 && t->strides[i] != expect)
            contiguous = 0;
        expect *= t->shape[i];
        n *= (size_t)t->shape[i];
    }
    if (!contiguous)
        return refuse(name, "%s",
                      "the tensor is not contiguous (C order): ccq reads and writes one block of "
                      "memory (make a contiguous copy first)");
    b->ptr = (char *)t->data + t->byte_offset;
    b->nbytes = n * bytes;
    return 0;
}

static int from_dlpack(PyObject *obj, PyObject *method, ccqpy_mem mem, int writable,
                       const char *name, ccqpy_buf *b)
{
    /* Ask for a versioned capsule (read-only flag, version); producers older than DLPack 1.0
     * take no max_version and give the legacy one. */
    PyObject *kw = Py_BuildValue("{s(ii)}", "max_version", 1, 1);
    PyObject *empty = PyTuple_New(0);
    PyObject *cap = kw && empty ? PyObject_Call(method, empty, kw) : NULL;
    Py_XDECREF(kw);
    if (cap == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        cap = PyObject_Call(method, empty, NULL);
    }
    Py_XDECREF(empty);
    if (cap == NULL) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        PyObject *s = value ? PyObject_Str(value) : NULL;
        const char *m = s ? PyUnicode_AsUTF8(s) : NULL;
        char msg[300];
        snprintf(msg, sizeof msg, "__dlpack__ failed: %s", m ? m : "(no message)");
        PyErr_Clear();
        Py_XDECREF(s);
        Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(tb);
        if (hint_export(obj, name) != 0)
            refuse(name, "%s", msg);
        return -1;
    }
    int rc = -1;
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        ccqpy_dl_managed_v1 *mt = PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (PyCapsule_SetName(cap, "used_dltensor_versioned") != 0)
            goto out;
        b->kind = CCQPY_BUF_DLPACK_V1;
        b->u.managed = mt;
        if (mt->version.major != 1) {
            char v[16];
            snprintf(v, sizeof v, "%u", mt->version.major);
            ccqpy_buf_release(b);
            refuse(name, "DLPack major version %s (this ccq reads 1)", v);
            goto out;
        }
        if (writable && (mt->flags & DL_FLAG_READ_ONLY)) {
            ccqpy_buf_release(b);
            refuse(name, "the %s is read-only (DLPack flag), and ccq writes the result into it",
                   Py_TYPE(obj)->tp_name);
            goto out;
        }
        if (check_dl(&mt->dl_tensor, mem, name, b) != 0) {
            ccqpy_buf_release(b);
            goto out;
        }
    } else if (PyCapsule_IsValid(cap, "dltensor")) {
        ccqpy_dl_managed *mt = PyCapsule_GetPointer(cap, "dltensor");
        if (PyCapsule_SetName(cap, "used_dltensor") != 0)
            goto out;
        b->kind = CCQPY_BUF_DLPACK;
        b->u.managed = mt;
        if (check_dl(&mt->dl_tensor, mem, name, b) != 0) {
            ccqpy_buf_release(b);
            goto out;
        }
    } else {
        refuse(name, "%s", "__dlpack__ returned something other than a DLPack capsule");
        goto out;
    }
    rc = 0;
out:
    Py_DECREF(cap);
    return rc;
}

/* __cuda_array_interface__ (version 2 or 3): a dict describing CUDA memory. */
static int from_cai(PyObject *obj, PyObject *cai, int writable, const char *name, ccqpy_buf *b)
{
    if (!PyDict_Check(cai))
        return refuse(name, "%s", "__cuda_array_interface__ is not a dict");
    PyObject *data = PyDict_GetItemString(cai, "data");
    PyObject *shape = PyDict_GetItemString(cai, "shape");
    PyObject *typestr = PyDict_GetItemString(cai, "typestr");
    PyObject *strides = PyDict_GetItemString(cai, "strides");
    PyObject *mask = PyDict_GetItemString(cai, "mask");
    if (!data || !PyTuple_Check(data) || PyTuple_GET_SIZE(data) != 2 || !shape ||
        !PyTuple_Check(shape) || !typestr || !PyUnicode_Check(typestr))
        return refuse(name, "%s", "__cuda_array_interface__ lacks data, shape or typestr");
    if (mask && mask != Py_None)
        return refuse(name, "%s",
                      "masked arrays (__cuda_array_interface__ mask) are not supported");
    const char *ts = PyUnicode_AsUTF8(typestr);
    if (ts == NULL)
        return -1;
    if (strlen(ts) < 3 || ((ts[0] == '>' && little_endian()) || (ts[0] == '<' && !little_endian())))
        return refuse(name, "typestr '%s' is not native-order data", ts);
    long size = strtol(ts + 2, NULL, 10);
    char kind = ts[1] == 'V' ? 'u' : ts[1]; /* void: raw bits (bf16 from some producers) */
    classify(kind == 'i' || kind == 'u' || kind == 'f' ? kind : '?', (size_t)size, b);
    if (ts[1] == 'V' && b->dtype == CCQ_UINT8)
        b->dtype = -1, b->raw_bits = 8; /* raw bytes only, never taken for uint8 */
    size_t n = 1;
    Py_ssize_t nd = PyTuple_GET_SIZE(shape);
    for (Py_ssize_t i = 0; i < nd; i++) {
        long long d = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
        if (d < 0)
            return PyErr_Occurred() ? -1 : refuse(name, "%s", "negative shape");
        n *= (size_t)d;
    }
    if (strides && strides != Py_None) {
        if (!PyTuple_Check(strides) || PyTuple_GET_SIZE(strides) != nd)
            return refuse(name, "%s", "malformed strides");
        long long expect = size;
        for (Py_ssize_t i = nd - 1; i >= 0; i--) {
            long long d = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
            long long s = PyLong_AsLongLong(PyTuple_GET_ITEM(strides, i));
            if (PyErr_Occurred())
                return -1;
            if (d > 1 && s != expect)
                return refuse(name, "%s",
                              "the array is not contiguous (C order): ccq reads and writes one "
                              "block of memory (make a contiguous copy first)");
            expect *= d;
        }
    }
    int ro = PyObject_IsTrue(PyTuple_GET_ITEM(data, 1));
    if (ro < 0)
        return -1;
    if (writable && ro)
        return refuse(name, "the %s is read-only, and ccq writes the result into it",
                      Py_TYPE(obj)->tp_name);
    unsigned long long p = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(data, 0));
    if (PyErr_Occurred())
        return -1;
    b->ptr = (void *)(uintptr_t)p;
    b->nbytes = n * (size_t)size;
    b->kind = CCQPY_BUF_OBJECT;
    b->u.obj = Py_NewRef(obj);
    return 0;
}

int ccqpy_buf_get(PyObject *obj, ccqpy_mem mem, int writable, const char *name, ccqpy_buf *b)
{
    memset(b, 0, sizeof *b);
    b->dtype = -1;
    /* Host memory: the buffer protocol first (the cheapest: NumPy arrays, array.array,
     * memoryview, bytearray), then DLPack (PyTorch CPU tensors, JAX, ...). CUDA memory: the
     * buffer protocol can only describe host memory, so DLPack, then the CUDA array
     * interface (CuPy, PyTorch, Numba). */
    PyObject *refusal = NULL; /* the exporter's error, for the message if nothing else works */
    if (mem == CCQPY_MEM_HOST && PyObject_CheckBuffer(obj)) {
        int r = from_view(obj, writable, name, b);
        if (r != -2)
            return r;
        /* An exporter that cannot describe its type (ml_dtypes: "cannot include dtype 'E' in
         * a buffer") may still do DLPack. */
        PyObject *type, *tb;
        PyErr_Fetch(&type, &refusal, &tb);
        PyErr_NormalizeException(&type, &refusal, &tb);
        Py_XDECREF(type), Py_XDECREF(tb);
    }
    PyObject *dl = PyObject_GetAttrString(obj, "__dlpack__");
    if (dl != NULL) {
        Py_XDECREF(refusal);
        int r = from_dlpack(obj, dl, mem, writable, name, b);
        Py_DECREF(dl);
        return r;
    }
    PyErr_Clear();
    PyObject *cai = PyObject_GetAttrString(obj, "__cuda_array_interface__");
    if (cai != NULL) {
        Py_XDECREF(refusal);
        int r = mem == CCQPY_MEM_CUDA
                    ? from_cai(obj, cai, writable, name, b)
                    : refuse(name,
                             "the %s is CUDA memory (__cuda_array_interface__), and the host "
                             "backend takes host memory",
                             Py_TYPE(obj)->tp_name);
        Py_DECREF(cai);
        return r;
    }
    PyErr_Clear();
    if (hint_export(obj, name) == 0) {
        Py_XDECREF(refusal);
        return -1;
    }
    if (refusal != NULL) {
        PyObject *s = PyObject_Str(refusal);
        const char *m = s ? PyUnicode_AsUTF8(s) : NULL;
        PyErr_Clear();
        char msg[300];
        snprintf(msg, sizeof msg, "the %s refused to export its memory: %s", Py_TYPE(obj)->tp_name,
                 m ? m : "(no message)");
        Py_XDECREF(s);
        Py_DECREF(refusal);
        return refuse(name, "%s", msg);
    }
    return refuse(name,
                  mem == CCQPY_MEM_HOST
                      ? "a %s has neither the buffer protocol nor __dlpack__ (give a NumPy "
                        "array, a memoryview, a DLPack tensor...)"
                      : "a %s has neither __dlpack__ nor __cuda_array_interface__ (give a CuPy "
                        "array or a PyTorch CUDA tensor...)",
                  Py_TYPE(obj)->tp_name);
}

void ccqpy_buf_release(ccqpy_buf *b)
{
    switch (b->kind) {
    case CCQPY_BUF_VIEW:
        PyBuffer_Release(&b->u.view);
        break;
    case CCQPY_BUF_DLPACK: {
        ccqpy_dl_managed *mt = b->u.managed;
        if (mt->deleter)
            mt->deleter(mt);
        break;
    }
    case CCQPY_BUF_DLPACK_V1: {
        ccqpy_dl_managed_v1 *mt = b->u.managed;
        if (mt->deleter)
            mt->deleter(mt);
        break;
    }
    case CCQPY_BUF_OBJECT:
        Py_DECREF(b->u.obj);
        break;
    case CCQPY_BUF_NONE:
        break;
    }
    b->kind = CCQPY_BUF_NONE;
}

int ccqpy_dtype_arg(PyObject *v)
{
    if (PyLong_Check(v)) {
        long d = PyLong_AsLong(v);
        if (d >= 0 && d < CCQ_DTYPE_COUNT_)
            return (int)d;
        if (!PyErr_Occurred())
            ccqpy_raisef(CCQ_ERR_INVALID_ARGUMENT, "dtype %ld is not a ccq dtype (0..%d)", d,
                         CCQ_DTYPE_COUNT_ - 1);
        return -1;
    }
    if (PyUnicode_Check(v)) {
        const char *s = PyUnicode_AsUTF8(v);
        for (int d = 0; s && d < CCQ_DTYPE_COUNT_; d++)
            if (strcmp(s, ccq_dtype_name((ccq_dtype)d)) == 0)
                return d;
        if (s)
            ccqpy_raisef(CCQ_ERR_INVALID_ARGUMENT, "dtype '%s' is not a ccq dtype", s);
        return -1;
    }
    ccqpy_raisef(CCQ_ERR_INVALID_ARGUMENT, "dtype must be a ccq.DType, got %s",
                 Py_TYPE(v)->tp_name);
    return -1;
}
