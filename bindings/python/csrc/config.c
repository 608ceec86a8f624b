/* Runtime(**config): every field of ccq_config as a keyword, from one table. A field appended
 * to ccq_config is one line of CCQPY_CONFIG below (tests/test_config.py fails until it is). */
#include "ccqpy.h"

#include <stddef.h>
#include <string.h>

/* Every ccq_config field a caller sets (struct_size and env_error are ccq's own), with its
 * type: U32, U64, I64, STR (str, bytes or os.PathLike; None = NULL) or STORE. */
#define CCQPY_CONFIG(X)                                                                            \
    X(backend, STR)                                                                                \
    X(host_devices, U32)                                                                           \
    X(max_streams, U32)                                                                            \
    X(queue_depth, U32)                                                                            \
    X(max_batch_ops, U32)                                                                          \
    X(timeout_ms, U64)                                                                             \
    X(host_workers, U32)                                                                           \
    X(flags, U32)                                                                                  \
    X(spin_us, U32)                                                                                \
    X(fault, STR)                                                                                  \
    X(trace_capacity, U32)                                                                         \
    X(trace_file, STR)                                                                             \
    X(host_stream_bytes, U64)                                                                      \
    X(world_rank, U32)                                                                             \
    X(world_size, U32)                                                                             \
    X(bootstrap, STR)                                                                              \
    X(store, STORE)                                                                                \
    X(mpi_comm, I64)                                                                               \
    X(trace_signal, U32)                                                                           \
    X(check_signatures, U32)                                                                       \
    X(heartbeat_ms, U32)                                                                           \
    X(heartbeat_timeout_ms, U32)                                                                   \
    X(nccl_high_priority, U32)                                                                     \
    X(fusion_bytes, U64)                                                                           \
    X(host_engine, STR)

enum field_type { T_U32, T_U64, T_I64, T_STR, T_STORE };

