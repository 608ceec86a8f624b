/* The private header of ccq's Python extension (ccq._ccq): the types its files share. */
#ifndef CCQPY_H
#define CCQPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include <ccq.h>

/* Run a statement with the GIL released: every call into ccq that can wait or take time (a
 * statement form of Py_BEGIN/END_ALLOW_THREADS, which clang-format cannot lay out). */
#define CCQPY_NOGIL(stmt)                                                                          \
    do {                                                                                           \
        PyThreadState *ccqpy_ts_ = PyEval_SaveThread();                                            \
        stmt;                                                                                      \
        PyEval_RestoreThread(ccqpy_ts_);                                                           \
    } while (0)

/* ---- errors (module.c) ------------------------------------------------------------------ */

/* Raise the ccq.Error subclass of @p st with @p detail (ccq_last_error_detail() when NULL).
 * Returns NULL, for `return ccqpy_raise(...)`. */
PyObject *ccqpy_raise(ccq_status st, const char *detail);
/* As ccqpy_raise with a printf-style detail made by the binding itself. */
PyObject *ccqpy_raisef(ccq_status st, const char *fmt, ...);

/* ---- buffers (buffers.c) ----------------------------------------------------------------- */

/* Where a user buffer came from, and what keeps it alive while ccq borrows it. */
typedef enum ccqpy_buf_kind {
    CCQPY_BUF_NONE = 0,  /* no buffer (NULL passed to ccq) */
    CCQPY_BUF_VIEW,      /* the buffer protocol: view holds the exporter (view.obj) */
    CCQPY_BUF_DLPACK,    /* a legacy DLManagedTensor taken from a "dltensor" capsule */
    CCQPY_BUF_DLPACK_V1, /* a DLManagedTensorVersioned ("dltensor_versioned") */
    CCQPY_BUF_OBJECT,    /* __cuda_array_interface__ / a ccq.Memory: a reference to the object */
} ccqpy_buf_kind;

/* One user buffer as ccq sees it. Movable with memcpy (the holds keep them in arrays). */
typedef struct ccqpy_buf {
    ccqpy_buf_kind kind;
    void *ptr;        /* first byte */
    size_t nbytes;    /* contiguous bytes */
    int dtype;        /* ccq_dtype it holds, or -1 when it has none (uint16: a raw view) */
    int raw_bits;     /* for unsigned integer buffers: the width in bits (8, 16, ...), else 0 */
    const char *what; /* what the data was described as, for messages ("float32", "int16") */
    union {
        Py_buffer view;
        void *managed; /* the DLPack managed tensor (either version) */
        PyObject *obj;
    } u;
} ccqpy_buf;

/* Memory a backend can hold: the host backend takes host memory, NCCL device memory. */
typedef enum ccqpy_mem { CCQPY_MEM_HOST, CCQPY_MEM_CUDA } ccqpy_mem;

/* Fill @p b from @p obj: the buffer protocol, else __dlpack__, else (CUDA memory only)
 * __cuda_array_interface__. @p writable: ccq writes it. @p name: "src"/"dst"/"buf" for
 * messages. Returns 0, or -1 with a ccq.Error (InvalidArgumentError) set and @p b empty. */
int ccqpy_buf_get(PyObject *obj, ccqpy_mem mem, int writable, const char *name, ccqpy_buf *b);
/* Let go of what keeps the buffer alive (the GIL must be held). Idempotent. */
void ccqpy_buf_release(ccqpy_buf *b);
/* The ccq dtype named by a Python value (ccq.DType, int, or name as ccq_dtype_name gives);
 * -1 with an error set. */
int ccqpy_dtype_arg(PyObject *v);

/* ---- holds (holds.c): buffers kept until a fence covering their command answers ---------- */

typedef struct ccqpy_hold {
    uint64_t seq; /* position in its stream's list, from 1 */
    int n;        /* buffers held */
    ccqpy_buf buf[2];
} ccqpy_hold;

/* One stream's held buffers, oldest first, in a ring. Touched only with the GIL held, which
 * orders every append and release of all threads. */
typedef struct ccqpy_holds {
    ccqpy_hold *ring;
    size_t cap, head, len;
    uint64_t appended; /* holds ever appended: the seq of the newest */
} ccqpy_holds;

/* Make room for one more hold, so the push after a C call that queued the command cannot
 * fail. -1 on no memory (nothing changed). */
int ccqpy_holds_reserve(ccqpy_holds *h);
/* Take ownership of the n buffers of a command the C call accepted. -1 on no memory (the
 * buffers are then still the caller's). */
int ccqpy_holds_push(ccqpy_holds *h, ccqpy_buf *bufs, int n);
/* Release every hold with seq <= upto (a fence taken when h->appended was upto answered). */
void ccqpy_holds_release(ccqpy_holds *h, uint64_t upto);
/* Release everything and free the ring. */
void ccqpy_holds_clear(ccqpy_holds *h);

