/* rt.stats(), rt.metrics() and rt.trace_events() as named tuples (PyStructSequence): the
 * fields of ccq_stats, ccq_metrics and ccq_event, each listed once below. */
#include "ccqpy.h"

#include <stddef.h>

enum rtype { R_U32, R_U64, R_I32, R_U8, R_F64, R_HIST8 };

typedef struct rfield {
    const char *name;
    enum rtype type;
    size_t offset;
    const char *doc;
} rfield;

#define U64(s, f, d)                                                                               \
    {                                                                                              \
#f, R_U64, offsetof(s, f), d                                                               \
    }
#define U32(s, f, d)                                                                               \
    {                                                                                              \
#f, R_U32, offsetof(s, f), d                                                               \
    }
#define I32(s, f, d)                                                                               \
    {                                                                                              \
#f, R_I32, offsetof(s, f), d                                                               \
    }
#define U8(s, f, d)                                                                                \
    {                                                                                              \
#f, R_U8, offsetof(s, f), d                                                                \
    }
#define F64(s, f, d)                                                                               \
    {                                                                                              \
#f, R_F64, offsetof(s, f), d                                                               \
    }
#define HIST(s, f, d)                                                                              \
    {                                                                                              \
#f, R_HIST8, offsetof(s, f), d                                                             \
    }

static const rfield stats_fields[] = {
    U64(ccq_stats, submitted, "commands accepted by submitting calls"),
    U64(ccq_stats, completed, "commands that completed successfully"),
    U64(ccq_stats, failed, "commands that ended with an error"),
    U64(ccq_stats, cancelled, "commands cancelled by shutdown"),
    U64(ccq_stats, pending, "submitted - completed - failed - cancelled"),
    U64(ccq_stats, batches, "backend groups issued"),
    U64(ccq_stats, batched_ops, "operations issued"),
    U64(ccq_stats, max_batch_ops, "largest group"),
    HIST(ccq_stats, batch_size_hist, "groups of 1, 2-3, 4-7, ..., 128+ operations"),
};

static const rfield metrics_fields[] = {
    U64(ccq_metrics, uptime_ns, "since the runtime was created"),
    U64(ccq_metrics, commands_ended, "completed + failed + cancelled"),
    F64(ccq_metrics, commands_per_s, "over the last full second"),
    F64(ccq_metrics, commands_per_s_total, "over the runtime's life"),
    F64(ccq_metrics, queue_p50_us, "time in queue (submitted -> issued), p50"),
    F64(ccq_metrics, queue_p99_us, "time in queue, p99"),
    F64(ccq_metrics, run_p50_us, "time in flight (issued -> completed), p50"),
    F64(ccq_metrics, run_p99_us, "time in flight, p99"),
    HIST(ccq_metrics, batch_size_hist, "batches of 1, 2-3, 4-7, ..., 128+ operations"),
    U64(ccq_metrics, queued_now, "commands queued or in flight on all streams"),
    U32(ccq_metrics, deepest_device, "the stream with the most of them: its device"),
    U32(ccq_metrics, deepest_stream, "... its stream"),
    U64(ccq_metrics, deepest_depth, "... and how many"),
    U64(ccq_metrics, trace_events, "events recorded since start"),
    U64(ccq_metrics, trace_dropped, "events overwritten before anyone read them"),
};

static const rfield event_fields[] = {
    U32(ccq_event, type, "ccq.EventType"),
    U64(ccq_event, time_ns, "CLOCK_MONOTONIC"),
    U64(ccq_event, id, "command id, or batch id for batch events"),
    U64(ccq_event, batch, "batch that issued the command"),
    U64(ccq_event, seq, "sequence number in its communicator"),
    U64(ccq_event, count, "elements (operations for batch events)"),
    U64(ccq_event, bytes, "bytes"),
    U32(ccq_event, thread, "Linux tid of the submitting or fencing thread"),
    U32(ccq_event, device, "device"),
    U32(ccq_event, stream, "stream"),
    U32(ccq_event, comm, "communicator id"),
    U8(ccq_event, kind, "ccq.Kind"),
    U8(ccq_event, dtype, "ccq.DType"),
    U8(ccq_event, op, "ccq.ReduceOp"),
    U8(ccq_event, peer_valid, "1 when peer applies"),
    I32(ccq_event, status, "ccq.Status where it applies"),
    U32(ccq_event, peer, "send/recv: the other device; rooted: the root"),
};