/* The C type each table type stands for, checked field by field at compile time. */
#define CCQPY_SIZE_U32   4
#define CCQPY_SIZE_U64   8
#define CCQPY_SIZE_I64   8
#define CCQPY_SIZE_STR   sizeof(const char *)
#define CCQPY_SIZE_STORE sizeof(const ccq_store *)
#define CCQPY_CHECK_(name, type)                                                                   \
    _Static_assert(sizeof(((ccq_config *)0)->name) == CCQPY_SIZE_##type, "ccq_config." #name);
CCQPY_CONFIG(CCQPY_CHECK_)
#undef CCQPY_CHECK_

static const struct field {
    const char *name;
    enum field_type type;
    size_t offset;
} fields[] = {
#define CCQPY_ROW_(name, type) {#name, T_##type, offsetof(ccq_config, name)},
    CCQPY_CONFIG(CCQPY_ROW_)
#undef CCQPY_ROW_
};
enum { NFIELDS = sizeof fields / sizeof fields[0] };

static const struct field *find(const char *name)
{
    for (int i = 0; i < NFIELDS; i++)
        if (strcmp(fields[i].name, name) == 0)
            return &fields[i];
    return NULL;
}

static int set_field(const struct field *f, PyObject *v, ccq_config *cfg, PyObject *keep,
                     ccqpy_store **store)
{
    char *p = (char *)cfg + f->offset;
    if (f->type == T_STR) {
        const char *s = NULL;
        if (v != Py_None) {
            PyObject *bytes;
            if (!PyUnicode_FSConverter(v, &bytes))
                return -1;
            /* ccq may keep the pointer (it copies what it keeps, but owning the bytes for the
             * runtime's life costs nothing and holds whatever it does). */
            int r = PyList_Append(keep, bytes);
            Py_DECREF(bytes);
            if (r != 0)
                return -1;
            s = PyBytes_AS_STRING(bytes);
        }
        memcpy(p, &s, sizeof s);
        return 0;
    }
    if (f->type == T_STORE) {
        const ccq_store *c = NULL;
        if (v != Py_None) {
            *store = ccqpy_store_new(v);
            if (*store == NULL)
                return -1;
            c = ccqpy_store_c(*store);
        }
        memcpy(p, &c, sizeof c);
        return 0;
    }
    if (!PyLong_Check(v)) {
        ccqpy_raisef(CCQ_ERR_INVALID_ARGUMENT, "%s: an integer is required, got %s", f->name,
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    int overflow;
    long long s = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (f->type == T_I64) {
        if (overflow || (s == -1 && PyErr_Occurred()))
            goto range;
        int64_t x = s;
        memcpy(p, &x, sizeof x);
        return 0;
    }
    unsigned long long u = PyLong_AsUnsignedLongLong(v);
    if ((u == (unsigned long long)-1 && PyErr_Occurred()) || (f->type == T_U32 && u > UINT32_MAX))
        goto range;
    (void)s;
    if (f->type == T_U32) {
        uint32_t x = (uint32_t)u;
        memcpy(p, &x, sizeof x);
    } else {
        uint64_t x = u;
        memcpy(p, &x, sizeof x);
    }
    return 0;
range:
    PyErr_Clear();
    ccqpy_raisef(CCQ_ERR_INVALID_ARGUMENT, "%s: out of range for a%s", f->name,
                 f->type == T_U32   ? "n unsigned 32-bit field"
                 : f->type == T_U64 ? "n unsigned 64-bit field"
                                    : " signed 64-bit field");
    return -1;
}

int ccqpy_config_from_kwargs(PyObject *kwargs, ccq_config *cfg, PyObject *keep, ccqpy_store **store)
{
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    ccq_config_init(cfg); /* the defaults, then the CCQ_* variables, as in C */
    *store = NULL;
    while (kwargs && PyDict_Next(kwargs, &pos, &key, &value)) {
        const char *name = PyUnicode_AsUTF8(key);
        if (name == NULL)
            return -1;
        const struct field *f = find(name);
        if (f == NULL) {
            PyErr_Format(PyExc_TypeError,
                         "Runtime() got an unexpected keyword '%s' (not a ccq_config field; "
                         "ccq.config_fields() lists them)",
                         name);
            return -1;
        }
        if (set_field(f, value, cfg, keep, store) != 0)
            return -1;
    }
    return 0;
}

PyObject *ccqpy_config_fields(PyObject *mod, PyObject *unused)
{
    (void)mod, (void)unused;
    PyObject *t = PyTuple_New(NFIELDS);
    for (int i = 0; t && i < NFIELDS; i++) {
        PyObject *s = PyUnicode_FromString(fields[i].name);
        if (s == NULL)
            Py_CLEAR(t);
        else
            PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

PyObject *ccqpy_config_defaults(PyObject *mod, PyObject *unused)
{
    ccq_config cfg;
    (void)mod, (void)unused;
    ccq_config_init(&cfg);
    PyObject *d = PyDict_New();
    for (int i = 0; d && i < NFIELDS; i++) {
        const char *p = (const char *)&cfg + fields[i].offset;
        PyObject *v = NULL;
        switch (fields[i].type) {
        case T_U32: {
            uint32_t x;
            memcpy(&x, p, sizeof x);
            v = PyLong_FromUnsignedLong(x);
            break;
        }
        case T_U64: {
            uint64_t x;
            memcpy(&x, p, sizeof x);
            v = PyLong_FromUnsignedLongLong(x);
            break;
        }
        case T_I64: {
            int64_t x;
            memcpy(&x, p, sizeof x);
            v = PyLong_FromLongLong(x);
            break;
        }
        case T_STR: {
            const char *s;
            memcpy(&s, p, sizeof s);
            v = s ? PyUnicode_DecodeFSDefault(s) : Py_NewRef(Py_None);
            break;
        }
        case T_STORE:
            v = Py_NewRef(Py_None);
            break;
        }
        if (v == NULL || PyDict_SetItemString(d, fields[i].name, v) != 0)
            Py_CLEAR(d);
        Py_XDECREF(v);
    }
    if (d && cfg.env_error) {
        /* What ccq_runtime_create would refuse: say it where the defaults are read. */
        PyObject *e =
            PyUnicode_DecodeUTF8(cfg.env_error, (Py_ssize_t)strlen(cfg.env_error), "replace");
        if (e == NULL || PyDict_SetItemString(d, "env_error", e) != 0)
            Py_CLEAR(d);
        Py_XDECREF(e);
    }
    return d;
}