/* ---- the runtime (runtime.c) ------------------------------------------------------------ */

typedef struct ccqpy_store ccqpy_store;

typedef struct ccqpy_runtime {
    PyObject_HEAD ccq_runtime *rt; /* NULL before __init__ succeeded and after close() */
    int closing;                   /* close() has begun: submitting calls are refused */
    Py_ssize_t active;             /* threads inside a C call on rt (changed with the GIL held) */
    ccq_device_id first;           /* this process's devices: [first, first + nlocal) */
    uint32_t nlocal;
    uint32_t ndev; /* devices of the world */
    uint32_t max_streams;
    ccqpy_holds *holds; /* nlocal * max_streams lists */
    ccq_device_id *all; /* 0 .. ndev - 1: devices=None */
    int cuda;           /* the backend takes CUDA memory (nccl) */
    PyObject *keep;     /* what the C config points into, kept for the runtime's life */
    ccqpy_store *store; /* the bridge to a Python store, or NULL */
    PyObject *weakrefs;
} ccqpy_runtime;

extern PyTypeObject ccqpy_runtime_type;
/* PyType_Ready of Runtime, with the methods of runtime.c, submit.c and fence.c. */
int ccqpy_runtime_type_init(void);
extern PyTypeObject ccqpy_fence_type;

/* Enter a C call on the runtime: refuses (ShutdownError, -1) when it is closed, or closing
 * and @p submitting. Leave with ccqpy_leave. */
int ccqpy_enter(ccqpy_runtime *self, int submitting);
static inline void ccqpy_leave(ccqpy_runtime *self)
{
    self->active--;
}
/* The hold list of (device, stream), or NULL with an InvalidArgumentError set. */
ccqpy_holds *ccqpy_holds_of(ccqpy_runtime *self, ccq_device_id device, ccq_stream_id stream);

/* ---- config (config.c) -------------------------------------------------------------------- */

/* Fill @p cfg from ccq_config_init (defaults, then CCQ_* variables) and the keywords; keeps
 * what the strings point into in @p keep (a list). Returns 0, or -1 with an error set. */
int ccqpy_config_from_kwargs(PyObject *kwargs, ccq_config *cfg, PyObject *keep,
                             ccqpy_store **store);
/* The names of the keywords, and the defaults: {name: value} after ccq_config_init. */
PyObject *ccqpy_config_defaults(PyObject *mod, PyObject *unused);
PyObject *ccqpy_config_fields(PyObject *mod, PyObject *unused);

/* ---- store (store.c) ---------------------------------------------------------------------- */

/* A ccq_store over a Python object with set(key, value) and get(key) -> bytes | None. */
ccqpy_store *ccqpy_store_new(PyObject *obj);
const ccq_store *ccqpy_store_c(ccqpy_store *s);
/* After ccq_runtime_destroy returned (nothing calls it any more). GIL held. */
void ccqpy_store_free(ccqpy_store *s);

/* ---- records (records.c): stats, metrics, events as named tuples -------------------------- */

int ccqpy_records_init(PyObject *mod);
PyObject *ccqpy_stats_record(const ccq_stats *s);
PyObject *ccqpy_metrics_record(const ccq_metrics *m);
PyObject *ccqpy_event_record(const ccq_event *e);
PyObject *ccqpy_progress_record(const ccq_progress *p);

/* ---- the methods of other files ----------------------------------------------------------- */

/* submit.c: the collectives and send/recv of Runtime */
extern PyMethodDef ccqpy_submit_methods[];
/* submit.c: intern its keyword names */
int ccqpy_submit_init(void);
/* fence.c: sync, fence, and the Fence type (ccqpy_fence_init readies it) */
int ccqpy_fence_init(void);
PyObject *ccqpy_sync(ccqpy_runtime *self, PyObject *const *args, Py_ssize_t nargs,
                     PyObject *kwnames);
PyObject *ccqpy_fence(ccqpy_runtime *self, PyObject *const *args, Py_ssize_t nargs,
                      PyObject *kwnames);

/* baseline.c: Runtime._c_loop, the C side of the overhead benchmark */
PyObject *ccqpy_c_loop(ccqpy_runtime *self, PyObject *args);

/* ---- argument parsing (submit.c): METH_FASTCALL | METH_KEYWORDS without the private API ---- */

/* Match @p kwnames against @p names (interned, NULL-terminated): out[i] = the value or NULL.
 * Returns 0, or -1 with a TypeError naming an unknown or repeated keyword. */
int ccqpy_kwargs(const char *fn, PyObject *const *kwvalues, PyObject *kwnames,
                 PyObject *const *names, PyObject **out);
/* An unsigned 32-bit argument; -1 with an error set. */
int ccqpy_u32(PyObject *v, const char *what, uint32_t *out);

#endif /* CCQPY_H */