static const rfield progress_fields[] = {
    U32(ccq_progress, process, "world rank"),
    U32(ccq_progress, state, "ccq.ProcessState"),
    U32(ccq_progress, comm, "communicator id (this process's, as in events)"),
    U64(ccq_progress, submitted, "operations it submitted on it (its next sequence number)"),
    U64(ccq_progress, completed, "operations it completed"),
    U32(ccq_progress, pending_kind, "ccq.Kind of its oldest pending operation, or 2**32 - 1"),
    U64(ccq_progress, pending_seq, "that operation's sequence number"),
    U64(ccq_progress, pending_age_ns, "how long it had been pending"),
    U64(ccq_progress, heartbeat_age_ns, "age of the heartbeat this comes from (0: this process)"),
};

#define NF(a) (sizeof(a) / sizeof((a)[0]))

static PyTypeObject *stats_type, *metrics_type, *event_type, *progress_type;

/* The named-tuple type of a table. Its field list must outlive the type, which lives as long
 * as the process: @p sf is static storage of n + 1 entries. */
static PyTypeObject *make_type(const char *name, const char *doc, const rfield *f, size_t n,
                               PyStructSequence_Field *sf)
{
    for (size_t i = 0; i < n; i++) {
        sf[i].name = f[i].name;
        sf[i].doc = f[i].doc;
    }
    sf[n].name = NULL;
    PyStructSequence_Desc desc = {(char *)name, (char *)doc, sf, (int)n};
    return PyStructSequence_NewType(&desc);
}

static PyObject *value(const void *base, const rfield *f)
{
    const char *p = (const char *)base + f->offset;
    switch (f->type) {
    case R_U64:
        return PyLong_FromUnsignedLongLong(*(const uint64_t *)p);
    case R_U32:
        return PyLong_FromUnsignedLong(*(const uint32_t *)p);
    case R_I32:
        return PyLong_FromLong(*(const int32_t *)p);
    case R_U8:
        return PyLong_FromLong(*(const uint8_t *)p);
    case R_F64:
        return PyFloat_FromDouble(*(const double *)p);
    case R_HIST8: {
        const uint64_t *h = (const uint64_t *)p;
        return Py_BuildValue("(KKKKKKKK)", h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]);
    }
    }
    return NULL;
}

static PyObject *record(PyTypeObject *t, const void *base, const rfield *f, size_t n)
{
    PyObject *r = PyStructSequence_New(t);
    for (size_t i = 0; r && i < n; i++) {
        PyObject *v = value(base, &f[i]);
        if (v == NULL)
            Py_CLEAR(r);
        else
            PyStructSequence_SET_ITEM(r, (Py_ssize_t)i, v);
    }
    return r;
}

PyObject *ccqpy_stats_record(const ccq_stats *s)
{
    return record(stats_type, s, stats_fields, NF(stats_fields));
}

PyObject *ccqpy_metrics_record(const ccq_metrics *m)
{
    return record(metrics_type, m, metrics_fields, NF(metrics_fields));
}

PyObject *ccqpy_event_record(const ccq_event *e)
{
    return record(event_type, e, event_fields, NF(event_fields));
}

PyObject *ccqpy_progress_record(const ccq_progress *p)
{
    return record(progress_type, p, progress_fields, NF(progress_fields));
}

int ccqpy_records_init(PyObject *mod)
{
    static PyStructSequence_Field stats_sf[NF(stats_fields) + 1],
        metrics_sf[NF(metrics_fields) + 1], event_sf[NF(event_fields) + 1],
        progress_sf[NF(progress_fields) + 1];
    stats_type = make_type("ccq.Stats", "ccq_stats: counters of a runtime", stats_fields,
                           NF(stats_fields), stats_sf);
    metrics_type = make_type("ccq.Metrics", "ccq_metrics: live metrics of a runtime",
                             metrics_fields, NF(metrics_fields), metrics_sf);
    event_type = make_type("ccq.Event", "ccq_event: one event of the flight recorder", event_fields,
                           NF(event_fields), event_sf);
    progress_type = make_type("ccq.Progress",
                              "ccq_progress: a process's progress on a communicator spanning "
                              "processes, from its heartbeat",
                              progress_fields, NF(progress_fields), progress_sf);
    if (!stats_type || !metrics_type || !event_type || !progress_type)
        return -1;
    if (PyModule_AddObjectRef(mod, "Stats", (PyObject *)stats_type) < 0 ||
        PyModule_AddObjectRef(mod, "Metrics", (PyObject *)metrics_type) < 0 ||
        PyModule_AddObjectRef(mod, "Event", (PyObject *)event_type) < 0 ||
        PyModule_AddObjectRef(mod, "Progress", (PyObject *)progress_type) < 0)
        return -1;
    return 0;
}
